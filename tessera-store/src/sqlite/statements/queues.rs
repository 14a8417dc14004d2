//! The `queue_settings` and `queue_retention` tables: a queue's pause and
//! concurrency limits, and how long its finished tasks are kept.

use rusqlite::{Row, params};

use crate::backend::rows::{QueueRetentionRow, QueueSettingsRow};
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

/// Decodes a `queue_settings` row.
fn settings_row(row: &Row<'_>) -> rusqlite::Result<QueueSettingsRow> {
    Ok(QueueSettingsRow {
        queue: row.get("queue")?,
        paused_at: row.get("paused_at")?,
        queue_limit: row.get("queue_limit")?,
        partition_limit: row.get("partition_limit")?,
    })
}

pub(crate) const QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, partition_limit \
     FROM queue_settings WHERE namespace = ?1 AND queue = ?2";

/// A queue's settings row.
pub(crate) fn queue_settings(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<Option<QueueSettingsRow>> {
    reader.optional(QUEUE_SETTINGS, params![namespace, queue], settings_row)
}

pub(crate) const NAMESPACE_QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = ?1 ORDER BY queue";

/// A namespace's settings rows, by queue.
pub(crate) fn namespace_queue_settings(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<QueueSettingsRow>> {
    reader.all(NAMESPACE_QUEUE_SETTINGS, params![namespace], settings_row)
}

pub(crate) const PUT_QUEUE_SETTINGS: &str = "INSERT INTO queue_settings \
     (namespace, queue, paused_at, queue_limit, partition_limit, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     paused_at = excluded.paused_at, queue_limit = excluded.queue_limit, \
     partition_limit = excluded.partition_limit, updated_at = excluded.updated_at";

pub(crate) const DELETE_QUEUE_SETTINGS: &str =
    "DELETE FROM queue_settings WHERE namespace = ?1 AND queue = ?2";

/// Stores a settings row, or deletes it (`None`).
pub(crate) fn put_queue_settings(
    writer: &Writer<'_>,
    namespace: &str,
    queue: &str,
    row: Option<&QueueSettingsRow>,
    now: i64,
) -> rusqlite::Result<()> {
    match row {
        Some(row) => writer.execute(
            PUT_QUEUE_SETTINGS,
            params![
                namespace,
                queue,
                row.paused_at,
                row.queue_limit,
                row.partition_limit,
                now
            ],
        )?,
        None => writer.execute(DELETE_QUEUE_SETTINGS, params![namespace, queue])?,
    };
    Ok(())
}

/// Decodes a `queue_retention` row.
fn retention_row(row: &Row<'_>) -> rusqlite::Result<QueueRetentionRow> {
    Ok(QueueRetentionRow {
        queue: row.get("queue")?,
        done_ms: row.get("done_ms")?,
        discarded_ms: row.get("discarded_ms")?,
        cancelled_ms: row.get("cancelled_ms")?,
    })
}

pub(crate) const QUEUE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, cancelled_ms \
     FROM queue_retention WHERE namespace = ?1 AND queue = ?2";

/// A queue's keep-times row.
pub(crate) fn queue_retention(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<Option<QueueRetentionRow>> {
    reader.optional(QUEUE_RETENTION, params![namespace, queue], retention_row)
}

pub(crate) const NAMESPACE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, \
     cancelled_ms FROM queue_retention WHERE namespace = ?1 ORDER BY queue";

/// A namespace's keep-times rows, by queue.
pub(crate) fn namespace_retention(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<QueueRetentionRow>> {
    reader.all(NAMESPACE_RETENTION, params![namespace], retention_row)
}

pub(crate) const PUT_QUEUE_RETENTION: &str = "INSERT INTO queue_retention \
     (namespace, queue, done_ms, discarded_ms, cancelled_ms, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     done_ms = excluded.done_ms, discarded_ms = excluded.discarded_ms, \
     cancelled_ms = excluded.cancelled_ms, updated_at = excluded.updated_at";

pub(crate) const DELETE_QUEUE_RETENTION: &str =
    "DELETE FROM queue_retention WHERE namespace = ?1 AND queue = ?2";

/// Stores a queue's keep times (the columns of
/// [`QueueRetentionRow::columns`]), or deletes them (`None`).
pub(crate) fn put_queue_retention(
    writer: &Writer<'_>,
    namespace: &str,
    queue: &str,
    columns: Option<[Option<i64>; 3]>,
    now: i64,
) -> rusqlite::Result<()> {
    match columns {
        Some([done, discarded, cancelled]) => writer.execute(
            PUT_QUEUE_RETENTION,
            params![namespace, queue, done, discarded, cancelled, now],
        )?,
        None => writer.execute(DELETE_QUEUE_RETENTION, params![namespace, queue])?,
    };
    Ok(())
}
