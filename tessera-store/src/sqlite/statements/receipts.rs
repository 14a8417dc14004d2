//! Receipts: each kept in the row of the attempt it ended (its number,
//! token and holder are the receipt's attempt, token and principal),
//! found again by its idempotency key, by attempt or by task.

use rusqlite::{Row, params};

use crate::backend::rows::ReceiptRow;
use crate::sqlite::readers::Reader;

/// A receipt row's columns, followed by `$tail`.
macro_rules! select_receipts {
    ($tail:literal) => {
        concat!(
            "SELECT number AS attempt, token, holder AS principal, idempotency_key, ",
            "digest, accepted_at, output FROM attempts ",
            $tail
        )
    };
}

pub(crate) const RECEIPT_BY_KEY: &str =
    select_receipts!("WHERE task = ?2 AND holder = ?1 AND idempotency_key = ?3");

pub(crate) const RECEIPTS_OF_ATTEMPT: &str =
    select_receipts!("WHERE task = ?1 AND number = ?2 AND idempotency_key IS NOT NULL");

pub(crate) const RECEIPTS_OF_TASK: &str =
    select_receipts!("WHERE task = ?1 AND idempotency_key IS NOT NULL ORDER BY number LIMIT ?2");

impl ReceiptRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            attempt: row.get("attempt")?,
            token: row.get("token")?,
            principal: row.get("principal")?,
            idempotency_key: row.get("idempotency_key")?,
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

/// The receipt of one attempt, if a submission ended it.
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
