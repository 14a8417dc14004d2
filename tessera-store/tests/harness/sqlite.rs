//! [`TestDb`](super::TestDb)'s looks behind the store's back on a SQLite
//! file, each through a plain SQLite connection of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use sha2::{Digest as _, Sha256};
use tessera_store::PrincipalId;

fn reader(path: &Path) -> Connection {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn writer(path: &Path) -> Connection {
    Connection::open(path).unwrap()
}

pub(super) fn table_snapshot(path: &Path) -> BTreeMap<String, (u64, [u8; 32])> {
    let conn = reader(path);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut snapshot = BTreeMap::new();
    for table in tables {
        // A WITHOUT ROWID table has no rowid; it is read in its key order.
        let clustered: bool = conn
            .query_row(
                "SELECT wr FROM pragma_table_list WHERE name = ?1",
                [&table],
                |row| row.get(0),
            )
            .unwrap();
        let order = if clustered { "" } else { " ORDER BY rowid" };
        let mut statement = conn
            .prepare(&format!("SELECT * FROM \"{table}\"{order}"))
            .unwrap();
        let columns = statement.column_count();
        let mut rows = statement.query([]).unwrap();
        let mut hash = Sha256::new();
        let mut count = 0;
        while let Some(row) = rows.next().unwrap() {
            count += 1;
            for column in 0..columns {
                hash.update(format!("{:?}\u{1f}", row.get_ref(column).unwrap()).as_bytes());
            }
            hash.update(b"\x1e");
        }
        snapshot.insert(table, (count, hash.finalize().into()));
    }
    snapshot
}

pub(super) fn count_rows(path: &Path, table: &str) -> u64 {
    count_where(path, table, "true")
}

pub(super) fn count_where(path: &Path, table: &str, condition: &str) -> u64 {
    reader(path)
        .query_row(
            &format!("SELECT count(*) FROM \"{table}\" WHERE {condition}"),
            [],
            |row| row.get(0),
        )
        .unwrap()
}

pub(super) fn integrity_check(path: &Path) -> String {
    let conn = writer(path);
    let mut statement = conn.prepare("PRAGMA integrity_check").unwrap();
    let lines: Vec<String> = statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    lines.join("\n")
}

/// The bytes of the database file and its WAL and shared-memory files.
pub(super) fn stored_bytes(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        if let Ok(content) = std::fs::read(PathBuf::from(name)) {
            bytes.extend(content);
        }
    }
    bytes
}

pub(super) fn checkpoint(path: &Path) {
    let (busy, _, _): (i64, i64, i64) = writer(path)
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "the WAL was folded into the file");
}

/// The sorted names of the files in the database file's directory.
pub(super) fn files_beside(path: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    files
}

pub(super) fn set_schema_version(path: &Path, version: i64) {
    writer(path)
        .execute(
            "UPDATE tessera_meta SET value = ?1 WHERE key = 'schema_version'",
            [version.to_string()],
        )
        .unwrap();
}

pub(super) fn downgrade_receipts(path: &Path) {
    writer(path)
        .execute_batch(
            "BEGIN IMMEDIATE; \
             CREATE TABLE receipts (id INTEGER PRIMARY KEY, task INTEGER NOT NULL, \
             attempt INTEGER NOT NULL, token INTEGER NOT NULL, principal TEXT NOT NULL, \
             idempotency_key TEXT NOT NULL, artifact TEXT NOT NULL, digest TEXT NOT NULL, \
             accepted_at INTEGER NOT NULL, output BLOB); \
             CREATE UNIQUE INDEX receipts_key ON receipts (principal, task, idempotency_key); \
             CREATE INDEX receipts_task ON receipts (task, attempt); \
             INSERT INTO receipts (task, attempt, token, principal, idempotency_key, artifact, \
             digest, accepted_at, output) SELECT a.task, a.number, a.token, a.holder, \
             a.idempotency_key, t.task_id || '.a' || a.number || '.t' || a.token, a.digest, \
             a.accepted_at, a.output FROM attempts a JOIN tasks t ON t.id = a.task \
             WHERE a.idempotency_key IS NOT NULL; \
             ALTER TABLE attempts DROP COLUMN idempotency_key; \
             ALTER TABLE attempts DROP COLUMN digest; \
             ALTER TABLE attempts DROP COLUMN accepted_at; \
             ALTER TABLE attempts DROP COLUMN output; \
             COMMIT;",
        )
        .unwrap();
}

pub(super) fn downgrade_edges(path: &Path) {
    writer(path)
        .execute_batch(
            "BEGIN IMMEDIATE; DROP INDEX task_edges_child; DROP TABLE task_edges; COMMIT;",
        )
        .unwrap();
}

pub(super) fn rename_account(path: &Path, principal: PrincipalId, account: &str) {
    writer(path)
        .execute(
            "UPDATE access_principals SET account = ?1 WHERE id = ?2",
            rusqlite::params![account, principal.get()],
        )
        .unwrap();
}

pub(super) fn set_try_counts(path: &Path, tries: u32) {
    writer(path)
        .execute("UPDATE attempts SET tries = ?1", [i64::from(tries)])
        .unwrap();
}
