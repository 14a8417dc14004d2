//! The `receipts` table: one row per accepted submission, found again by
//! its idempotency key, by attempt or by task.

use rusqlite::{Row, params};

use crate::backend::rows::ReceiptRow;
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const INSERT_RECEIPT: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// A new receipt's columns.
#[derive(Debug, Clone)]
pub(crate) struct NewReceipt<'a> {
    pub(crate) task: i64,
    pub(crate) attempt: i64,
    pub(crate) token: i64,
    pub(crate) principal: &'a str,
    pub(crate) idempotency_key: &'a str,
    pub(crate) artifact: &'a str,
    pub(crate) digest: &'a str,
    pub(crate) accepted_at: i64,
    pub(crate) output: Option<&'a [u8]>,
}

/// Inserts a receipt.
pub(crate) fn insert_receipt(
    writer: &Writer<'_>,
    receipt: &NewReceipt<'_>,
) -> rusqlite::Result<()> {
    writer.execute(
        INSERT_RECEIPT,
        params![
            receipt.task,
            receipt.attempt,
            receipt.token,
            receipt.principal,
            receipt.idempotency_key,
            receipt.artifact,
            receipt.digest,
            receipt.accepted_at,
            receipt.output,
        ],
    )?;
    Ok(())
}

/// A receipt row's columns, followed by `$tail`.
macro_rules! select_receipts {
    ($tail:literal) => {
        concat!(
            "SELECT attempt, token, principal, idempotency_key, artifact, digest, ",
            "accepted_at, output FROM receipts ",
            $tail
        )
    };
}

pub(crate) const RECEIPT_BY_KEY: &str =
    select_receipts!("WHERE principal = ?1 AND task = ?2 AND idempotency_key = ?3");

pub(crate) const RECEIPTS_OF_ATTEMPT: &str =
    select_receipts!("WHERE task = ?1 AND attempt = ?2 ORDER BY id");

pub(crate) const RECEIPTS_OF_TASK: &str =
    select_receipts!("WHERE task = ?1 ORDER BY attempt, id LIMIT ?2");

impl ReceiptRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            attempt: row.get("attempt")?,
            token: row.get("token")?,
            principal: row.get("principal")?,
            idempotency_key: row.get("idempotency_key")?,
            artifact: row.get("artifact")?,
            digest: row.get("digest")?,
            accepted_at: row.get("accepted_at")?,
            output: row.get("output")?,
        })
    }
}

/// The receipt stored under (principal, task, idempotency key).
pub(crate) fn receipt_by_key(
    reader: &Reader<'_>,
    principal: &str,
    task: i64,
    key: &str,
) -> rusqlite::Result<Option<ReceiptRow>> {
    reader.optional(
        RECEIPT_BY_KEY,
        params![principal, task, key],
        ReceiptRow::from_row,
    )
}

/// The receipts of one attempt (one per accepted submission).
pub(crate) fn receipts_of_attempt(
    reader: &Reader<'_>,
    task: i64,
    attempt: i64,
) -> rusqlite::Result<Vec<ReceiptRow>> {
    reader.all(
        RECEIPTS_OF_ATTEMPT,
        params![task, attempt],
        ReceiptRow::from_row,
    )
}

/// A task's receipts in attempt order, at most `limit`.
pub(crate) fn receipts_of_task(
    reader: &Reader<'_>,
    task: i64,
    limit: i64,
) -> rusqlite::Result<Vec<ReceiptRow>> {
    reader.all(RECEIPTS_OF_TASK, params![task, limit], ReceiptRow::from_row)
}
