//! The server secret marker and the durable per-address mint quota.

use rusqlite::params;

use super::readers::Reader;
use super::writer::Writer;
use crate::backend::rows::{QueueRetentionRow, QueueSettingsRow};

pub(crate) const META_VALUE: &str = "SELECT value FROM tessera_meta WHERE key = ?1";

pub(crate) const INSERT_META: &str =
    "INSERT INTO tessera_meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING";

pub(crate) const LIMIT_COUNT: &str =
    "SELECT count FROM access_limits WHERE subject = ?1 AND window_start = ?2";

pub(crate) const BUMP_LIMIT: &str = "INSERT INTO access_limits \
     (subject, window_start, count, purge_at) VALUES (?1, ?2, 1, ?3) \
     ON CONFLICT (subject, window_start) DO UPDATE SET count = count + 1";

/// A `tessera_meta` value.
pub(crate) fn meta_value(reader: &Reader<'_>, key: &str) -> rusqlite::Result<Option<String>> {
    reader.optional(META_VALUE, [key], |row| row.get(0))
}

/// Sets a `tessera_meta` value unless one is set.
pub(crate) fn insert_meta(writer: &Writer<'_>, key: &str, value: &str) -> rusqlite::Result<()> {
    writer.execute(INSERT_META, params![key, value])?;
    Ok(())
}

/// How many times `subject` was counted in the window starting at
/// `window_start`.
pub(crate) fn limit_count(
    reader: &Reader<'_>,
    subject: &str,
    window_start: i64,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(LIMIT_COUNT, params![subject, window_start], |row| {
            row.get(0)
        })?
        .unwrap_or(0))
}

/// Counts `subject` once more in its window; the row is purged at
/// `purge_at`.
pub(crate) fn bump_limit(
    writer: &Writer<'_>,
    subject: &str,
    window_start: i64,
    purge_at: i64,
) -> rusqlite::Result<()> {
    writer.execute(BUMP_LIMIT, params![subject, window_start, purge_at])?;
    Ok(())
}

pub(crate) const QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, partition_limit \
     FROM queue_settings WHERE namespace = ?1 AND queue = ?2";

pub(crate) const NAMESPACE_QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = ?1 ORDER BY queue";

pub(crate) const PUT_QUEUE_SETTINGS: &str = "INSERT INTO queue_settings \
     (namespace, queue, paused_at, queue_limit, partition_limit, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     paused_at = excluded.paused_at, queue_limit = excluded.queue_limit, \
     partition_limit = excluded.partition_limit, updated_at = excluded.updated_at";

pub(crate) const DELETE_QUEUE_SETTINGS: &str =
    "DELETE FROM queue_settings WHERE namespace = ?1 AND queue = ?2";

/// The leased attempts of a queue, from `attempts_lapse_order` alone.
pub(crate) const LEASED_IN_QUEUE: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND state = 'leased'";

fn settings_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<QueueSettingsRow> {
    Ok(QueueSettingsRow {
        queue: row.get(0)?,
        paused_at: row.get(1)?,
        queue_limit: row.get(2)?,
        partition_limit: row.get(3)?,
    })
}

/// A queue's settings row.
pub(crate) fn queue_settings(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<Option<QueueSettingsRow>> {
    reader.optional(QUEUE_SETTINGS, params![namespace, queue], settings_row)
}

/// A namespace's settings rows, by queue.
pub(crate) fn namespace_queue_settings(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<QueueSettingsRow>> {
    reader.all(NAMESPACE_QUEUE_SETTINGS, params![namespace], settings_row)
}

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

/// How many of a queue's attempts are leased.
pub(crate) fn leased_in_queue(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(LEASED_IN_QUEUE, params![namespace, queue], |row| row.get(0))?
        .unwrap_or(0))
}

/// The leased attempts of one partition of a queue: the queue's leased
/// attempts from `attempts_lapse_order`, each task's key by its row id.
pub(crate) const LEASED_IN_PARTITION: &str = "SELECT count(*) FROM attempts a \
     JOIN tasks t ON t.id = a.task WHERE a.namespace = ?1 AND a.queue = ?2 \
     AND a.state = 'leased' AND t.partition_key = ?3";

/// A priority's due entries of `tasks_claim_order`, in its order.
pub(crate) const CANDIDATE_TASKS: &str = "SELECT id, claimable_at FROM tasks \
     WHERE namespace = ?1 AND queue = ?2 AND priority = ?3 AND claimable_at IS NOT NULL \
     AND claimable_at <= ?4 ORDER BY claimable_at, id LIMIT ?5";

/// A priority's due lapsed leases from `attempts_lapse_order`, in its order.
pub(crate) const CANDIDATE_LAPSED: &str = "SELECT task, lapses_at FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND priority = ?3 AND state = 'leased' \
     AND lapses_at <= ?4 ORDER BY lapses_at, task LIMIT ?5";

/// How many of a partition's attempts are leased.
pub(crate) fn leased_in_partition(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    key: &str,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(LEASED_IN_PARTITION, params![namespace, queue, key], |row| {
            row.get(0)
        })?
        .unwrap_or(0))
}

/// A priority's due entries of both claim indexes, at most `limit` each.
#[allow(clippy::type_complexity)]
pub(crate) fn candidates(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    priority: u8,
    now: i64,
    limit: i64,
) -> rusqlite::Result<(Vec<(i64, Option<i64>)>, Vec<(i64, i64)>)> {
    let args = params![namespace, queue, priority, now, limit];
    let indexed = reader.all(CANDIDATE_TASKS, args, |row| Ok((row.get(0)?, row.get(1)?)))?;
    let lapsed = reader.all(CANDIDATE_LAPSED, args, |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok((indexed, lapsed))
}

pub(crate) const QUEUE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, cancelled_ms \
     FROM queue_retention WHERE namespace = ?1 AND queue = ?2";

pub(crate) const NAMESPACE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, \
     cancelled_ms FROM queue_retention WHERE namespace = ?1 ORDER BY queue";

pub(crate) const PUT_QUEUE_RETENTION: &str = "INSERT INTO queue_retention \
     (namespace, queue, done_ms, discarded_ms, cancelled_ms, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     done_ms = excluded.done_ms, discarded_ms = excluded.discarded_ms, \
     cancelled_ms = excluded.cancelled_ms, updated_at = excluded.updated_at";

pub(crate) const DELETE_QUEUE_RETENTION: &str =
    "DELETE FROM queue_retention WHERE namespace = ?1 AND queue = ?2";

fn retention_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<QueueRetentionRow> {
    Ok(QueueRetentionRow {
        queue: row.get(0)?,
        done_ms: row.get(1)?,
        discarded_ms: row.get(2)?,
        cancelled_ms: row.get(3)?,
    })
}

/// A queue's keep-times row.
pub(crate) fn queue_retention(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<Option<QueueRetentionRow>> {
    reader.optional(QUEUE_RETENTION, params![namespace, queue], retention_row)
}

/// A namespace's keep-times rows, by queue.
pub(crate) fn namespace_retention(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<QueueRetentionRow>> {
    reader.all(NAMESPACE_RETENTION, params![namespace], retention_row)
}

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
