//! The `tessera_meta` table: values set once, such as the server secret's
//! marker.

use rusqlite::params;

use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const META_VALUE: &str = "SELECT value FROM tessera_meta WHERE key = ?1";

/// A `tessera_meta` value.
pub(crate) fn meta_value(reader: &Reader<'_>, key: &str) -> rusqlite::Result<Option<String>> {
    reader.optional(META_VALUE, [key], |row| row.get(0))
}

pub(crate) const INSERT_META: &str =
    "INSERT INTO tessera_meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING";

/// Sets a `tessera_meta` value unless one is set.
pub(crate) fn insert_meta(writer: &Writer<'_>, key: &str, value: &str) -> rusqlite::Result<()> {
    writer.execute(INSERT_META, params![key, value])?;
    Ok(())
}
