//! The server secret marker and the durable per-address mint quota.

use rusqlite::params;

use super::readers::Reader;
use super::writer::Writer;

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
