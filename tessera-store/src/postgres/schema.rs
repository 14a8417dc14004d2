//! The PostgreSQL schema and its migration under an advisory lock.
//!
//! The same tables and indexes as the SQLite backend, in PostgreSQL's
//! types: times are Unix milliseconds (`BIGINT`), as every time comes
//! from the store's clock, never from `now()`. Opening a database checks
//! the `tessera_meta` version and the catalog first; an up-to-date database
//! runs no DDL. Otherwise one transaction takes a transaction-scoped
//! advisory lock (keyed by the schema's name, so processes opening at once
//! queue behind each other), looks again, and creates what is missing.

use postgres::Client;

use crate::error::Error;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 6;

/// Every table, created if missing.
const TABLES: &[(&str, &str)] = &[
    (
        "tessera_meta",
        "CREATE TABLE IF NOT EXISTS tessera_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ),
    (
        "access_principals",
        "CREATE TABLE IF NOT EXISTS access_principals (id BIGSERIAL PRIMARY KEY, \
         kind TEXT NOT NULL, account TEXT NOT NULL, created_at BIGINT NOT NULL, \
         last_used_at BIGINT, purge_at BIGINT)",
    ),
    (
        "access_keys",
        "CREATE TABLE IF NOT EXISTS access_keys (id BIGSERIAL PRIMARY KEY, \
         key_id TEXT NOT NULL, principal_id BIGINT NOT NULL, secret_hash BYTEA NOT NULL, \
         label TEXT NOT NULL DEFAULT '', scopes TEXT NOT NULL, grants TEXT NOT NULL, \
         created_at BIGINT NOT NULL, expires_at BIGINT, revoked_at BIGINT, purge_at BIGINT)",
    ),
    (
        "access_limits",
        "CREATE TABLE IF NOT EXISTS access_limits (id BIGSERIAL PRIMARY KEY, \
         subject TEXT NOT NULL, window_start BIGINT NOT NULL, count BIGINT NOT NULL, \
         purge_at BIGINT)",
    ),
    (
        "access_audit",
        "CREATE TABLE IF NOT EXISTS access_audit (id BIGSERIAL PRIMARY KEY, \
         at BIGINT NOT NULL, principal TEXT NOT NULL, namespace TEXT NOT NULL, \
         action TEXT NOT NULL, outcome TEXT NOT NULL, resource TEXT, ip_hash TEXT)",
    ),
    (
        "access_counters",
        "CREATE TABLE IF NOT EXISTS access_counters (minute BIGINT NOT NULL, \
         principal TEXT NOT NULL, namespace TEXT NOT NULL, action TEXT NOT NULL, \
         outcome TEXT NOT NULL, count BIGINT NOT NULL, \
         PRIMARY KEY (minute, principal, namespace, action, outcome))",
    ),
    (
        "namespaces",
        "CREATE TABLE IF NOT EXISTS namespaces (id BIGSERIAL PRIMARY KEY, \
         name TEXT NOT NULL, kind TEXT NOT NULL, created_at BIGINT NOT NULL, purge_at BIGINT)",
    ),
    (
        "tasks",
        "CREATE TABLE IF NOT EXISTS tasks (id BIGSERIAL PRIMARY KEY, \
         namespace TEXT NOT NULL, queue TEXT NOT NULL, task_id TEXT NOT NULL, \
         version BIGINT NOT NULL, brief BYTEA NOT NULL, brief_format TEXT NOT NULL, \
         alternatives BIGINT NOT NULL, lapse_backoff_ms BIGINT NOT NULL, \
         last_token BIGINT NOT NULL, claimable_at BIGINT, created_at BIGINT NOT NULL, \
         enqueued_by TEXT NOT NULL)",
    ),
    (
        "attempts",
        "CREATE TABLE IF NOT EXISTS attempts (task BIGINT NOT NULL, number BIGINT NOT NULL, \
         namespace TEXT NOT NULL, queue TEXT NOT NULL, state TEXT NOT NULL, until_at BIGINT, \
         tries BIGINT NOT NULL, holder TEXT, token BIGINT, granted_at BIGINT, \
         expires_at BIGINT, lapses_at BIGINT, PRIMARY KEY (task, number))",
    ),
    (
        "unique_slots",
        "CREATE TABLE IF NOT EXISTS unique_slots (namespace TEXT NOT NULL, queue TEXT NOT NULL, \
         slot TEXT NOT NULL, task_id TEXT NOT NULL, version BIGINT NOT NULL, \
         PRIMARY KEY (namespace, queue, slot))",
    ),
    (
        "task_edges",
        "CREATE TABLE IF NOT EXISTS task_edges (parent BIGINT NOT NULL, child BIGINT NOT NULL, \
         run_after TEXT NOT NULL, ended TEXT, place BIGINT NOT NULL, \
         PRIMARY KEY (parent, child))",
    ),
    (
        "queue_settings",
        "CREATE TABLE IF NOT EXISTS queue_settings (id BIGSERIAL PRIMARY KEY, \
         namespace TEXT NOT NULL, queue TEXT NOT NULL, paused_at BIGINT, queue_limit BIGINT, \
         partition_limit BIGINT, updated_at BIGINT NOT NULL)",
    ),
    (
        "queue_retention",
        "CREATE TABLE IF NOT EXISTS queue_retention (namespace TEXT NOT NULL, \
         queue TEXT NOT NULL, done_ms BIGINT, discarded_ms BIGINT, cancelled_ms BIGINT, \
         updated_at BIGINT NOT NULL, PRIMARY KEY (namespace, queue))",
    ),
    (
        "schedules",
        "CREATE TABLE IF NOT EXISTS schedules (id BIGSERIAL PRIMARY KEY, \
         namespace TEXT NOT NULL, name TEXT NOT NULL, queue TEXT NOT NULL, \
         cron TEXT NOT NULL, zone TEXT NOT NULL, brief BYTEA NOT NULL, \
         brief_format TEXT NOT NULL, options TEXT NOT NULL, \
         paused BIGINT NOT NULL DEFAULT 0, active_since BIGINT NOT NULL, \
         created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, created_by TEXT NOT NULL)",
    ),
    (
        "schedule_fires",
        "CREATE TABLE IF NOT EXISTS schedule_fires (id BIGSERIAL PRIMARY KEY, \
         namespace TEXT NOT NULL, schedule TEXT NOT NULL, run_at BIGINT NOT NULL, \
         task_id TEXT NOT NULL, fired_at BIGINT NOT NULL)",
    ),
];

/// Every index, created if missing; the same as SQLite's, for the same
/// searches, but that `attempts_at_rest` leaves out the leased attempts
/// that SQLite's `attempts_by_state` holds (see [`RETIRED_INDEXES`]).
const INDEXES: &[(&str, &str)] = &[
    (
        "access_principals_purge",
        "CREATE INDEX IF NOT EXISTS access_principals_purge ON access_principals (purge_at) \
         WHERE purge_at IS NOT NULL",
    ),
    (
        "access_keys_key_id",
        "CREATE UNIQUE INDEX IF NOT EXISTS access_keys_key_id ON access_keys (key_id)",
    ),
    (
        "access_keys_principal",
        "CREATE INDEX IF NOT EXISTS access_keys_principal ON access_keys (principal_id, key_id)",
    ),
    (
        "access_keys_purge",
        "CREATE INDEX IF NOT EXISTS access_keys_purge ON access_keys (purge_at) \
         WHERE purge_at IS NOT NULL",
    ),
    (
        "access_limits_subject",
        "CREATE UNIQUE INDEX IF NOT EXISTS access_limits_subject \
         ON access_limits (subject, window_start)",
    ),
    (
        "access_limits_purge",
        "CREATE INDEX IF NOT EXISTS access_limits_purge ON access_limits (purge_at) \
         WHERE purge_at IS NOT NULL",
    ),
    (
        "access_audit_by_principal",
        "CREATE INDEX IF NOT EXISTS access_audit_by_principal ON access_audit (principal, at, id)",
    ),
    (
        "namespaces_name",
        "CREATE UNIQUE INDEX IF NOT EXISTS namespaces_name ON namespaces (name)",
    ),
    (
        "namespaces_purge",
        "CREATE INDEX IF NOT EXISTS namespaces_purge ON namespaces (purge_at) \
         WHERE purge_at IS NOT NULL",
    ),
    (
        "tasks_ref",
        "CREATE UNIQUE INDEX IF NOT EXISTS tasks_ref ON tasks (namespace, task_id, version)",
    ),
    (
        "tasks_claim_order",
        "CREATE INDEX IF NOT EXISTS tasks_claim_order \
         ON tasks (namespace, queue, priority, claimable_at, id) WHERE claimable_at IS NOT NULL",
    ),
    (
        "attempts_at_rest",
        "CREATE INDEX IF NOT EXISTS attempts_at_rest ON attempts (namespace, state, task, number) \
         WHERE state <> 'leased'",
    ),
    (
        "attempts_lapse_order",
        "CREATE INDEX IF NOT EXISTS attempts_lapse_order \
         ON attempts (namespace, queue, priority, lapses_at, task, expires_at) \
         WHERE state = 'leased'",
    ),
    (
        "queue_settings_queue",
        "CREATE UNIQUE INDEX IF NOT EXISTS queue_settings_queue \
         ON queue_settings (namespace, queue)",
    ),
    (
        "attempts_changed_at_rest",
        "CREATE INDEX IF NOT EXISTS attempts_changed_at_rest \
         ON attempts (namespace, changed_at, task, number) WHERE state <> 'leased'",
    ),
    (
        "task_edges_child",
        "CREATE INDEX IF NOT EXISTS task_edges_child ON task_edges (child, parent)",
    ),
    (
        "unique_slots_ending",
        "CREATE INDEX IF NOT EXISTS unique_slots_ending ON unique_slots (ends_at) \
         WHERE ends_at IS NOT NULL",
    ),
    (
        "attempts_receipt_key",
        "CREATE UNIQUE INDEX IF NOT EXISTS attempts_receipt_key \
         ON attempts (task, holder, idempotency_key) WHERE idempotency_key IS NOT NULL",
    ),
    (
        "schedules_name",
        "CREATE UNIQUE INDEX IF NOT EXISTS schedules_name ON schedules (namespace, name)",
    ),
    (
        "schedules_active",
        "CREATE INDEX IF NOT EXISTS schedules_active ON schedules (namespace, name) \
         WHERE paused = 0",
    ),
    (
        "schedule_fires_run_at",
        "CREATE UNIQUE INDEX IF NOT EXISTS schedule_fires_run_at \
         ON schedule_fires (namespace, schedule, run_at)",
    ),
];

/// Changes since a table first shipped, each a no-op where made already:
/// columns added where missing (a session namespace's purge time; in
/// version 2 the tries, discard reasons and last errors; in version 3 the
/// priorities) and indexes retired.
const ALTERATIONS: &[&str] = &[
    "ALTER TABLE namespaces ADD COLUMN IF NOT EXISTS purge_at BIGINT",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS max_tries BIGINT NOT NULL DEFAULT 20",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS discarded TEXT",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS last_error TEXT",
    // Retired in version 2: `attempts_by_state` begins with its columns.
    "DROP INDEX IF EXISTS attempts_state",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS priority BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS priority BIGINT NOT NULL DEFAULT 0",
    // Retired in version 3: the claim indexes now lead with the priority.
    "DROP INDEX IF EXISTS tasks_claimable",
    "DROP INDEX IF EXISTS attempts_leased",
    // Retired: an audit page of one principal reads `(principal, at, id)`
    // in its order, so nothing is sorted.
    "DROP INDEX IF EXISTS access_audit_principal",
    // Version 4: a task's partition key, and a unique task's key, slot
    // (NULL once released) and the states in which it holds the slot
    // (the slot's row is in `unique_slots`).
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS partition_key TEXT",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS unique_key TEXT",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS unique_slot TEXT",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS unique_states BIGINT",
    // Version 4: when an attempt's state last changed (0 for attempts
    // older than the column), and the last progress a heartbeat carried.
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS changed_at BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS progress TEXT",
    // A task's own lease length and its deadline (NULL: the store's
    // lease, no deadline).
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_ms BIGINT",
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS deadline_at BIGINT",
    // When a windowed unique slot's window ends (NULL: no window).
    "ALTER TABLE unique_slots ADD COLUMN IF NOT EXISTS ends_at BIGINT",
    // Version 5: the receipt of the submission that ended an attempt, in
    // the attempt's row (its token and holder are the receipt's token and
    // principal); `receipts` before, moved by [`MOVE_RECEIPTS`].
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS idempotency_key TEXT",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS digest TEXT",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS accepted_at BIGINT",
    "ALTER TABLE attempts ADD COLUMN IF NOT EXISTS output BYTEA",
    // Version 6: a task's count of children, which the one-statement
    // submissions read to leave a parent to the general transaction.
    "ALTER TABLE tasks ADD COLUMN IF NOT EXISTS children BIGINT NOT NULL DEFAULT 0",
];

/// Before version 5 each receipt was a row of its own table; it moves
/// into the row of the attempt it ended, so a submission writes one row,
/// not two, and the table goes. Runs after the [`ALTERATIONS`] and
/// before the [`INDEXES`], where a `receipts` table is found. (A build
/// older than version 5 refuses the database afterwards, as it refuses
/// every newer schema.)
const MOVE_RECEIPTS: &str = "UPDATE attempts a SET idempotency_key = r.idempotency_key, \
     digest = r.digest, accepted_at = r.accepted_at, output = r.output \
     FROM receipts r WHERE r.task = a.task AND r.attempt = a.number";

/// Indexes earlier builds created and this one drops where it finds them,
/// after the [`ALTERATIONS`].
/// An older build that opens the schema again recreates them, which is
/// harmless: nothing here needs them gone, it only stops paying for them.
///
/// - `access_audit_at`: audit rows are appended in time order, so their
///   row ids are in time order too; retention finds its time bound by a
///   search of the row ids (`first_event_at_or_after`), and each audit
///   row costs one b-tree entry less.
/// - `attempts_lapsing`: `attempts_lapse_order` before it ordered the
///   leases that lapse at the same time by their task, as the lease
///   rules' claim order does (it ordered them by expiry).
/// - `attempts_by_state`: `attempts_at_rest` holds the same entries but
///   the leased attempts', which `attempts_lapse_order` holds. A grant, a
///   heartbeat and a lapse write one entry fewer, and no search of leased
///   attempts can choose the listing index: where the statistics count
///   few leases, PostgreSQL chose it for them and walked, on each search,
///   the entry every ended lease left there until a vacuum.
/// - `attempts_changed`: `attempts_changed_at_rest` holds its entries
///   but the leased attempts' (version 5). A grant writes a new version
///   of its attempt, and every index that takes the version takes an
///   entry: one fewer a job. A bulk filter reads the leases in flight
///   from `attempts_lapse_order` instead.
const RETIRED_INDEXES: &[&str] = &[
    "access_audit_at",
    "attempts_lapsing",
    "attempts_by_state",
    "attempts_changed",
];

/// Version 1 counted tries without a limit. On the move to version 2
/// each task allows at least one try more than any of its attempts has
/// had (up to `MAX_TRIES`), so no stored attempt runs out of tries, or
/// reads as corrupt, by the upgrade alone. One pass over the tasks, once.
const BACKFILL_MAX_TRIES: &str = "UPDATE tasks SET max_tries = LEAST(a.most + 1, 10000) \
     FROM (SELECT task, max(tries) AS most FROM attempts GROUP BY task) a \
     WHERE a.task = tasks.id AND tasks.max_tries <= a.most";

/// What the catalog says of the schema.
struct Inspection {
    tables: usize,
    indexes: usize,
    /// Of [`RETIRED_INDEXES`], how many are there.
    retired: usize,
    version: Option<i64>,
}

fn inspect(client: &mut impl postgres::GenericClient) -> Result<Inspection, Error> {
    let names: Vec<&str> = TABLES.iter().map(|(name, _)| *name).collect();
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_tables \
             WHERE schemaname = current_schema() AND tablename = ANY($1)",
            &[&names],
        )?
        .get(0);
    let names: Vec<&str> = INDEXES.iter().map(|(name, _)| *name).collect();
    let count_indexes = |client: &mut _, names: &[&str]| -> Result<i64, Error> {
        Ok(postgres::GenericClient::query_one(
            client,
            "SELECT count(*) FROM pg_catalog.pg_indexes \
             WHERE schemaname = current_schema() AND indexname = ANY($1)",
            &[&names],
        )?
        .get(0))
    };
    let indexes = count_indexes(client, &names)?;
    let retired = count_indexes(client, RETIRED_INDEXES)?;
    let mut version = None;
    let has_meta: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
             WHERE schemaname = current_schema() AND tablename = 'tessera_meta')",
            &[],
        )?
        .get(0);
    if has_meta {
        let row = client.query_opt(
            "SELECT value FROM tessera_meta WHERE key = 'schema_version'",
            &[],
        )?;
        if let Some(row) = row {
            let text: String = row.get(0);
            version = Some(text.parse().map_err(|_| Error::CorruptDatabase {
                reason: format!("schema version {text:?} is not a number"),
            })?);
        }
    }
    Ok(Inspection {
        tables: usize::try_from(tables).unwrap_or(0),
        indexes: usize::try_from(indexes).unwrap_or(0),
        retired: usize::try_from(retired).unwrap_or(0),
        version,
    })
}

fn check_version(inspection: &Inspection) -> Result<(), Error> {
    match inspection.version {
        Some(found) if found > SCHEMA_VERSION => Err(Error::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        }),
        _ => Ok(()),
    }
}

/// Whether the schema needs no DDL. A retired index left in place needs
/// none while writes are refused: reads and refusals work with it there.
fn is_up_to_date(inspection: &Inspection, refusing: bool) -> bool {
    inspection.tables == TABLES.len()
        && inspection.indexes == INDEXES.len()
        && (refusing || inspection.retired == 0)
        && inspection.version == Some(SCHEMA_VERSION)
}

/// Brings the schema named by the connection's `search_path` to this
/// build's, creating the schema itself if `schema` is set and missing.
/// Returns the table rows its transaction changed, or `None` when no DDL
/// ran (nothing was committed). While `refusing` writes, a database that
/// needs any is a quota refusal, with nothing written.
pub(crate) fn migrate(
    client: &mut Client,
    schema: Option<&str>,
    refusing: bool,
) -> Result<Option<u64>, Error> {
    let exists = match schema {
        Some(schema) => client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
                &[&schema],
            )?
            .get(0),
        None => true,
    };
    if exists {
        let inspection = inspect(client)?;
        check_version(&inspection)?;
        if is_up_to_date(&inspection, refusing) {
            return Ok(None);
        }
    }
    if refusing {
        return Err(Error::quota_refused());
    }
    let mut transaction = client.transaction()?;
    let lock_key = schema.unwrap_or("public");
    transaction.execute(
        "SELECT pg_advisory_xact_lock(hashtext('tessera schema ' || $1))",
        &[&lock_key],
    )?;
    if let Some(schema) = schema {
        transaction.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))?;
    }
    // Looked at again under the lock: another process may have migrated.
    let inspection = inspect(&mut transaction)?;
    check_version(&inspection)?;
    if is_up_to_date(&inspection, false) {
        transaction.commit()?;
        return Ok(None);
    }
    for (_, ddl) in TABLES.iter() {
        transaction.batch_execute(ddl)?;
    }
    for ddl in ALTERATIONS {
        transaction.batch_execute(ddl)?;
    }
    for index in RETIRED_INDEXES {
        transaction.batch_execute(&format!("DROP INDEX IF EXISTS {index}"))?;
    }
    let receipts_table: bool = transaction
        .query_one("SELECT to_regclass('receipts') IS NOT NULL", &[])?
        .get(0);
    let mut rows = 0;
    if receipts_table {
        rows += transaction.execute(MOVE_RECEIPTS, &[])?;
        transaction.batch_execute("DROP TABLE receipts")?;
    }
    for (_, ddl) in INDEXES {
        transaction.batch_execute(ddl)?;
    }
    if inspection.version.is_some_and(|found| found < 2) {
        rows += transaction.execute(BACKFILL_MAX_TRIES, &[])?;
    }
    rows += transaction.execute(
        "INSERT INTO tessera_meta (key, value) VALUES ('schema_version', $1) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&SCHEMA_VERSION.to_string()],
    )?;
    transaction.commit()?;
    Ok(Some(rows))
}
