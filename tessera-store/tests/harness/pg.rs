//! [`TestDb`](super::TestDb)'s looks behind the store's back on a
//! PostgreSQL schema, each through a plain client of its own.

use std::collections::BTreeMap;

use postgres::{Client, NoTls};
use sha2::{Digest as _, Sha256};
use tessera_store::PrincipalId;

/// The server the tests use, from `TESSERA_TEST_POSTGRES_URL`.
///
/// Panics when it is unset: the tests that need it are marked ignored
/// then (see the store's `build.rs`), so only `--ignored` gets here.
pub(super) fn server_url() -> String {
    std::env::var("TESSERA_TEST_POSTGRES_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .expect("TESSERA_TEST_POSTGRES_URL names the PostgreSQL server the tests use")
}

pub(super) fn client(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

/// A schema name no other test uses.
pub(super) fn fresh_schema() -> String {
    let mut bytes = [0_u8; 6];
    getrandom::fill(&mut bytes).unwrap();
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("t_{}_{hex}", std::process::id())
}

pub(super) fn drop_schema(url: &str, schema: &str) {
    if let Ok(mut client) = Client::connect(url, NoTls) {
        let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
    }
}

pub(super) fn exists(url: &str, schema: &str) -> bool {
    client(url)
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .unwrap()
        .get(0)
}

fn tables(client: &mut Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = $1 ORDER BY tablename",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Each table's rows as text, in a fixed order.
fn rows_as_text(client: &mut Client, schema: &str, table: &str) -> Vec<String> {
    client
        .query(
            &format!("SELECT t::text FROM \"{schema}\".\"{table}\" AS t ORDER BY t::text"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

pub(super) fn table_snapshot(url: &str, schema: &str) -> BTreeMap<String, (u64, [u8; 32])> {
    let mut client = client(url);
    let mut snapshot = BTreeMap::new();
    for table in tables(&mut client, schema) {
        let rows = rows_as_text(&mut client, schema, &table);
        let mut hash = Sha256::new();
        for row in &rows {
            hash.update(row.as_bytes());
            hash.update(b"\x1e");
        }
        snapshot.insert(table, (rows.len() as u64, hash.finalize().into()));
    }
    snapshot
}

pub(super) fn count_rows(url: &str, schema: &str, table: &str) -> u64 {
    count_where(url, schema, table, "true")
}

pub(super) fn count_where(url: &str, schema: &str, table: &str, condition: &str) -> u64 {
    let count: i64 = client(url)
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".\"{table}\" WHERE {condition}"),
            &[],
        )
        .unwrap()
        .get(0);
    u64::try_from(count).unwrap()
}

/// Every row of every table as text: what a reader of the database sees.
pub(super) fn stored_bytes(url: &str, schema: &str) -> Vec<u8> {
    let mut client = client(url);
    let mut bytes = Vec::new();
    for table in tables(&mut client, schema) {
        for row in rows_as_text(&mut client, schema, &table) {
            bytes.extend(row.into_bytes());
            bytes.push(b'\n');
        }
    }
    bytes
}

pub(super) fn set_schema_version(url: &str, schema: &str, version: i64) {
    client(url)
        .execute(
            &format!(
                "UPDATE \"{schema}\".tessera_meta SET value = $1 WHERE key = 'schema_version'"
            ),
            &[&version.to_string()],
        )
        .unwrap();
}

pub(super) fn downgrade_receipts(url: &str, schema: &str) {
    client(url)
        .batch_execute(&format!(
            "SET search_path TO \"{schema}\"; BEGIN; \
             CREATE TABLE receipts (id BIGSERIAL PRIMARY KEY, task BIGINT NOT NULL, \
             attempt BIGINT NOT NULL, token BIGINT NOT NULL, principal TEXT NOT NULL, \
             idempotency_key TEXT NOT NULL, artifact TEXT NOT NULL, digest TEXT NOT NULL, \
             accepted_at BIGINT NOT NULL, output BYTEA); \
             CREATE UNIQUE INDEX receipts_key ON receipts (principal, task, idempotency_key); \
             CREATE INDEX receipts_task ON receipts (task, attempt, id); \
             INSERT INTO receipts (task, attempt, token, principal, idempotency_key, artifact, \
             digest, accepted_at, output) SELECT a.task, a.number, a.token, a.holder, \
             a.idempotency_key, t.task_id || '.a' || a.number || '.t' || a.token, a.digest, \
             a.accepted_at, a.output FROM attempts a JOIN tasks t ON t.id = a.task \
             WHERE a.idempotency_key IS NOT NULL; \
             ALTER TABLE attempts DROP COLUMN idempotency_key, DROP COLUMN digest, \
             DROP COLUMN accepted_at, DROP COLUMN output; \
             COMMIT;"
        ))
        .unwrap();
}

pub(super) fn downgrade_edges(url: &str, schema: &str) {
    client(url)
        .batch_execute(&format!(
            "SET search_path TO \"{schema}\"; BEGIN; DROP TABLE task_edges; \
             ALTER TABLE tasks DROP COLUMN children; COMMIT;"
        ))
        .unwrap();
}

pub(super) fn rename_account(url: &str, schema: &str, principal: PrincipalId, account: &str) {
    client(url)
        .execute(
            &format!("UPDATE \"{schema}\".access_principals SET account = $1 WHERE id = $2"),
            &[&account, &principal.get()],
        )
        .unwrap();
}

pub(super) fn set_try_counts(url: &str, schema: &str, tries: u32) {
    client(url)
        .execute(
            &format!("UPDATE \"{schema}\".attempts SET tries = $1"),
            &[&i64::from(tries)],
        )
        .unwrap();
}
