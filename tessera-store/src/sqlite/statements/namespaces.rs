//! The `namespaces` table: a namespace's row, the page of names, and the
//! purge of sessions' namespaces once their tasks are gone.

use rusqlite::params;

use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const INSERT_NAMESPACE: &str = "INSERT INTO namespaces \
     (name, kind, created_at, purge_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING";

/// Creates a namespace row unless it exists; returns whether it was created.
pub(crate) fn insert_namespace(
    writer: &Writer<'_>,
    name: &str,
    kind: &str,
    created_at: i64,
    purge_at: Option<i64>,
) -> rusqlite::Result<bool> {
    Ok(writer.execute(INSERT_NAMESPACE, params![name, kind, created_at, purge_at])? == 1)
}

pub(crate) const NAMESPACE_EXISTS: &str = "SELECT id FROM namespaces WHERE name = ?1";

/// Whether a namespace row exists.
pub(crate) fn namespace_exists(reader: &Reader<'_>, name: &str) -> rusqlite::Result<bool> {
    Ok(reader
        .optional(NAMESPACE_EXISTS, [name], |row| row.get::<_, i64>(0))?
        .is_some())
}

/// A page of namespace names, after `?1`, at most `?2`.
pub(crate) const NAMESPACE_NAMES: &str =
    "SELECT name FROM namespaces WHERE name > ?1 ORDER BY name LIMIT ?2";

/// A page of namespace names (see [`NAMESPACE_NAMES`]).
pub(crate) fn namespace_names(
    reader: &Reader<'_>,
    after: &str,
    limit: i64,
) -> rusqlite::Result<Vec<String>> {
    reader.all(NAMESPACE_NAMES, params![after, limit], |row| row.get(0))
}

/// Namespaces past their purge time with no task left, at most `?2`.
pub(crate) const PURGE_NAMESPACES: &str = "DELETE FROM namespaces WHERE id IN \
     (SELECT id FROM namespaces WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.namespace = namespaces.name) \
     ORDER BY purge_at LIMIT ?2)";

/// One retention batch of namespaces (see [`PURGE_NAMESPACES`]); returns
/// how many it deleted.
pub(crate) fn purge_namespaces(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(PURGE_NAMESPACES, params![threshold, limit])
}
