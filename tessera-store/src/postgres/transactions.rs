//! The seam's read and write transactions on PostgreSQL.
//!
//! A write transaction locks what it changes: a task row `FOR UPDATE`
//! before its rules run (heartbeat, submit, fail), and a claim takes the
//! first claimable task with `FOR UPDATE SKIP LOCKED` in a CTE, so two
//! processes never take the same one and the planner cannot lock more
//! than it takes. Statements are prepared once per connection.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use postgres::types::ToSql;
use postgres::{Row, Statement};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, Principal, QueueName, Receipt, StateName, TaskRecord,
};

use crate::backend::rows::{
    self, AttemptRow, AttemptWrite, CounterRow, EventRow, KeyRow, ListingRow, ReceiptRow, TaskRow,
    TaskWrites, claimable_column, corrupt, count, duration_millis, millis, minute_number,
    state_counts, to_json,
};
use crate::backend::{
    KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewKey, NewTask, Purge, ReadTransaction,
    Result, StoredKey, TaskHandle, WriteTransaction, by_priority,
};
use crate::key::KeyId;
use crate::model::access::{KeyInfo, PrincipalId, PrincipalKind};
use crate::model::audit::AuditCursor;
use crate::model::health::StateCounts;
use crate::model::task::{ListOrder, StoredReceipt, TaskCursor, TaskListing, TaskRef};

/// Statements prepared on one connection, by their text.
pub(crate) type Prepared = HashMap<&'static str, Statement>;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// One transaction on one pooled connection.
pub(crate) struct PgTransaction<'a> {
    transaction: RefCell<postgres::Transaction<'a>>,
    prepared: RefCell<&'a mut Prepared>,
    /// The channel enqueues are announced on.
    channel: &'a str,
    /// Whether reads lock what they return (a write transaction).
    locking: bool,
    /// Table rows changed so far, for the daily allowance.
    rows: Cell<u64>,
    /// The rows of the optional tail, once one ran.
    tail: Cell<Option<u64>>,
}

impl<'a> PgTransaction<'a> {
    pub(crate) fn new(
        transaction: postgres::Transaction<'a>,
        prepared: &'a mut Prepared,
        channel: &'a str,
        locking: bool,
    ) -> Self {
        Self {
            transaction: RefCell::new(transaction),
            prepared: RefCell::new(prepared),
            channel,
            locking,
            rows: Cell::new(0),
            tail: Cell::new(None),
        }
    }

    /// Table rows changed, and those of the optional tail.
    pub(crate) fn rows(&self) -> (u64, Option<u64>) {
        (self.rows.get(), self.tail.get())
    }

    /// Ends it: committed, or (with `commit` false) rolled back.
    pub(crate) fn finish(self, commit: bool) -> std::result::Result<(), postgres::Error> {
        let transaction = self.transaction.into_inner();
        if commit {
            transaction.commit()
        } else {
            transaction.rollback()
        }
    }

    pub(crate) fn rollback_tail(&self) -> Result<()> {
        self.batch("ROLLBACK TO SAVEPOINT optional_tail")?;
        if let Some(tail) = self.tail.take() {
            self.rows.set(self.rows.get().saturating_sub(tail));
        }
        Ok(())
    }

    fn statement(&self, sql: &'static str) -> Result<Statement> {
        if let Some(statement) = self.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.transaction.borrow_mut().prepare(sql)?;
        self.prepared.borrow_mut().insert(sql, statement.clone());
        Ok(statement)
    }

    fn query(&self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>> {
        let statement = self.statement(sql)?;
        Ok(self.transaction.borrow_mut().query(&statement, params)?)
    }

    fn query_opt(&self, sql: &'static str, params: Params<'_>) -> Result<Option<Row>> {
        let statement = self.statement(sql)?;
        Ok(self
            .transaction
            .borrow_mut()
            .query_opt(&statement, params)?)
    }

    fn execute(&self, sql: &'static str, params: Params<'_>) -> Result<u64> {
        let statement = self.statement(sql)?;
        let changed = self.transaction.borrow_mut().execute(&statement, params)?;
        self.rows.set(self.rows.get().saturating_add(changed));
        Ok(changed)
    }

    fn batch(&self, sql: &str) -> Result<()> {
        Ok(self.transaction.borrow_mut().batch_execute(sql)?)
    }

    /// A task row with its attempts.
    fn load(&self, row: TaskRow) -> Result<LoadedTask> {
        let attempts = self
            .query(ATTEMPTS_OF_TASK, &[&row.id])?
            .iter()
            .map(attempt_row)
            .collect::<Result<Vec<_>>>()?;
        row.loaded(attempts)
    }

    fn task_by_id(&self, id: i64) -> Result<Option<TaskRow>> {
        let sql = if self.locking {
            TASK_BY_ID_LOCKED
        } else {
            TASK_BY_ID
        };
        self.query_opt(sql, &[&id])?
            .as_ref()
            .map(task_row)
            .transpose()
    }

    fn receipts(&self, task: &TaskRef, rows: Vec<Row>) -> Result<Vec<StoredReceipt>> {
        rows.iter()
            .map(|row| receipt_row(row)?.stored(task))
            .collect()
    }
}

/// A task row's columns, in [`task_row`] order.
macro_rules! task_columns {
    () => {
        "id, queue, task_id, version, brief, brief_format, lapse_backoff_ms, last_token, \
         claimable_at, created_at, max_tries, priority"
    };
}

const TASK_BY_REF: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3"
);
const TASK_BY_REF_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3 FOR UPDATE"
);
const TASK_BY_ID: &str = concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1");
const TASK_BY_ID_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE id = $1 FOR UPDATE SKIP LOCKED"
);
const FIND_TASK: &str =
    "SELECT id FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3";
/// A queue's claimable tasks, as each priority's arm selects them.
macro_rules! claimable_tasks {
    () => {
        concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE namespace = $1 AND queue = $2 \
             AND claimable_at IS NOT NULL AND claimable_at <= $3"
        )
    };
}
/// A queue's lapsed leases, as each priority's arm selects them.
macro_rules! lapsed_leases {
    () => {
        "SELECT task, lapses_at, priority FROM attempts \
         WHERE namespace = $1 AND queue = $2 AND state = 'leased' AND lapses_at <= $3"
    };
}
/// The first claimable task of a queue in claim-index order, from the
/// highest priority down, locked, or skipped if another transaction holds
/// it (`$4` is 0).
///
/// The columns come out of the locking subquery itself. Under `READ
/// COMMITTED` a row locked after a concurrent commit is its newest
/// version, while a second read of `tasks` in the same statement would
/// see the statement's older snapshot: a last token behind the attempts
/// read next.
const NEXT_CLAIMABLE: &str = by_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// [`NEXT_CLAIMABLE`] without taking it, for a read.
const PEEK_CLAIMABLE: &str = by_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1",
    "$4::bigint"
);
/// [`NEXT_LAPSED`] without taking it, for a read.
const PEEK_LAPSED: &str =
    by_priority!(lapsed_leases!(), "ORDER BY lapses_at LIMIT 1", "$4::bigint");
/// The lease of a queue that lapsed first, from priority `$4` up, its
/// attempt locked.
const NEXT_LAPSED: &str = by_priority!(
    lapsed_leases!(),
    "ORDER BY lapses_at LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// Index searches only, at most one per priority and index.
const HAS_CLAIMABLE: &str = concat!(
    "SELECT EXISTS (",
    by_priority!(
        "SELECT 1 FROM tasks WHERE namespace = $1 AND queue = $2 \
         AND claimable_at IS NOT NULL AND claimable_at <= $3",
        "LIMIT 1",
        "0"
    ),
    ") OR EXISTS (",
    by_priority!(
        "SELECT 1 FROM attempts WHERE namespace = $1 AND queue = $2 \
         AND state = 'leased' AND lapses_at <= $3",
        "LIMIT 1",
        "0"
    ),
    ")"
);
const ATTEMPTS_OF_TASK: &str = "SELECT number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error FROM attempts WHERE task = $1 \
     ORDER BY number";
const INSERT_NAMESPACE: &str = "INSERT INTO namespaces (name, kind, created_at, purge_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";
const NAMESPACE_EXISTS: &str = "SELECT 1 FROM namespaces WHERE name = $1";
const INSERT_TASK: &str = "INSERT INTO tasks (namespace, queue, task_id, version, brief, \
     brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11, 0, $12, $9, $10, $13) \
     ON CONFLICT (namespace, task_id, version) DO NOTHING RETURNING id";
const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task, number, namespace, queue, state, \
     until_at, tries, priority) VALUES ($1, $2, $3, $4, $5, $6, 0, $7)";
const UPDATE_ATTEMPT: &str = "UPDATE attempts SET state = $3, until_at = $4, tries = $5, \
     holder = $6, token = $7, granted_at = $8, expires_at = $9, lapses_at = $10, \
     discarded = $11, last_error = $12 WHERE task = $1 AND number = $2";
const UPDATE_ATTEMPT_STATE: &str = "UPDATE attempts SET state = $3, until_at = $4, \
     lapses_at = $5, discarded = $6, last_error = $7 WHERE task = $1 AND number = $2";
const EXTEND_ATTEMPT: &str = "UPDATE attempts SET expires_at = $3, lapses_at = $4 \
     WHERE task = $1 AND number = $2";
const UPDATE_TASK: &str = "UPDATE tasks SET last_token = $2, claimable_at = $3 WHERE id = $1";
const UPDATE_TOKEN: &str = "UPDATE tasks SET last_token = $2 WHERE id = $1";
const UPDATE_MAX_TRIES: &str = "UPDATE tasks SET max_tries = $2 WHERE id = $1";
const UPDATE_CLAIMABLE: &str = "UPDATE tasks SET claimable_at = $2 WHERE id = $1";
/// Tasks with an expired lease, each once, locked or skipped.
const LAPSED_TASKS: &str = "SELECT DISTINCT task FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2 LIMIT $3";
/// A listing's columns and join, in [`ListingRow`] order.
macro_rules! select_listing {
    ($tail:literal) => {
        concat!(
            "SELECT a.task, a.number, a.state, a.until_at, a.discarded, a.tries, ",
            "t.queue, t.task_id, t.version FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = $1 AND a.state = $2 ",
            $tail
        )
    };
}
/// A namespace's attempts in one state after ($3, $4), oldest first: one
/// search of `attempts_by_state`.
const TASKS_BY_STATE_OLDEST: &str =
    select_listing!("AND (a.task, a.number) > ($3, $4) ORDER BY a.task, a.number LIMIT $5");
/// [`TASKS_BY_STATE_OLDEST`] newest first, before ($3, $4).
const TASKS_BY_STATE_NEWEST: &str = select_listing!(
    "AND (a.task, a.number) < ($3, $4) ORDER BY a.task DESC, a.number DESC LIMIT $5"
);
const COUNT_BY_STATE: &str =
    "SELECT state, count(*) FROM attempts WHERE namespace = $1 GROUP BY state";
const COUNT_LAPSED: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2";
/// A receipt row's columns, in [`receipt_row`] order.
macro_rules! receipt_columns {
    () => {
        "attempt, token, principal, idempotency_key, artifact, digest, accepted_at, output"
    };
}
const INSERT_RECEIPT: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const RECEIPT_BY_KEY: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE principal = $1 AND task = $2 AND idempotency_key = $3"
);
const RECEIPTS_OF_ATTEMPT: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE task = $1 AND attempt = $2 ORDER BY id"
);
const RECEIPTS_OF_TASK: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE task = $1 ORDER BY attempt, id LIMIT $2"
);
/// A key with its principal, in [`key_row`] order.
macro_rules! key_columns {
    () => {
        "k.key_id, k.principal_id, k.secret_hash, k.label, k.scopes, k.grants, k.created_at, \
         k.expires_at, k.revoked_at, p.kind, p.account, p.last_used_at \
         FROM access_keys AS k JOIN access_principals AS p ON p.id = k.principal_id"
    };
}
const KEY_BY_KEY_ID: &str = concat!("SELECT ", key_columns!(), " WHERE k.key_id = $1");
const KEYS_OF_PRINCIPAL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.principal_id = $1 AND k.key_id > $2 ORDER BY k.key_id LIMIT $3"
);
const KEYS_ALL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.key_id > $1 ORDER BY k.key_id LIMIT $2"
);
const PRINCIPAL_BY_ID: &str = "SELECT kind, account FROM access_principals WHERE id = $1";
const INSERT_PRINCIPAL: &str = "INSERT INTO access_principals \
     (kind, account, created_at, purge_at) VALUES ($1, $2, $3, $4) RETURNING id";
const INSERT_KEY: &str = "INSERT INTO access_keys (key_id, principal_id, secret_hash, label, \
     scopes, grants, created_at, expires_at, purge_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key_id) DO NOTHING";
const REVOKE_KEY: &str = "UPDATE access_keys SET revoked_at = $2 WHERE key_id = $1";
const EXPIRE_KEY: &str = "UPDATE access_keys SET expires_at = $2 WHERE key_id = $1";
const TOUCH_PRINCIPAL: &str = "UPDATE access_principals SET last_used_at = $2 WHERE id = $1";
const INSERT_EVENT: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const ADD_TO_COUNTER: &str = "INSERT INTO access_counters \
     (minute, principal, namespace, action, outcome, count) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (minute, principal, namespace, action, outcome) \
     DO UPDATE SET count = access_counters.count + excluded.count";
macro_rules! event_columns {
    () => {
        "SELECT at, principal, namespace, action, outcome, resource, ip_hash, id \
         FROM access_audit "
    };
}
/// One principal's events, newest first, from the cursor (`$4`, `$5`) on:
/// a backward range of `access_audit_by_principal (principal, at, id)`,
/// in its own order, started at the cursor by `at <= $4`.
const EVENTS_OF_PRINCIPAL: &str = concat!(
    event_columns!(),
    "WHERE principal = $1 AND at >= $2 AND at <= $4 AND (at, id) < ($4, $5) \
     ORDER BY at DESC, id DESC LIMIT $3"
);
/// Every event at or after `$1`, newest written first, below the cursor's
/// row id `$3`: a backward range of the primary key, as SQLite reads its
/// row ids, so a page reads no row it does not return.
const EVENTS_ALL: &str = concat!(
    event_columns!(),
    "WHERE at >= $1 AND id < $3 ORDER BY id DESC LIMIT $2"
);
macro_rules! counter_columns {
    () => {
        "SELECT minute, principal, namespace, action, outcome, count FROM access_counters "
    };
}
const COUNTERS_OF_PRINCIPAL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $2 AND principal = $1 ORDER BY minute DESC LIMIT $3"
);
const COUNTERS_ALL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $1 ORDER BY minute DESC LIMIT $2"
);
// Retention batches: each process deletes rows no other is deleting.
const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN (SELECT id FROM access_audit \
     WHERE at < $1 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)";
const PURGE_COUNTERS: &str = "DELETE FROM access_counters \
     WHERE (minute, principal, namespace, action, outcome) IN \
     (SELECT minute, principal, namespace, action, outcome FROM access_counters \
     WHERE minute < $1 ORDER BY minute LIMIT $2 FOR UPDATE SKIP LOCKED)";
const PURGE_KEYS: &str = "DELETE FROM access_keys WHERE id IN (SELECT id FROM access_keys \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
const PURGE_PRINCIPALS: &str = "DELETE FROM access_principals WHERE id IN \
     (SELECT id FROM access_principals WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
const PURGE_LIMITS: &str = "DELETE FROM access_limits WHERE id IN (SELECT id FROM access_limits \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
/// A batch of purged sessions' tasks, locked or skipped, deleted with
/// their receipts and attempts in one statement.
const PURGE_SESSION_TASKS: &str = "WITH doomed AS (SELECT t.id FROM namespaces n \
     JOIN tasks t ON t.namespace = n.name WHERE n.purge_at IS NOT NULL AND n.purge_at <= $1 \
     ORDER BY t.id LIMIT $2 FOR UPDATE OF t SKIP LOCKED), \
     receipts_gone AS (DELETE FROM receipts WHERE task IN (SELECT id FROM doomed)), \
     attempts_gone AS (DELETE FROM attempts WHERE task IN (SELECT id FROM doomed)) \
     DELETE FROM tasks WHERE id IN (SELECT id FROM doomed)";
const PURGE_NAMESPACES: &str = "DELETE FROM namespaces WHERE id IN (SELECT id FROM namespaces \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.namespace = namespaces.name) \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
const META_VALUE: &str = "SELECT value FROM tessera_meta WHERE key = $1";
const INSERT_META: &str =
    "INSERT INTO tessera_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";
const LIMIT_COUNT: &str =
    "SELECT count FROM access_limits WHERE subject = $1 AND window_start = $2";
const BUMP_LIMIT: &str = "INSERT INTO access_limits (subject, window_start, count, purge_at) \
     VALUES ($1, $2, 1, $3) ON CONFLICT (subject, window_start) \
     DO UPDATE SET count = access_limits.count + 1";
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

fn task_row(row: &Row) -> Result<TaskRow> {
    Ok(TaskRow {
        id: row.try_get(0)?,
        queue: row.try_get(1)?,
        task_id: row.try_get(2)?,
        version: row.try_get(3)?,
        brief: row.try_get(4)?,
        brief_format: row.try_get(5)?,
        lapse_backoff_ms: row.try_get(6)?,
        last_token: row.try_get(7)?,
        claimable_at: row.try_get(8)?,
        created_at: row.try_get(9)?,
        max_tries: row.try_get(10)?,
        priority: row.try_get(11)?,
    })
}

fn attempt_row(row: &Row) -> Result<AttemptRow> {
    Ok(AttemptRow {
        number: row.try_get(0)?,
        state: row.try_get(1)?,
        until_at: row.try_get(2)?,
        tries: row.try_get(3)?,
        holder: row.try_get(4)?,
        token: row.try_get(5)?,
        granted_at: row.try_get(6)?,
        expires_at: row.try_get(7)?,
        lapses_at: row.try_get(8)?,
        discarded: row.try_get(9)?,
        last_error: row.try_get(10)?,
    })
}

fn receipt_row(row: &Row) -> Result<ReceiptRow> {
    Ok(ReceiptRow {
        attempt: row.try_get(0)?,
        token: row.try_get(1)?,
        principal: row.try_get(2)?,
        idempotency_key: row.try_get(3)?,
        artifact: row.try_get(4)?,
        digest: row.try_get(5)?,
        accepted_at: row.try_get(6)?,
        output: row.try_get(7)?,
    })
}

fn key_row(row: &Row) -> Result<KeyRow> {
    Ok(KeyRow {
        key_id: row.try_get(0)?,
        principal_id: row.try_get(1)?,
        secret_hash: row.try_get(2)?,
        label: row.try_get(3)?,
        scopes: row.try_get(4)?,
        grants: row.try_get(5)?,
        created_at: row.try_get(6)?,
        expires_at: row.try_get(7)?,
        revoked_at: row.try_get(8)?,
        kind: row.try_get(9)?,
        account: row.try_get(10)?,
        last_used_at: row.try_get(11)?,
    })
}

fn event_row(row: &Row) -> Result<EventRow> {
    Ok(EventRow {
        at: row.try_get(0)?,
        principal: row.try_get(1)?,
        namespace: row.try_get(2)?,
        action: row.try_get(3)?,
        outcome: row.try_get(4)?,
        resource: row.try_get(5)?,
        ip_hash: row.try_get(6)?,
        id: row.try_get(7)?,
    })
}

fn counter_row(row: &Row) -> Result<CounterRow> {
    Ok(CounterRow {
        minute: row.try_get(0)?,
        principal: row.try_get(1)?,
        namespace: row.try_get(2)?,
        action: row.try_get(3)?,
        outcome: row.try_get(4)?,
        count: row.try_get(5)?,
    })
}

fn version(task: &TaskRef) -> i64 {
    i64::from(task.version.as_u32())
}

impl ReadTransaction for PgTransaction<'_> {
    fn key(&self, key_id: &KeyId) -> Result<Option<StoredKey>> {
        self.query_opt(KEY_BY_KEY_ID, &[&key_id.as_str()])?
            .map(|row| key_row(&row)?.stored())
            .transpose()
    }

    fn keys(
        &self,
        principal: Option<PrincipalId>,
        after: Option<&KeyId>,
        limit: usize,
    ) -> Result<Vec<KeyInfo>> {
        let after = after.map_or("", KeyId::as_str);
        let limit = count(limit);
        let rows = match principal {
            Some(principal) => self.query(KEYS_OF_PRINCIPAL, &[&principal.0, &after, &limit])?,
            None => self.query(KEYS_ALL, &[&after, &limit])?,
        };
        rows.iter().map(|row| key_row(row)?.info()).collect()
    }

    fn principal(&self, principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>> {
        self.query_opt(PRINCIPAL_BY_ID, &[&principal.0])?
            .map(|row| {
                let kind: String = row.try_get(0)?;
                let kind = PrincipalKind::parse(&kind).ok_or_else(|| corrupt("principal kind"))?;
                Ok((kind, row.try_get(1)?))
            })
            .transpose()
    }

    fn events(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        before: Option<AuditCursor>,
        limit: usize,
    ) -> Result<Vec<(AuditCursor, AuditEvent)>> {
        let (since, limit) = (millis(since), count(limit));
        let (at, id) = before.map_or((i64::MAX, i64::MAX), |cursor| (cursor.at, cursor.id));
        let rows = match principal {
            Some(principal) => {
                self.query(EVENTS_OF_PRINCIPAL, &[&principal, &since, &limit, &at, &id])?
            }
            None => self.query(EVENTS_ALL, &[&since, &limit, &id])?,
        };
        rows.iter()
            .map(|row| {
                let row = event_row(row)?;
                Ok((row.cursor(), row.event()?))
            })
            .collect()
    }

    fn counters(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Counter>> {
        let (since, limit) = (minute_number(since), count(limit));
        let rows = match principal {
            Some(principal) => self.query(COUNTERS_OF_PRINCIPAL, &[&principal, &since, &limit])?,
            None => self.query(COUNTERS_ALL, &[&since, &limit])?,
        };
        rows.iter().map(|row| counter_row(row)?.counter()).collect()
    }

    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool> {
        Ok(self
            .query_opt(NAMESPACE_EXISTS, &[&namespace.as_str()])?
            .is_some())
    }

    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>> {
        let sql = if self.locking {
            TASK_BY_REF_LOCKED
        } else {
            TASK_BY_REF
        };
        let row = self.query_opt(
            sql,
            &[&task.namespace.as_str(), &task.id.as_str(), &version(task)],
        )?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut row = task_row(&row)?;
        if !with_brief {
            row.brief = None;
        }
        self.load(row).map(Some)
    }

    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>> {
        let row = self.query_opt(
            FIND_TASK,
            &[&task.namespace.as_str(), &task.id.as_str(), &version(task)],
        )?;
        row.map(|row| Ok(TaskHandle(row.try_get(0)?))).transpose()
    }

    /// The first entries of the claim index and the lapsed leases, each
    /// locked or skipped; the lease rules' claim order picks between them.
    fn next_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<Option<LoadedTask>> {
        let (namespace, queue, now) = (namespace.as_str(), queue.as_str(), millis(now));
        let (claimable_sql, lapsed_sql) = if self.locking {
            (NEXT_CLAIMABLE, NEXT_LAPSED)
        } else {
            (PEEK_CLAIMABLE, PEEK_LAPSED)
        };
        let indexed = self
            .query_opt(claimable_sql, &[&namespace, &queue, &now, &0_i64])?
            .as_ref()
            .map(task_row)
            .transpose()?;
        let row = rows::next_claimable(
            indexed,
            |floor| {
                let floor = i64::from(floor);
                self.query_opt(lapsed_sql, &[&namespace, &queue, &now, &floor])?
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                    .transpose()
            },
            |task| self.task_by_id(task),
        )?;
        row.map(|row| self.load(row)).transpose()
    }

    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let row = self.query_opt(
            HAS_CLAIMABLE,
            &[&namespace.as_str(), &queue.as_str(), &millis(now)],
        )?;
        Ok(match row {
            Some(row) => row.try_get(0)?,
            None => false,
        })
    }

    fn receipt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredReceipt>> {
        let row = self.query_opt(
            RECEIPT_BY_KEY,
            &[&principal.as_str(), &handle.0, &key.as_str()],
        )?;
        row.map(|row| receipt_row(&row)?.stored(task)).transpose()
    }

    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>> {
        let rows = self.query(
            RECEIPTS_OF_ATTEMPT,
            &[&handle.0, &i64::from(attempt.as_u16())],
        )?;
        self.receipts(task, rows)
    }

    fn receipts_of_task(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        limit: usize,
    ) -> Result<Vec<StoredReceipt>> {
        let rows = self.query(RECEIPTS_OF_TASK, &[&handle.0, &count(limit)])?;
        self.receipts(task, rows)
    }

    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)> {
        let by_state = self
            .query(COUNT_BY_STATE, &[&namespace.as_str()])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<(String, i64)>>>()?;
        let expired: i64 =
            match self.query_opt(COUNT_LAPSED, &[&namespace.as_str(), &millis(now)])? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
        Ok((state_counts(by_state)?, u64::try_from(expired).unwrap_or(0)))
    }

    fn tasks_by_state(
        &self,
        namespace: &Namespace,
        state: StateName,
        order: ListOrder,
        after: Option<TaskCursor>,
        limit: usize,
    ) -> Result<Vec<(TaskCursor, TaskListing)>> {
        let (sql, start) = match order {
            ListOrder::Oldest => (TASKS_BY_STATE_OLDEST, (0, 0)),
            ListOrder::Newest => (TASKS_BY_STATE_NEWEST, (i64::MAX, 0)),
        };
        // The cursor's row is the attempt's task row here.
        let (task, number) = after.map_or(start, |c| (c.row, i64::from(c.attempt)));
        self.query(
            sql,
            &[
                &namespace.as_str(),
                &state.as_str(),
                &task,
                &number,
                &count(limit),
            ],
        )?
        .iter()
        .map(|row| {
            ListingRow {
                position: row.try_get(0)?,
                number: row.try_get(1)?,
                state: row.try_get(2)?,
                until_at: row.try_get(3)?,
                discarded: row.try_get(4)?,
                tries: row.try_get(5)?,
                queue: row.try_get(6)?,
                task_id: row.try_get(7)?,
                version: row.try_get(8)?,
            }
            .listing(namespace)
        })
        .collect()
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.query_opt(META_VALUE, &[&key])?
            .map(|row| Ok(row.try_get(0)?))
            .transpose()
    }

    fn limit_count(&self, subject: &str, start: DateTime<Utc>) -> Result<u64> {
        let stored: i64 = match self.query_opt(LIMIT_COUNT, &[&subject, &millis(start)])? {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        Ok(u64::try_from(stored).unwrap_or(0))
    }
}

impl WriteTransaction for PgTransaction<'_> {
    fn reads(&self) -> &dyn ReadTransaction {
        self
    }

    fn insert_principal(
        &self,
        kind: PrincipalKind,
        account: &str,
        created_at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<PrincipalId> {
        let statement = self.statement(INSERT_PRINCIPAL)?;
        let row = self.transaction.borrow_mut().query_one(
            &statement,
            &[
                &kind.as_str(),
                &account,
                &millis(created_at),
                &purge_at.map(millis),
            ],
        )?;
        self.rows.set(self.rows.get() + 1);
        Ok(PrincipalId(row.try_get(0)?))
    }

    fn insert_key(&self, key: &NewKey<'_>) -> Result<bool> {
        let changed = self.execute(
            INSERT_KEY,
            &[
                &key.key_id.as_str(),
                &key.principal.0,
                &key.secret_hash,
                &key.label,
                &to_json(&key.scopes),
                &to_json(&key.grants),
                &millis(key.created_at),
                &key.expires_at.map(millis),
                &key.purge_at.map(millis),
            ],
        )?;
        Ok(changed == 1)
    }

    fn change_key(&self, key_id: &KeyId, change: KeyChange) -> Result<()> {
        let (sql, at) = match change {
            KeyChange::Revoke(at) => (REVOKE_KEY, at),
            KeyChange::Expire(at) => (EXPIRE_KEY, at),
        };
        self.execute(sql, &[&key_id.as_str(), &millis(at)])?;
        Ok(())
    }

    fn touch_principal(&self, principal: PrincipalId, at: DateTime<Utc>) -> Result<()> {
        self.execute(TOUCH_PRINCIPAL, &[&principal.0, &millis(at)])?;
        Ok(())
    }

    fn insert_event(&self, event: &AuditEvent) -> Result<()> {
        let row = EventRow::from_event(event);
        self.execute(
            INSERT_EVENT,
            &[
                &row.at,
                &row.principal,
                &row.namespace,
                &row.action,
                &row.outcome,
                &row.resource,
                &row.ip_hash,
            ],
        )?;
        Ok(())
    }

    fn add_counter(&self, counter: &Counter) -> Result<()> {
        let row = CounterRow::from_counter(counter);
        self.execute(
            ADD_TO_COUNTER,
            &[
                &row.minute,
                &row.principal,
                &row.namespace,
                &row.action,
                &row.outcome,
                &row.count,
            ],
        )?;
        Ok(())
    }

    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize> {
        let (sql, threshold) = match what {
            Purge::Keys => (PURGE_KEYS, millis(threshold)),
            Purge::Principals => (PURGE_PRINCIPALS, millis(threshold)),
            Purge::Limits => (PURGE_LIMITS, millis(threshold)),
            Purge::Events => (PURGE_EVENTS, millis(threshold)),
            Purge::Counters => (PURGE_COUNTERS, minute_number(threshold)),
            Purge::SessionTasks => (PURGE_SESSION_TASKS, millis(threshold)),
            Purge::Namespaces => (PURGE_NAMESPACES, millis(threshold)),
        };
        let deleted = self.execute(sql, &[&threshold, &count(limit)])?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn insert_namespace(
        &self,
        namespace: &Namespace,
        kind: NamespaceKind,
        at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let changed = self.execute(
            INSERT_NAMESPACE,
            &[
                &namespace.as_str(),
                &kind.as_str(),
                &millis(at),
                &purge_at.map(millis),
            ],
        )?;
        Ok(changed == 1)
    }

    fn insert_task(&self, task: &NewTask<'_>) -> Result<bool> {
        let (reference, record) = (task.task, task.record);
        let priority = i64::from(record.priority);
        let statement = self.statement(INSERT_TASK)?;
        let row = self.transaction.borrow_mut().query_opt(
            &statement,
            &[
                &reference.namespace.as_str(),
                &task.queue.as_str(),
                &reference.id.as_str(),
                &version(reference),
                &task.brief,
                &task.brief_format,
                &(record.attempts.len() as i64),
                &duration_millis(record.lapse_backoff),
                &millis(task.created_at),
                &task.enqueued_by,
                &i64::from(record.max_tries),
                &claimable_column(record),
                &priority,
            ],
        )?;
        let Some(row) = row else {
            return Ok(false);
        };
        self.rows.set(self.rows.get() + 1);
        let id: i64 = row.try_get(0)?;
        for attempt in &record.attempts {
            let row = AttemptRow::from_record(attempt, record.lapse_backoff);
            self.execute(
                INSERT_ATTEMPT,
                &[
                    &id,
                    &row.number,
                    &reference.namespace.as_str(),
                    &task.queue.as_str(),
                    &row.state,
                    &row.until_at,
                    &priority,
                ],
            )?;
        }
        Ok(true)
    }

    fn save_task(&self, handle: TaskHandle, before: &TaskRecord, after: &TaskRecord) -> Result<()> {
        self.write_task(handle, TaskWrites::between(before, after))
    }

    fn resync_task(&self, handle: TaskHandle, record: &TaskRecord) -> Result<()> {
        self.write_task(handle, TaskWrites::resync(record))
    }

    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>> {
        let ids = self.query(
            LAPSED_TASKS,
            &[&namespace.as_str(), &millis(now), &count(limit)],
        )?;
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            // Locked, or skipped when another process holds it.
            if let Some(row) = self.task_by_id(id.try_get(0)?)? {
                tasks.push(self.load(row)?);
            }
        }
        Ok(tasks)
    }

    fn insert_receipt(
        &self,
        handle: TaskHandle,
        receipt: &Receipt,
        output: Option<&[u8]>,
    ) -> Result<()> {
        self.execute(
            INSERT_RECEIPT,
            &[
                &handle.0,
                &i64::from(receipt.attempt.as_u16()),
                &receipt.token.as_i64(),
                &receipt.principal.as_str(),
                &receipt.idempotency_key.as_str(),
                &receipt.artifact.as_str(),
                &receipt.digest.to_string(),
                &millis(receipt.accepted_at),
                &output,
            ],
        )?;
        Ok(())
    }

    fn insert_meta(&self, key: &str, value: &str) -> Result<()> {
        self.execute(INSERT_META, &[&key, &value])?;
        Ok(())
    }

    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()> {
        self.execute(
            BUMP_LIMIT,
            &[&window.subject, &millis(window.start), &millis(window.end)],
        )?;
        Ok(())
    }

    fn signal_enqueued(&self, namespace: &Namespace, queue: &QueueName) -> Result<()> {
        let payload = format!("{namespace}\n{queue}");
        self.query_opt(NOTIFY, &[&self.channel, &payload])?;
        Ok(())
    }

    fn optional(&self, work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<()>) -> bool {
        debug_assert!(self.tail.get().is_none(), "one optional tail");
        if self.batch("SAVEPOINT optional_tail").is_err() {
            return false;
        }
        let before = self.rows.get();
        match work(self) {
            Ok(()) => {
                self.tail.set(Some(self.rows.get().saturating_sub(before)));
                true
            }
            Err(_) => {
                let _ = self.batch("ROLLBACK TO SAVEPOINT optional_tail");
                self.rows.set(before);
                false
            }
        }
    }
}

impl PgTransaction<'_> {
    fn write_task(&self, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
        let id = handle.0;
        for write in &writes.attempts {
            match write {
                AttemptWrite::State(row) => self.execute(
                    UPDATE_ATTEMPT_STATE,
                    &[
                        &id,
                        &row.number,
                        &row.state,
                        &row.until_at,
                        &row.lapses_at,
                        &row.discarded,
                        &row.last_error,
                    ],
                )?,
                AttemptWrite::Expiry(row) => self.execute(
                    EXTEND_ATTEMPT,
                    &[&id, &row.number, &row.expires_at, &row.lapses_at],
                )?,
                AttemptWrite::Whole(row) => self.execute(
                    UPDATE_ATTEMPT,
                    &[
                        &id,
                        &row.number,
                        &row.state,
                        &row.until_at,
                        &row.tries,
                        &row.holder,
                        &row.token,
                        &row.granted_at,
                        &row.expires_at,
                        &row.lapses_at,
                        &row.discarded,
                        &row.last_error,
                    ],
                )?,
            };
        }
        match (writes.last_token, writes.claimable_at) {
            (Some(token), Some(claimable)) => {
                self.execute(UPDATE_TASK, &[&id, &token, &claimable])?
            }
            (Some(token), None) => self.execute(UPDATE_TOKEN, &[&id, &token])?,
            (None, Some(claimable)) => self.execute(UPDATE_CLAIMABLE, &[&id, &claimable])?,
            (None, None) => 0,
        };
        if let Some(max_tries) = writes.max_tries {
            self.execute(UPDATE_MAX_TRIES, &[&id, &max_tries])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use postgres::types::ToSql;
    use postgres::{Client, NoTls};

    use super::*;
    use crate::postgres::PostgresOptions;
    use crate::{Store, StoreConfig};

    /// Every claim, listing and audit-page statement searches an index (with
    /// sequential scans priced out, as on a table too large to scan), and
    /// the claim statements search the claim indexes once per priority.
    #[test]
    fn claim_listing_and_audit_statements_search_their_indexes() {
        let Ok(url) = std::env::var("TESSERA_TEST_POSTGRES_URL") else {
            println!("skipping: TESSERA_TEST_POSTGRES_URL is not set");
            return;
        };
        let schema = format!("plans_{}", std::process::id());
        let options = PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
        drop(Store::open_postgres(options, StoreConfig::default()).unwrap());
        let mut client = Client::connect(&url, NoTls).unwrap();
        client
            .batch_execute(&format!(
                "SET search_path TO \"{schema}\"; SET enable_seqscan = off;"
            ))
            .unwrap();
        let (ns, queue, state) = ("renders", "jobs", "ready");
        let (now, zero, limit, big) = (1_i64, 0_i64, 10_i64, i64::MAX);
        let claim: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now, &zero];
        let probe: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now];
        let listing: &[&(dyn ToSql + Sync)] = &[&ns, &state, &zero, &zero, &limit];
        let principal = "p1";
        let mine: &[&(dyn ToSql + Sync)] = &[&principal, &zero, &limit, &big, &big];
        let all: &[&(dyn ToSql + Sync)] = &[&zero, &limit, &big];
        let cases: [(&str, &str, Params<'_>, &str, usize); 8] = [
            (
                "next claimable",
                NEXT_CLAIMABLE,
                claim,
                "tasks_claim_order",
                4,
            ),
            (
                "peek claimable",
                PEEK_CLAIMABLE,
                claim,
                "tasks_claim_order",
                4,
            ),
            ("next lapsed", NEXT_LAPSED, claim, "attempts_lapsing", 4),
            ("has claimable", HAS_CLAIMABLE, probe, "attempts_lapsing", 4),
            (
                "listing, oldest",
                TASKS_BY_STATE_OLDEST,
                listing,
                "attempts_by_state",
                1,
            ),
            (
                "listing, newest",
                TASKS_BY_STATE_NEWEST,
                listing,
                "attempts_by_state",
                1,
            ),
            (
                "one principal's audit",
                EVENTS_OF_PRINCIPAL,
                mine,
                "access_audit_by_principal",
                1,
            ),
            ("everyone's audit", EVENTS_ALL, all, "access_audit_pkey", 1),
        ];
        let mut failures = Vec::new();
        for (name, sql, params, index, searches) in cases {
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN {sql}"), params)
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            let plan = plan.join("\n");
            let found = plan.matches(&format!("using {index}")).count();
            // A sort above the search would read every row the range holds;
            // an incremental one sorts only the rows of one time.
            let sorts = plan.matches("Sort").count() - plan.matches("Incremental Sort").count();
            if plan.contains("Seq Scan") || found < searches || sorts > 0 {
                failures.push(format!(
                    "{name}: {searches} searches of {index} wanted\n{plan}"
                ));
            }
        }
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .unwrap();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}
