use super::*;

#[test]
fn every_index_names_a_declared_table_and_columns() {
    for index in INDEXES {
        let table = TABLES
            .iter()
            .find(|table| table.name == index.table)
            .unwrap_or_else(|| panic!("{} has no table", index.name));
        for column in index.columns {
            assert!(
                table.columns.iter().any(|(name, _)| name == column),
                "{}.{column} is not declared",
                index.table
            );
        }
    }
}

#[test]
fn clustered_keys_name_declared_columns() {
    for table in TABLES {
        for column in table.clustered_key.unwrap_or_default() {
            assert!(
                table.columns.iter().any(|(name, _)| name == column),
                "{}.{column} is not declared",
                table.name
            );
        }
    }
    let counters = TABLES
        .iter()
        .find(|table| table.name == "access_day_counters")
        .unwrap();
    assert!(counters.create_sql().ends_with(
        "PRIMARY KEY (day_minute, principal, namespace, action, outcome)) WITHOUT ROWID"
    ));
    assert!(
        INDEXES
            .iter()
            .all(|index| index.table != "access_day_counters"),
        "the key is the only order counters need"
    );
}

#[test]
fn names_are_unique() {
    let mut names = HashSet::new();
    for name in TABLES
        .iter()
        .map(|table| table.name)
        .chain(INDEXES.iter().map(|index| index.name))
    {
        assert!(names.insert(name), "{name} declared twice");
    }
}

#[test]
fn a_missing_column_is_added_and_nothing_else() {
    let mut inspection = Inspection {
        version: Some(SCHEMA_VERSION),
        ..Inspection::default()
    };
    for table in TABLES {
        inspection.tables.insert(
            table.name.to_owned(),
            table
                .columns
                .iter()
                .map(|(name, _)| (*name).to_owned())
                .collect(),
        );
    }
    for index in INDEXES {
        inspection.indexes.insert(index.name.to_owned());
    }
    assert!(missing_ddl(&inspection).is_empty());
    inspection
        .tables
        .get_mut("access_keys")
        .unwrap()
        .remove("label");
    assert_eq!(
        missing_ddl(&inspection),
        vec!["ALTER TABLE access_keys ADD COLUMN label TEXT NOT NULL DEFAULT ''".to_owned()]
    );
}

#[test]
fn a_retired_index_is_dropped_where_found() {
    let mut inspection = Inspection {
        version: Some(SCHEMA_VERSION),
        ..Inspection::default()
    };
    for table in TABLES {
        let columns = table.columns.iter().map(|(name, _)| (*name).to_owned());
        inspection
            .tables
            .insert(table.name.to_owned(), columns.collect());
    }
    for index in INDEXES {
        inspection.indexes.insert(index.name.to_owned());
    }
    inspection.indexes.insert("access_audit_at".to_owned());
    let ddl = missing_ddl(&inspection);
    assert_eq!(ddl, vec!["DROP INDEX IF EXISTS access_audit_at".to_owned()]);
    assert!(!is_up_to_date(&inspection, &ddl));
    inspection.indexes.remove("access_audit_at");
    assert!(missing_ddl(&inspection).is_empty());
}

#[test]
fn counters_of_a_retired_table_move_into_their_minutes_of_the_day() {
    use crate::sqlite::{SqliteBackend, SqliteOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(SqliteBackend::for_tests(SqliteOptions::file(&path)));
    // The table an earlier build kept, with three minutes: two of them
    // the same minute of the day, a day apart.
    let day = 1440;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE access_counters (minute INTEGER NOT NULL, principal TEXT NOT NULL, \
         namespace TEXT NOT NULL, action TEXT NOT NULL, outcome TEXT NOT NULL, \
         count INTEGER NOT NULL, \
         PRIMARY KEY (minute, principal, namespace, action, outcome)) WITHOUT ROWID;
         INSERT INTO access_counters VALUES
             ({old}, 'p', 'n', 'claim', 'empty', 4),
             ({new}, 'p', 'n', 'claim', 'empty', 2),
             ({other}, 'p', 'n', 'claim', 'empty', 7);",
        old = 100 * day + 5,
        new = 101 * day + 5,
        other = 101 * day + 6,
    ))
    .unwrap();
    drop(conn);
    drop(SqliteBackend::for_tests(SqliteOptions::file(&path)));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let retired: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'access_counters'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(retired, 0);
    let mut statement = conn
        .prepare("SELECT day_minute, minute, count FROM access_day_counters ORDER BY day_minute")
        .unwrap();
    let rows: Vec<(i64, i64, i64)> = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(rows, [(5, 101 * day + 5, 2), (6, 101 * day + 6, 7)]);
}

#[test]
fn a_missing_column_that_cannot_be_added_is_refused() {
    let mut inspection = Inspection::default();
    for table in TABLES {
        let columns = table.columns.iter().map(|(name, _)| (*name).to_owned());
        inspection
            .tables
            .insert(table.name.to_owned(), columns.collect());
    }
    inspection
        .tables
        .get_mut("access_keys")
        .unwrap()
        .remove("label");
    check_version(&inspection).unwrap();
    inspection
        .tables
        .get_mut("attempts")
        .unwrap()
        .remove("queue");
    let error = check_version(&inspection).unwrap_err();
    assert_eq!(error.code(), "corrupt_database");
    assert!(error.to_string().contains("attempts lacks column queue"));
}

#[test]
fn a_newer_version_is_refused() {
    let inspection = Inspection {
        version: Some(SCHEMA_VERSION + 1),
        ..Inspection::default()
    };
    assert!(matches!(
        check_version(&inspection),
        Err(Error::SchemaTooNew { .. })
    ));
}
