//! Opening SQLite files: new, up to date, too new, corrupt or cut short,
//! and what closing leaves in the file and its write-ahead log. Each test
//! reads or writes the file itself.

use std::path::Path;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tessera_store::sqlite::SCHEMA_VERSION;
use tessera_store::{Error, Grant, Scope, Store, StoreConfig};

use crate::harness::{Fixture, TestDb, namespace, queue};

fn fingerprint(path: &Path) -> ([u8; 32], SystemTime) {
    let bytes = std::fs::read(path).unwrap();
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    (Sha256::digest(&bytes).into(), modified)
}

#[test]
fn a_new_file_gets_the_whole_schema_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let meter = store.meter();
    assert_eq!(meter.write_transactions, 1);
    assert!(meter.rows_written > 0);
    drop(store);
    // File format write and read versions 2: WAL.
    let header = std::fs::read(&path).unwrap();
    assert_eq!(&header[18..20], &[2, 2]);
}

#[test]
fn reopening_an_up_to_date_file_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(Store::open(&path, StoreConfig::default()).unwrap());
    let before = fingerprint(&path);

    // Refusing every write-capable statement from the first one: the open
    // must not need any.
    let store = Store::open(&path, StoreConfig::default().with_refuse_writes(true)).unwrap();
    let meter = store.meter();
    assert_eq!(meter.rows_written, 0);
    assert_eq!(meter.write_transactions, 0);
    assert_eq!(meter.refused_writes, 0);
    drop(store);

    let store = Store::open(&path, StoreConfig::default()).unwrap();
    assert_eq!(store.meter().rows_written, 0);
    drop(store);
    assert_eq!(fingerprint(&path), before);
}

/// A database written by other hands: plain SQLite in rollback-journal
/// mode with a schema marker of `version`.
fn write_foreign(path: &Path, version: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = DELETE;
         CREATE TABLE tessera_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         INSERT INTO tessera_meta VALUES ('schema_version', '{version}');
         CREATE TABLE future_things (id INTEGER PRIMARY KEY, payload BLOB);"
    ))
    .unwrap();
}

#[test]
fn a_newer_schema_is_refused_and_the_file_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    write_foreign(&path, &(SCHEMA_VERSION + 1).to_string());
    let before = fingerprint(&path);
    let error = Store::open(&path, StoreConfig::default()).unwrap_err();
    assert!(
        matches!(error, Error::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{error:?}"
    );
    assert_eq!(error.code(), "schema_too_new");
    assert_eq!(fingerprint(&path), before);
    // Still a rollback-journal database: journal_mode was never set.
    assert!(!dir.path().join("t.db-wal").exists());
}

#[test]
fn an_unreadable_marker_is_a_corrupt_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    write_foreign(&path, "not a number");
    let before = fingerprint(&path);
    let error = Store::open(&path, StoreConfig::default()).unwrap_err();
    assert_eq!(error.code(), "corrupt_database");
    assert_eq!(fingerprint(&path), before);
}

#[test]
fn random_bytes_are_a_corrupt_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut bytes = vec![0_u8; 8192];
    getrandom::fill(&mut bytes).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let error = Store::open(&path, StoreConfig::default()).unwrap_err();
    assert!(matches!(error, Error::CorruptDatabase { .. }), "{error:?}");
    assert_eq!(error.status(), 500);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_truncated_database_is_a_corrupt_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(Store::open(&path, StoreConfig::default()).unwrap());
    let bytes = std::fs::read(&path).unwrap();
    // Cut inside the header, and at page boundaries (a cut inside the last
    // page is only noticed when that page is read).
    let page = 4096;
    assert!(bytes.len() > 4 * page);
    for len in [
        50,
        100,
        page,
        bytes.len() / 2 / page * page,
        bytes.len() - page,
    ] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        match Store::open(&path, StoreConfig::default()) {
            Err(Error::CorruptDatabase { .. }) => {}
            other => panic!("truncated to {len}: {other:?}"),
        }
    }
}

#[test]
fn a_missing_index_and_column_are_added_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(Store::open(&path, StoreConfig::default()).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP INDEX access_audit_principal;
             ALTER TABLE access_keys DROP COLUMN label;",
        )
        .unwrap();
    }
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let meter = store.meter();
    assert_eq!(meter.write_transactions, 1);
    // Two schema objects changed; no table row was written.
    assert_eq!(meter.rows_written, 2);
    drop(store);
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    assert_eq!(store.meter().rows_written, 0);
}

#[test]
fn in_memory_stores_are_private() {
    let first = Store::open_in_memory(StoreConfig::default()).unwrap();
    let second = Store::open_in_memory(StoreConfig::default()).unwrap();
    assert_eq!(first.meter().write_transactions, 1);
    assert_eq!(second.meter().write_transactions, 1);
}

/// The size of the store's write-ahead log, 0 when there is none.
fn log_len(path: &Path) -> u64 {
    let log = path.with_extension("db-wal");
    std::fs::metadata(log).map_or(0, |meta| meta.len())
}

/// A store on `path` that wrote (a key) and read (authenticated it).
fn used_store(path: &Path) -> (Store, String) {
    let store = Store::open(path, StoreConfig::default()).unwrap();
    let key = store.create_admin_key("operators").unwrap();
    let secret = key.secret.expose().to_owned();
    store.authenticate(Some(&secret)).unwrap();
    assert!(log_len(path) > 0);
    (store, secret)
}

#[test]
fn closing_a_store_folds_its_log_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, secret) = used_store(&path);
    drop(store);
    assert_eq!(log_len(&path), 0);
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    assert!(store.authenticate(Some(&secret)).is_ok());
}

#[test]
fn closing_beside_another_connection_still_empties_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, _) = used_store(&path);
    let other = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 = other
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .unwrap();
    assert!(tables > 0);
    drop(store);
    assert!(
        path.with_extension("db-wal").exists(),
        "another connection holds it"
    );
    assert_eq!(log_len(&path), 0);
    drop(other);
}

#[test]
fn a_store_refusing_writes_leaves_its_log_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, secret) = used_store(&path);
    store.refuse_writes(true);
    let before = (fingerprint(&path), log_len(&path));
    drop(store);
    assert_eq!((fingerprint(&path), log_len(&path)), before);
    // Nothing is lost: the next open reads the log.
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    assert!(store.authenticate(Some(&secret)).is_ok());
}

/// A used database cut short, not one fresh from its schema.
#[test]
fn a_truncated_database_is_refused_and_left_as_it_was() {
    let db = TestDb::sqlite();
    let setup = Fixture::new(&db);
    let worker = setup.login(&setup.key(Scope::ALL, Grant::AllNamespaces));
    setup.enqueue_range(&worker, &namespace("farm"), &queue("frames"), 0, 50);
    let path = setup.path();
    let dir = path.parent().unwrap();
    drop(setup);
    // Everything folded into the one file, then cut short.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    let bytes = std::fs::read(&path).unwrap();
    for keep in [bytes.len() / 3, bytes.len() - 4096 - 17] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let _ = std::fs::remove_file(dir.join("tessera.db-wal"));
        let _ = std::fs::remove_file(dir.join("tessera.db-shm"));
        let error = Store::open(&path, StoreConfig::default()).unwrap_err();
        assert_eq!(
            (error.status(), error.code()),
            (500, "corrupt_database"),
            "{error:?}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            &bytes[..keep],
            "the file was changed"
        );
    }
}

#[test]
fn a_version_two_file_gets_priorities_and_the_claim_indexes_that_lead_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let secret = {
        let store = Store::open(&path, StoreConfig::default()).unwrap();
        let admin_key = store.create_admin_key("ops").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let (ns, q) = (namespace("renders"), queue("jobs"));
        for n in 0..2 {
            store
                .enqueue(
                    &admin,
                    &ns,
                    &q,
                    &tessera_store::Brief::Bytes(vec![n]),
                    &tessera_store::EnqueueOptions::default(),
                )
                .unwrap();
        }
        assert!(store.claim(&admin, &ns, &q).unwrap().claimed().is_some());
        admin_key.secret.expose().to_owned()
    };
    // The file as version 2 left it: no priorities, the old claim indexes.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP INDEX tasks_claim_order;
             DROP INDEX attempts_lapse_order;
             ALTER TABLE tasks DROP COLUMN priority;
             ALTER TABLE attempts DROP COLUMN priority;
             CREATE INDEX tasks_claimable ON tasks (namespace, queue, claimable_at, id)
                 WHERE claimable_at IS NOT NULL;
             CREATE INDEX attempts_leased ON attempts (namespace, queue, lapses_at, expires_at, task)
                 WHERE state = 'leased';
             UPDATE tessera_meta SET value = '2' WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let admin = store.authenticate(Some(&secret)).unwrap();
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let second = store.claim(&admin, &ns, &q).unwrap();
    assert!(
        second.claimed().is_some(),
        "the ready task is still claimable"
    );
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for new in ["tasks_claim_order", "attempts_lapse_order"] {
        assert!(
            indexes.iter().any(|name| name == new),
            "{new} in {indexes:?}"
        );
    }
    for old in ["tasks_claimable", "attempts_leased"] {
        assert!(
            !indexes.iter().any(|name| name == old),
            "{old} dropped: {indexes:?}"
        );
    }
    let version: String = conn
        .query_row(
            "SELECT value FROM tessera_meta WHERE key = 'schema_version'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION.to_string());
}
