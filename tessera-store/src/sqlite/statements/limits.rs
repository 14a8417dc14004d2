//! The `access_limits` table: the durable per-subject count of mints in a
//! window (the per-address session quota), and its retention deletes.

use rusqlite::params;

use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const LIMIT_COUNT: &str =
    "SELECT count FROM access_limits WHERE subject = ?1 AND window_start = ?2";

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

pub(crate) const BUMP_LIMIT: &str = "INSERT INTO access_limits \
     (subject, window_start, count, purge_at) VALUES (?1, ?2, 1, ?3) \
     ON CONFLICT (subject, window_start) DO UPDATE SET count = count + 1";

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

pub(crate) const PURGE_LIMITS: &str = "DELETE FROM access_limits WHERE id IN \
     (SELECT id FROM access_limits WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

/// One retention batch of windows past their purge time; returns how many
/// it deleted.
pub(crate) fn purge_limits(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(PURGE_LIMITS, params![threshold, limit])
}
