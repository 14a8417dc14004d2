//! The schema as data, and the cold start that creates only what is missing.
//!
//! [`TABLES`] and [`INDEXES`] are the whole schema. Opening a database
//! inspects `sqlite_master`, each table's columns and the
//! `tessera_meta.schema_version` marker, then runs only the DDL that is
//! missing, in one transaction; an up-to-date database costs reads and no
//! write. Adding a table, an index or a column (nullable or with a constant
//! default, as `ALTER TABLE ADD COLUMN` requires) is a matter of adding an
//! entry: existing databases get it on their next open. [`SCHEMA_VERSION`]
//! moves only for a change an older build cannot work with; a database with a
//! newer version is refused before anything is written to it.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::meter::Meter;
use super::open::Location;
use super::quota::{QuotaRules, classify};
use super::readers::Reader;
use super::writer::{WriteConnection, Writer};
use crate::error::{Error, corrupt};

mod tables;

pub(crate) use tables::table_names;
use tables::{INDEXES, RETIRED_INDEXES, RETIRED_TABLES, TABLES};

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 6;

/// The marker table and key that hold the schema version.
const META_TABLE: &str = "tessera_meta";
const VERSION_KEY: &str = "schema_version";

/// What an existing database holds.
#[derive(Debug, Default)]
struct Inspection {
    /// Existing tables and their columns.
    tables: HashMap<String, HashSet<String>>,
    indexes: HashSet<String>,
    /// The marker's value, if the marker row exists.
    version: Option<i64>,
}

fn inspect(reader: &Reader<'_>) -> Result<Inspection, Error> {
    let mut inspection = Inspection::default();
    let objects = reader.all(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index')",
        [],
        |row| Ok((row.get::<_, String>("type")?, row.get::<_, String>("name")?)),
    )?;
    for (kind, name) in objects {
        if kind == "index" {
            inspection.indexes.insert(name);
        } else if TABLES.iter().any(|table| table.name == name)
            || RETIRED_TABLES.iter().any(|(table, _)| *table == name)
        {
            let columns = reader.all("SELECT name FROM pragma_table_info(?1)", [&name], |row| {
                row.get::<_, String>(0)
            })?;
            inspection
                .tables
                .insert(name, columns.into_iter().collect());
        }
    }
    if inspection.tables.contains_key(META_TABLE) {
        let value = reader.optional(
            "SELECT value FROM tessera_meta WHERE key = ?1",
            [VERSION_KEY],
            |row| row.get::<_, String>(0),
        )?;
        inspection.version = match value {
            None => None,
            Some(text) => Some(text.parse().map_err(|_| corrupt("schema version marker"))?),
        };
    }
    Ok(inspection)
}

/// The DDL that is missing, in order; empty when nothing is.
fn missing_ddl(inspection: &Inspection) -> Vec<String> {
    let mut ddl = Vec::new();
    for table in TABLES {
        match inspection.tables.get(table.name) {
            None => ddl.push(table.create_sql()),
            Some(existing) => {
                for (column, declaration) in table.columns {
                    if !existing.contains(*column) {
                        ddl.push(format!(
                            "ALTER TABLE {} ADD COLUMN {column} {declaration}",
                            table.name
                        ));
                    }
                }
            }
        }
    }
    for index in INDEXES {
        if !inspection.indexes.contains(index.name) {
            ddl.push(index.create_sql());
        }
    }
    for retired in RETIRED_INDEXES {
        if inspection.indexes.contains(*retired) {
            ddl.push(format!("DROP INDEX IF EXISTS {retired}"));
        }
    }
    for (retired, migration) in RETIRED_TABLES {
        if inspection.tables.contains_key(*retired) {
            ddl.push((*migration).to_owned());
        }
    }
    ddl
}

/// Refuses, before anything is written, a database this build cannot bring
/// up to date: one from a newer version, or one whose table lacks a column
/// that `ALTER TABLE ADD COLUMN` cannot add (not null and without a default,
/// or part of the key), which only an incompatible build leaves behind.
fn check_version(inspection: &Inspection) -> Result<(), Error> {
    if let Some(found) = inspection.version.filter(|found| *found > SCHEMA_VERSION) {
        return Err(Error::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for table in TABLES {
        let Some(existing) = inspection.tables.get(table.name) else {
            continue;
        };
        for (column, declaration) in table.columns {
            if !existing.contains(*column) && !can_be_added(declaration) {
                return Err(Error::CorruptDatabase {
                    reason: format!(
                        "table {} lacks column {column}, which cannot be added to its rows",
                        table.name
                    ),
                });
            }
        }
    }
    Ok(())
}

fn can_be_added(declaration: &str) -> bool {
    let declaration = declaration.to_ascii_uppercase();
    !declaration.contains("PRIMARY KEY")
        && (!declaration.contains("NOT NULL") || declaration.contains("DEFAULT"))
}

fn is_up_to_date(inspection: &Inspection, ddl: &[String]) -> bool {
    ddl.is_empty() && inspection.version == Some(SCHEMA_VERSION)
}

/// Brings the database to this build's schema, writing only what is
/// missing. The version is checked before anything that could write,
/// `journal_mode` included.
pub(crate) fn cold_start(
    writer: &mut WriteConnection,
    location: &Location,
    meter: &Meter,
    rules: &QuotaRules,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let refusing = writer.is_refusing();
    let classify = |error: Error| classify(error, rules, refusing);
    let inspection = inspect(&Reader::new(writer.connection(), meter)).map_err(classify)?;
    check_version(&inspection)?;
    if !location.is_memory() {
        let mode: String = writer
            .connection()
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .map_err(|error| classify(error.into()))?;
        if !mode.eq_ignore_ascii_case("wal") {
            writer
                .connection()
                .pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))
                .map_err(|error| classify(error.into()))?;
        }
    }
    if is_up_to_date(&inspection, &missing_ddl(&inspection)) {
        return Ok(());
    }
    writer
        .transaction(now, meter, rules, |w| {
            // Inspected again under the write lock: another process may have
            // created the schema since.
            let inspection = inspect(w)?;
            check_version(&inspection)?;
            apply(w, &inspection)
        })
        .map(|done| done.value)
}

/// Version 1 counted tries without a limit. On the move to version 2
/// each task allows at least one try more than any of its attempts has
/// had (up to `MAX_TRIES`), so no stored attempt runs out of tries, or
/// reads as corrupt, by the upgrade alone. One pass over the tasks, once.
const BACKFILL_MAX_TRIES: &str = "UPDATE tasks SET max_tries = \
     (SELECT min(max(tries) + 1, 10000) FROM attempts WHERE attempts.task = tasks.id) \
     WHERE max_tries <= (SELECT max(tries) FROM attempts WHERE attempts.task = tasks.id)";

fn apply(writer: &Writer<'_>, inspection: &Inspection) -> Result<(), Error> {
    for statement in missing_ddl(inspection) {
        writer.ddl(&statement)?;
    }
    if inspection.version.is_some_and(|found| found < 2) {
        writer.execute(BACKFILL_MAX_TRIES, [])?;
    }
    if inspection.version != Some(SCHEMA_VERSION) {
        writer.execute(
            "INSERT INTO tessera_meta (key, value) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            rusqlite::params![VERSION_KEY, SCHEMA_VERSION.to_string()],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
