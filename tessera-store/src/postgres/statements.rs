//! The SQL text of the PostgreSQL transactions, one constant a statement.
//!
//! Every time is a parameter (Unix milliseconds from the store's clock),
//! never the server's `now()`.

/// A task row's columns, in [`task_row`](super::rows::task_row) order.
macro_rules! task_columns {
    () => {
        "id, queue, task_id, version, brief, brief_format, lapse_backoff_ms, last_token, \
         claimable_at, created_at, max_tries, priority, partition_key, unique_key, unique_states, \
         lease_ms, deadline_at"
    };
}

pub(super) const TASK_BY_REF: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3"
);
pub(super) const TASK_BY_REF_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3 FOR UPDATE"
);
pub(super) const TASK_BY_ID: &str =
    concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1");
pub(super) const TASK_BY_ID_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE id = $1 FOR UPDATE SKIP LOCKED"
);
pub(super) const FIND_TASK: &str =
    "SELECT id FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3";
/// A queue's claimable tasks, as each priority's turn selects them.
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
/// `$select` (a statement ending in its `WHERE` conditions) once per task
/// priority, highest first, from the floor `$floor` up, each turn `$order`
/// (an `ORDER BY`, a `LIMIT` and any locking clause); the first row found
/// (or the first `$limit`, when given) ends the statement. One lateral subquery the plan runs again for each
/// priority, so the plan holds one index search, not one an arm: the
/// executor's start-up, paid on every run, is a quarter of
/// one arm a priority's (as SQLite's statements spell it).
macro_rules! each_priority {
    ($select:expr, $order:expr, $floor:expr) => {
        each_priority!($select, $order, $floor, "1")
    };
    ($select:expr, $order:expr, $floor:expr, $limit:expr) => {
        concat!(
            "SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (",
            $select,
            " AND priority = each.level ",
            $order,
            ") AS turn WHERE each.level >= ",
            $floor,
            " LIMIT ",
            $limit
        )
    };
}

// `each_priority!` spells out every priority.
const _: () = assert!(tessera_lease::MAX_PRIORITY == 3);
/// A queue's lapsed leases, as each priority's turn selects them.
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
pub(super) const NEXT_CLAIMABLE: &str = each_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// [`NEXT_CLAIMABLE`] without taking it, for a read.
pub(super) const PEEK_CLAIMABLE: &str = each_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1",
    "$4::bigint"
);
/// [`NEXT_LAPSED`] without taking it, for a read.
pub(super) const PEEK_LAPSED: &str = each_priority!(
    lapsed_leases!(),
    "ORDER BY lapses_at, task LIMIT 1",
    "$4::bigint"
);
/// The lease of a queue that lapsed first, from priority `$4` up, its
/// attempt locked.
pub(super) const NEXT_LAPSED: &str = each_priority!(
    lapsed_leases!(),
    "ORDER BY lapses_at, task LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// Index searches only, at most one per priority and index.
pub(super) const HAS_CLAIMABLE: &str = concat!(
    "SELECT EXISTS (",
    each_priority!(
        "SELECT 1 FROM tasks WHERE namespace = $1 AND queue = $2 \
         AND claimable_at IS NOT NULL AND claimable_at <= $3",
        "LIMIT 1",
        "0"
    ),
    ") OR EXISTS (",
    each_priority!(
        "SELECT 1 FROM attempts WHERE namespace = $1 AND queue = $2 \
         AND state = 'leased' AND lapses_at <= $3",
        "ORDER BY lapses_at LIMIT 1",
        "0"
    ),
    ")"
);
pub(super) const ATTEMPTS_OF_TASK: &str = "SELECT number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error FROM attempts WHERE task = $1 \
     ORDER BY number";
pub(super) const INSERT_NAMESPACE: &str = "INSERT INTO namespaces (name, kind, created_at, purge_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";
pub(super) const NAMESPACE_EXISTS: &str = "SELECT 1 FROM namespaces WHERE name = $1";
pub(super) const INSERT_TASK: &str = "INSERT INTO tasks (namespace, queue, task_id, version, brief, \
     brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority, partition_key, unique_key, unique_slot, unique_states, \
     lease_ms, deadline_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11, 0, $12, $9, $10, $13, $14, $15, $16, $17, \
     $18, $19) \
     ON CONFLICT (namespace, task_id, version) DO NOTHING RETURNING id";
/// Takes a unique slot unless it is held; waits for a transaction that is
/// taking it.
pub(super) const TAKE_UNIQUE_SLOT: &str = "INSERT INTO unique_slots \
     (namespace, queue, slot, task_id, version, ends_at) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (namespace, queue, slot) DO NOTHING";
/// Up to `$2` unique slots whose window ended at or before `$1`, oldest
/// first: one range of the partial `unique_slots_ending` index.
pub(super) const PURGE_ENDED_SLOTS: &str = "DELETE FROM unique_slots WHERE (namespace, queue, slot) \
     IN (SELECT namespace, queue, slot FROM unique_slots WHERE ends_at IS NOT NULL \
     AND ends_at <= $1 ORDER BY ends_at LIMIT $2)";
pub(super) const UNIQUE_SLOT_HOLDER: &str = "SELECT task_id, version FROM unique_slots \
     WHERE namespace = $1 AND queue = $2 AND slot = $3";
pub(super) const FREE_UNIQUE_SLOT: &str =
    "DELETE FROM unique_slots WHERE namespace = $1 AND queue = $2 AND slot = $3";
/// A task's slot row and its slot columns, in one statement.
/// (Every part reads the statement's snapshot, so `held` sees the slot
/// `cleared` sets to `NULL`.)
pub(super) const RELEASE_UNIQUE_SLOT: &str = "WITH held AS (SELECT namespace, queue, \
     unique_slot AS slot FROM tasks WHERE id = $1 AND unique_slot IS NOT NULL), \
     cleared AS (UPDATE tasks SET unique_slot = NULL, unique_states = NULL \
     WHERE id = $1 AND unique_slot IS NOT NULL RETURNING 1) \
     DELETE FROM unique_slots s USING held h \
     WHERE s.namespace = h.namespace AND s.queue = h.queue AND s.slot = h.slot";
pub(super) const REPLACE_BRIEF: &str =
    "UPDATE tasks SET brief = $2, brief_format = $3 WHERE id = $1";
pub(super) const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task, number, namespace, queue, state, \
     until_at, tries, priority, changed_at) VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8)";
pub(super) const UPDATE_ATTEMPT: &str = "UPDATE attempts SET state = $3, until_at = $4, tries = $5, \
     holder = $6, token = $7, granted_at = $8, expires_at = $9, lapses_at = $10, \
     discarded = $11, last_error = $12, changed_at = coalesce($13, changed_at) \
     WHERE task = $1 AND number = $2";
pub(super) const UPDATE_ATTEMPT_STATE: &str = "UPDATE attempts SET state = $3, until_at = $4, \
     lapses_at = $5, discarded = $6, last_error = $7, changed_at = coalesce($8, changed_at) \
     WHERE task = $1 AND number = $2";
pub(super) const EXTEND_ATTEMPT: &str = "UPDATE attempts SET expires_at = $3, lapses_at = $4 \
     WHERE task = $1 AND number = $2";
/// [`EXTEND_ATTEMPT`] with the progress value a heartbeat carried.
pub(super) const EXTEND_ATTEMPT_PROGRESS: &str = "UPDATE attempts SET expires_at = $3, \
     lapses_at = $4, progress = $5 WHERE task = $1 AND number = $2";
/// An attempt's progress value alone (a heartbeat that moved no expiry).
pub(super) const UPDATE_PROGRESS: &str =
    "UPDATE attempts SET progress = $3 WHERE task = $1 AND number = $2";
/// The progress values of a task's attempts, in number order.
pub(super) const PROGRESS_OF_TASK: &str = "SELECT number, progress FROM attempts \
     WHERE task = $1 AND progress IS NOT NULL ORDER BY number";
/// A namespace's attempts after position ($2, $3, $4) in (changed_at,
/// task, number) order, whose state changed at or before $5, of queue $6,
/// in state $7 and of partition key $9 where those are set, each with its
/// task's reference: one range of `attempts_changed`.
pub(super) const ATTEMPTS_MATCHING: &str = "SELECT a.changed_at, a.task, a.number, \
     t.task_id, t.version FROM attempts a JOIN tasks t ON t.id = a.task \
     WHERE a.namespace = $1 AND (a.changed_at, a.task, a.number) > ($2, $3, $4) \
     AND a.changed_at <= $5 AND ($6::text IS NULL OR a.queue = $6) \
     AND ($7::text IS NULL OR a.state = $7) \
     AND ($9::text IS NULL OR t.partition_key = $9) \
     ORDER BY a.changed_at, a.task, a.number LIMIT $8";
pub(super) const UPDATE_TASK: &str =
    "UPDATE tasks SET last_token = $2, claimable_at = $3 WHERE id = $1";
pub(super) const UPDATE_TOKEN: &str = "UPDATE tasks SET last_token = $2 WHERE id = $1";
pub(super) const UPDATE_MAX_TRIES: &str = "UPDATE tasks SET max_tries = $2 WHERE id = $1";
pub(super) const UPDATE_CLAIMABLE: &str = "UPDATE tasks SET claimable_at = $2 WHERE id = $1";
/// Tasks with an expired lease, each once, locked or skipped.
pub(super) const LAPSED_TASKS: &str = "SELECT DISTINCT task FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2 LIMIT $3";
/// [`LAPSED_TASKS`] of one queue (`$4`), the longest expired first: a
/// claim of a limited queue records its own lapses, whatever other queues
/// of the namespace hold. A task with several lapsed attempts may be
/// listed once per attempt.
pub(super) const LAPSED_IN_QUEUE: &str = "SELECT task FROM attempts \
     WHERE namespace = $1 AND queue = $4 AND state = 'leased' AND expires_at <= $2 \
     ORDER BY expires_at, task LIMIT $3";
/// A listing's columns and join, in [`ListingRow`] order, of the state
/// `$2`, which `$state` (a comparison with `'leased'`) says is leased or
/// not, so the planner knows which index holds it.
macro_rules! select_listing {
    ($state:literal, $tail:expr) => {
        concat!(
            "SELECT a.task, a.number, a.state, a.until_at, a.discarded, a.tries, ",
            "t.queue, t.task_id, t.version, t.partition_key, a.progress ",
            "FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = $1 AND a.state = $2 AND a.state ",
            $state,
            " ",
            $tail
        )
    };
}
/// A listing's page after ($3, $4), oldest first.
macro_rules! oldest_first {
    () => {
        "AND (a.task, a.number) > ($3, $4) ORDER BY a.task, a.number LIMIT $5"
    };
}
/// A listing's page before ($3, $4), newest first.
macro_rules! newest_first {
    () => {
        "AND (a.task, a.number) < ($3, $4) ORDER BY a.task DESC, a.number DESC LIMIT $5"
    };
}
/// A namespace's attempts in one state other than leased after ($3, $4),
/// oldest first: one search of `attempts_at_rest`.
pub(super) const TASKS_BY_STATE_OLDEST: &str = select_listing!("<> 'leased'", oldest_first!());
/// [`TASKS_BY_STATE_OLDEST`] newest first, before ($3, $4).
pub(super) const TASKS_BY_STATE_NEWEST: &str = select_listing!("<> 'leased'", newest_first!());
/// [`TASKS_BY_STATE_OLDEST`] of the leased attempts (`$2` is `leased`):
/// those of the namespace in `attempts_lapse_order`, sorted. They are the
/// leases in flight, so the sort is of a bounded few.
pub(super) const LEASED_OLDEST: &str = select_listing!("= 'leased'", oldest_first!());
/// [`LEASED_OLDEST`] newest first, before ($3, $4).
pub(super) const LEASED_NEWEST: &str = select_listing!("= 'leased'", newest_first!());
/// A namespace's attempts counted by state: the leased ones from
/// `attempts_lapse_order`, the rest from `attempts_at_rest`.
pub(super) const COUNT_BY_STATE: &str = "SELECT state, count(*) FROM attempts \
     WHERE namespace = $1 AND state <> 'leased' GROUP BY state \
     UNION ALL SELECT 'leased', count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' HAVING count(*) > 0";
/// Per queue: claim-order entries claimable at `$2`, and later.
pub(super) const QUEUE_CLAIMABLE: &str = "SELECT queue, \
     count(*) FILTER (WHERE claimable_at <= $2), count(*) FILTER (WHERE claimable_at > $2) \
     FROM tasks WHERE namespace = $1 AND claimable_at IS NOT NULL GROUP BY queue";
/// Per queue: live and lapsed leases.
pub(super) const QUEUE_LEASED: &str = "SELECT queue, count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' GROUP BY queue";
pub(super) const COUNT_LAPSED: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2";
/// A receipt row's columns, in [`receipt_row`] order.
macro_rules! receipt_columns {
    () => {
        "attempt, token, principal, idempotency_key, artifact, digest, accepted_at, output"
    };
}
pub(super) const INSERT_RECEIPT: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
pub(super) const RECEIPT_BY_KEY: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE principal = $1 AND task = $2 AND idempotency_key = $3"
);
pub(super) const RECEIPTS_OF_ATTEMPT: &str = concat!(
    "SELECT ",
    receipt_columns!(),
    " FROM receipts WHERE task = $1 AND attempt = $2 ORDER BY id"
);
pub(super) const RECEIPTS_OF_TASK: &str = concat!(
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
pub(super) const KEY_BY_KEY_ID: &str = concat!("SELECT ", key_columns!(), " WHERE k.key_id = $1");
pub(super) const KEYS_OF_PRINCIPAL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.principal_id = $1 AND k.key_id > $2 ORDER BY k.key_id LIMIT $3"
);
pub(super) const KEYS_ALL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.key_id > $1 ORDER BY k.key_id LIMIT $2"
);
pub(super) const PRINCIPAL_BY_ID: &str =
    "SELECT kind, account FROM access_principals WHERE id = $1";
pub(super) const INSERT_PRINCIPAL: &str = "INSERT INTO access_principals \
     (kind, account, created_at, purge_at) VALUES ($1, $2, $3, $4) RETURNING id";
pub(super) const INSERT_KEY: &str = "INSERT INTO access_keys (key_id, principal_id, secret_hash, label, \
     scopes, grants, created_at, expires_at, purge_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key_id) DO NOTHING";
pub(super) const REVOKE_KEY: &str = "UPDATE access_keys SET revoked_at = $2 WHERE key_id = $1";
pub(super) const EXPIRE_KEY: &str = "UPDATE access_keys SET expires_at = $2 WHERE key_id = $1";
pub(super) const TOUCH_PRINCIPAL: &str =
    "UPDATE access_principals SET last_used_at = GREATEST(last_used_at, $2) WHERE id = $1";
pub(super) const INSERT_EVENT: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
pub(super) const ADD_TO_COUNTER: &str = "INSERT INTO access_counters \
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
pub(super) const EVENTS_OF_PRINCIPAL: &str = concat!(
    event_columns!(),
    "WHERE principal = $1 AND at >= $2 AND at <= $4 AND (at, id) < ($4, $5) \
     ORDER BY at DESC, id DESC LIMIT $3"
);
/// Every event at or after `$1`, newest written first, below the cursor's
/// row id `$3`: a backward range of the primary key, as SQLite reads its
/// row ids, so a page reads no row it does not return.
pub(super) const EVENTS_ALL: &str = concat!(
    event_columns!(),
    "WHERE at >= $1 AND id < $3 ORDER BY id DESC LIMIT $2"
);
macro_rules! counter_columns {
    () => {
        "SELECT minute, principal, namespace, action, outcome, count FROM access_counters "
    };
}
pub(super) const COUNTERS_OF_PRINCIPAL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $2 AND principal = $1 ORDER BY minute DESC LIMIT $3"
);
pub(super) const COUNTERS_ALL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $1 ORDER BY minute DESC LIMIT $2"
);
// Retention batches: each process deletes rows no other is deleting.
/// The oldest events, below row id `$1` (the first at or after the cutoff
/// `$2`, see [`first_event_at_or_after`](crate::backend::rows::first_event_at_or_after))
/// and older than the cutoff, at most `$3`: a range of the primary key
/// from its start.
pub(super) const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN (SELECT id FROM access_audit \
     WHERE id < $1 AND at < $2 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED)";
/// The first event with a row id at or after `$1`.
pub(super) const EVENT_FROM: &str =
    "SELECT id, at FROM access_audit WHERE id >= $1 ORDER BY id LIMIT 1";
/// The lowest and highest event row ids.
pub(super) const EVENT_SPAN: &str =
    "SELECT (SELECT min(id) FROM access_audit), (SELECT max(id) FROM access_audit)";
pub(super) const PURGE_COUNTERS: &str = "DELETE FROM access_counters \
     WHERE (minute, principal, namespace, action, outcome) IN \
     (SELECT minute, principal, namespace, action, outcome FROM access_counters \
     WHERE minute < $1 ORDER BY minute LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub(super) const PURGE_KEYS: &str = "DELETE FROM access_keys WHERE id IN (SELECT id FROM access_keys \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
pub(super) const PURGE_PRINCIPALS: &str = "DELETE FROM access_principals WHERE id IN \
     (SELECT id FROM access_principals WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub(super) const PURGE_LIMITS: &str = "DELETE FROM access_limits WHERE id IN (SELECT id FROM access_limits \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
/// A batch of purged sessions' tasks, locked or skipped, deleted with
/// their receipts and attempts in one statement.
pub(super) const PURGE_SESSION_TASKS: &str = "WITH doomed AS (SELECT t.id FROM namespaces n \
     JOIN tasks t ON t.namespace = n.name WHERE n.purge_at IS NOT NULL AND n.purge_at <= $1 \
     ORDER BY t.id LIMIT $2 FOR UPDATE OF t SKIP LOCKED), \
     receipts_gone AS (DELETE FROM receipts WHERE task IN (SELECT id FROM doomed)), \
     attempts_gone AS (DELETE FROM attempts WHERE task IN (SELECT id FROM doomed)) \
     DELETE FROM tasks WHERE id IN (SELECT id FROM doomed)";
/// A batch of purged sessions' namespaces, locked or skipped: one an
/// enqueue holds ([`LOCK_NAMESPACE`]) waits for a later batch. Their tasks
/// are counted by [`PURGE_EMPTY_NAMESPACES`], a later statement, which sees
/// every enqueue committed before these locks were taken.
pub(super) const LOCK_PURGED_NAMESPACES: &str = "SELECT id FROM namespaces \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED";
/// The namespaces of `$1` ([`LOCK_PURGED_NAMESPACES`]) that hold no task.
pub(super) const PURGE_EMPTY_NAMESPACES: &str = "DELETE FROM namespaces WHERE id = ANY($1) \
     AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.namespace = namespaces.name)";
/// A session namespace's row, held while an enqueue writes into it, so a
/// purge passes it over until the enqueue commits; nothing if it is gone.
pub(super) const LOCK_NAMESPACE: &str = "SELECT 1 FROM namespaces WHERE name = $1 FOR KEY SHARE";
pub(super) const META_VALUE: &str = "SELECT value FROM tessera_meta WHERE key = $1";
pub(super) const INSERT_META: &str =
    "INSERT INTO tessera_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";
pub(super) const LIMIT_COUNT: &str =
    "SELECT count FROM access_limits WHERE subject = $1 AND window_start = $2";
pub(super) const BUMP_LIMIT: &str = "INSERT INTO access_limits (subject, window_start, count, purge_at) \
     VALUES ($1, $2, 1, $3) ON CONFLICT (subject, window_start) \
     DO UPDATE SET count = access_limits.count + 1";
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
pub(super) const QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, partition_limit \
     FROM queue_settings WHERE namespace = $1 AND queue = $2";
/// [`QUEUE_SETTINGS`] locked for the rest of a write transaction: claims of
/// a configured queue count its leases one at a time.
pub(super) const QUEUE_SETTINGS_LOCKED: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = $1 AND queue = $2 FOR UPDATE";
pub(super) const NAMESPACE_QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = $1 ORDER BY queue";
pub(super) const PUT_QUEUE_SETTINGS: &str = "INSERT INTO queue_settings \
     (namespace, queue, paused_at, queue_limit, partition_limit, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     paused_at = excluded.paused_at, queue_limit = excluded.queue_limit, \
     partition_limit = excluded.partition_limit, updated_at = excluded.updated_at";
/// Attempts of namespace `$6` in state `$1` that reached it at or before
/// `$2`, after `($3, $4)` in (changed_at, task) order, at most `$5`: one
/// range of `attempts_changed`, the state read beside it.
pub(super) const FINISHED_ATTEMPTS: &str = "SELECT changed_at, task FROM attempts \
     WHERE namespace = $6 AND (changed_at, task) > ($3, $4) AND changed_at <= $2 \
     AND state = $1 ORDER BY changed_at, task LIMIT $5";
/// A page of namespace names, after `$1`, at most `$2`.
pub(super) const NAMESPACE_NAMES: &str =
    "SELECT name FROM namespaces WHERE name > $1 ORDER BY name LIMIT $2";
/// The tasks of `$1` no other transaction holds, locked.
pub(super) const LOCK_FINISHED: &str = "SELECT id, namespace, queue FROM tasks \
     WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED";
/// The attempts of the tasks of `$1`: state and when it was reached.
pub(super) const ATTEMPT_ENDS: &str =
    "SELECT task, state, changed_at FROM attempts WHERE task = ANY($1) ORDER BY task, number";
/// Deletes the tasks of `$1` with their receipts, attempts and unique
/// slot; answers the rows deleted.
pub(super) const DELETE_TASKS: &str = "WITH gone AS (SELECT id, namespace, queue, task_id, \
     unique_slot FROM tasks WHERE id = ANY($1)), \
     r AS (DELETE FROM receipts WHERE task IN (SELECT id FROM gone) RETURNING 1), \
     a AS (DELETE FROM attempts WHERE task IN (SELECT id FROM gone) RETURNING 1), \
     u AS (DELETE FROM unique_slots s USING gone g WHERE g.unique_slot IS NOT NULL \
     AND s.namespace = g.namespace AND s.queue = g.queue AND s.slot = g.unique_slot \
     AND s.task_id = g.task_id RETURNING 1), \
     t AS (DELETE FROM tasks WHERE id IN (SELECT id FROM gone) RETURNING 1) \
     SELECT (SELECT count(*) FROM r) + (SELECT count(*) FROM a) + (SELECT count(*) FROM u) \
     + (SELECT count(*) FROM t)";
/// A row's lock by name, held to the transaction's end (see
/// [`RowLock`](crate::backend::RowLock)).
pub(super) const LOCK_ROW: &str = "SELECT pg_advisory_xact_lock(hashtext('tessera row ' || $1))";
/// A queue's own keep times.
pub(super) const QUEUE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, cancelled_ms \
     FROM queue_retention WHERE namespace = $1 AND queue = $2";
/// Every queue of a namespace with keep times of its own.
pub(super) const NAMESPACE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, \
     cancelled_ms FROM queue_retention WHERE namespace = $1 ORDER BY queue";
/// Stores a queue's keep times.
pub(super) const PUT_QUEUE_RETENTION: &str = "INSERT INTO queue_retention \
     (namespace, queue, done_ms, discarded_ms, cancelled_ms, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     done_ms = excluded.done_ms, discarded_ms = excluded.discarded_ms, \
     cancelled_ms = excluded.cancelled_ms, updated_at = excluded.updated_at";
/// Deletes a queue's keep times: the store's apply again.
pub(super) const DELETE_QUEUE_RETENTION: &str =
    "DELETE FROM queue_retention WHERE namespace = $1 AND queue = $2";
pub(super) const DELETE_QUEUE_SETTINGS: &str =
    "DELETE FROM queue_settings WHERE namespace = $1 AND queue = $2";
/// The leased attempts of one partition of a queue.
pub(super) const LEASED_IN_PARTITION: &str = "SELECT count(*) FROM attempts a \
     JOIN tasks t ON t.id = a.task WHERE a.namespace = $1 AND a.queue = $2 \
     AND a.state = 'leased' AND t.partition_key = $3";
/// A priority's due entries of `tasks_claim_order`, in its order.
pub(super) const CANDIDATE_TASKS: &str = "SELECT id, claimable_at FROM tasks \
     WHERE namespace = $1 AND queue = $2 AND priority = $3 AND claimable_at IS NOT NULL \
     AND claimable_at <= $4 ORDER BY claimable_at, id LIMIT $5";
/// A priority's due lapsed leases from `attempts_lapse_order`, in its order.
pub(super) const CANDIDATE_LAPSED: &str = "SELECT task, lapses_at FROM attempts \
     WHERE namespace = $1 AND queue = $2 AND priority = $3 AND state = 'leased' \
     AND lapses_at <= $4 ORDER BY lapses_at, task LIMIT $5";
/// The leased attempts of a queue, from `attempts_lapse_order`.
pub(super) const LEASED_IN_QUEUE: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = $1 AND queue = $2 AND state = 'leased'";

#[cfg(test)]
mod tests {
    use postgres::types::ToSql;
    use postgres::{Client, NoTls};

    use super::*;
    use crate::postgres::PostgresOptions;
    use crate::postgres::claim::CLAIM_ONE;
    use crate::postgres::coalesce::SUBMIT_AND_CLAIM_MANY;

    type Params<'a> = &'a [&'a (dyn ToSql + Sync)];
    use crate::{Store, StoreConfig};

    /// A new Tessera schema named from `prefix` on the test server, and a
    /// client whose search path is that schema.
    fn fresh_schema(prefix: &str) -> (Client, String) {
        let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
            .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
        let schema = format!("{prefix}_{}", std::process::id());
        let options = PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
        drop(Store::open_postgres(options, StoreConfig::default()).unwrap());
        let mut client = Client::connect(&url, NoTls).unwrap();
        client
            .batch_execute(&format!("SET search_path TO \"{schema}\""))
            .unwrap();
        (client, schema)
    }

    /// Every claim, listing and audit-page statement searches an index (with
    /// sequential scans priced out, as on a table too large to scan), and
    /// the claim statements search the claim indexes once per priority.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn claim_listing_and_audit_statements_search_their_indexes() {
        let (mut client, schema) = fresh_schema("plans");
        client.batch_execute("SET enable_seqscan = off").unwrap();
        let (ns, queue, state) = ("renders", "jobs", "ready");
        let (now, zero, limit, big) = (1_i64, 0_i64, 10_i64, i64::MAX);
        let claim: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now, &zero];
        let probe: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now];
        let listing: &[&(dyn ToSql + Sync)] = &[&ns, &state, &zero, &zero, &limit];
        let principal = "p1";
        let mine: &[&(dyn ToSql + Sync)] = &[&principal, &zero, &limit, &big, &big];
        let all: &[&(dyn ToSql + Sync)] = &[&zero, &limit, &big];
        let (no_queue, some_state) = (None::<&str>, Some(state));
        let bulk: &[&(dyn ToSql + Sync)] = &[
            &ns,
            &zero,
            &zero,
            &zero,
            &big,
            &no_queue,
            &some_state,
            &limit,
            &no_queue,
        ];
        let cases: [(&str, &str, Params<'_>, &str, usize); 9] = [
            (
                "attempts matching a bulk filter",
                ATTEMPTS_MATCHING,
                bulk,
                "attempts_changed",
                1,
            ),
            (
                "next claimable",
                NEXT_CLAIMABLE,
                claim,
                "tasks_claim_order",
                1,
            ),
            (
                "peek claimable",
                PEEK_CLAIMABLE,
                claim,
                "tasks_claim_order",
                1,
            ),
            ("next lapsed", NEXT_LAPSED, claim, "attempts_lapse_order", 1),
            (
                "has claimable",
                HAS_CLAIMABLE,
                probe,
                "attempts_lapse_order",
                1,
            ),
            (
                "listing, oldest",
                TASKS_BY_STATE_OLDEST,
                listing,
                "attempts_at_rest",
                1,
            ),
            (
                "listing, newest",
                TASKS_BY_STATE_NEWEST,
                listing,
                "attempts_at_rest",
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
            // A search run again for each priority bounds it by the
            // priority, so it never walks another priority's entries.
            let per_priority =
                !sql.contains("each(level)") || plan.contains("(priority = \"*VALUES*\".column1)");
            if plan.contains("Seq Scan") || found < searches || sorts > 0 || !per_priority {
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

    /// With few leases among many attempts in the statistics, as on a
    /// queue with a long history, every search of leased attempts reads
    /// `attempts_lapse_order`, never the listing index: a search there
    /// would walk, on every claim, the entry each ended lease leaves in
    /// it until a vacuum.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn lease_searches_read_the_lapse_index_when_leases_are_rare() {
        let (mut client, schema) = fresh_schema("rare_leases");
        client
            .batch_execute(
                "INSERT INTO attempts (task, number, namespace, queue, state, tries, holder, \
                 token, granted_at, expires_at, lapses_at, changed_at) \
                 SELECT n, 1, 'renders', 'jobs', CASE WHEN n <= 8 THEN 'leased' ELSE 'done' END, \
                 1, 'p1', 1, 1, 10, 10, 1 FROM generate_series(1, 20000) AS n; \
                 ANALYZE attempts; SET plan_cache_mode = force_generic_plan;",
            )
            .unwrap();
        // Generic plans, as the prepared statements run; each case's
        // arguments are its parameters' values.
        let claim = "'renders', 'jobs', 5, 'p1', 5, 'p1', 'renders', 'claim', 'ok', NULL";
        let cases = [
            ("a claim in one statement", CLAIM_ONE, claim),
            ("next lapsed", NEXT_LAPSED, "'renders', 'jobs', 5, 0"),
            ("has claimable", HAS_CLAIMABLE, "'renders', 'jobs', 5"),
            ("expired leases", LAPSED_TASKS, "'renders', 5, 10"),
            (
                "expired leases of a queue",
                LAPSED_IN_QUEUE,
                "'renders', 5, 10, 'jobs'",
            ),
            ("expired leases, counted", COUNT_LAPSED, "'renders', 5"),
            ("leases of a queue", LEASED_IN_QUEUE, "'renders', 'jobs'"),
            (
                "leased, oldest",
                LEASED_OLDEST,
                "'renders', 'leased', 0, 0, 10",
            ),
            (
                "leased, newest",
                LEASED_NEWEST,
                "'renders', 'leased', 9223372036854775807, 0, 10",
            ),
            ("counts by state", COUNT_BY_STATE, "'renders'"),
            ("queue depth, leased", QUEUE_LEASED, "'renders'"),
        ];
        let mut failures = Vec::new();
        for (n, (name, sql, arguments)) in cases.into_iter().enumerate() {
            client
                .batch_execute(&format!("PREPARE search_{n} AS {sql}"))
                .unwrap();
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN EXECUTE search_{n}({arguments})"), &[])
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            let plan = plan.join("\n");
            if !plan.contains("using attempts_lapse_order") {
                failures.push(format!("{name}: attempts_lapse_order wanted\n{plan}"));
            }
        }
        // Retention's search of one namespace's final state is one range
        // of `attempts_changed`, in a generic plan too.
        client
            .batch_execute(&format!("PREPARE finished AS {FINISHED_ATTEMPTS}"))
            .unwrap();
        let plan: Vec<String> = client
            .query(
                "EXPLAIN EXECUTE finished('done', 5, 0, 0, 10, 'renders')",
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        if !plan.contains("using attempts_changed") {
            failures.push(format!(
                "finished attempts: attempts_changed wanted\n{plan}"
            ));
        }
        // A queue depth reads the claim order, not the tasks.
        client
            .batch_execute(&format!("PREPARE depth AS {QUEUE_CLAIMABLE}"))
            .unwrap();
        let plan: Vec<String> = client
            .query("EXPLAIN EXECUTE depth('renders', 5)", &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        if !plan.contains("using tasks_claim_order") {
            failures.push(format!("queue depth: tasks_claim_order wanted\n{plan}"));
        }
        // And the slots whose window ended are one range of theirs.
        client
            .batch_execute(&format!("PREPARE ended AS {PURGE_ENDED_SLOTS}"))
            .unwrap();
        let plan: Vec<String> = client
            .query("EXPLAIN EXECUTE ended(5, 500)", &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        if !plan.contains("using unique_slots_ending") {
            failures.push(format!("ended slots: unique_slots_ending wanted\n{plan}"));
        }
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .unwrap();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    /// On a queue with a history (20,000 tasks, 10,000 receipts), both
    /// the custom plans a prepared statement starts with and the generic
    /// plan it keeps find the rows of [`SUBMIT_AND_CLAIM_MANY`] through
    /// indexes: no plan reads a whole table to lock a few attempts.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn coalesced_submissions_search_their_indexes_in_every_plan() {
        let (mut client, schema) = fresh_schema("many_plans");
        client
            .batch_execute(
                "INSERT INTO tasks (namespace, queue, task_id, version, brief, brief_format, \
                 alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, created_at, \
                 enqueued_by, priority) SELECT 'renders', 'jobs', 't-' || n, 1, '\\x00', 'bytes', \
                 1, 0, 20, 0, 0, 0, 'p1', 0 FROM generate_series(1, 20000) AS n; \
                 INSERT INTO attempts (task, number, namespace, queue, state, tries, priority, \
                 changed_at) SELECT id, 1, 'renders', 'jobs', 'ready', 0, 0, 0 FROM tasks; \
                 INSERT INTO receipts (task, attempt, token, principal, idempotency_key, \
                 artifact, digest, accepted_at) SELECT id, 1, 1, 'p1', 'k' || id, 'a', 'd', 0 \
                 FROM tasks WHERE id % 2 = 0; ANALYZE tasks; ANALYZE attempts; ANALYZE receipts;",
            )
            .unwrap();
        client
            .batch_execute(&format!("PREPARE many AS {SUBMIT_AND_CLAIM_MANY}"))
            .unwrap();
        let four = |value: &str| format!("'{{{value},{value},{value},{value}}}'");
        let arguments = [
            "'renders'".to_owned(),
            "'jobs'".to_owned(),
            "5".to_owned(),
            four("5"),
            four("p1"),
            four("50"),
            four("p1"),
            four("renders"),
            four("claim"),
            four("ok"),
            four("NULL"),
            four("renders"),
            "'{t-1,t-2,t-3,t-4}'".to_owned(),
            four("1"),
            four("1"),
            four("p1"),
            "'{k-1,k-2,k-3,k-4}'".to_owned(),
            four("d"),
            four("NULL"),
            four("a"),
            four("p1"),
            four("renders"),
            four("submit"),
            four("ok"),
            four("r"),
            four("NULL"),
        ]
        .join(", ");
        let mut failures = Vec::new();
        for mode in ["force_custom_plan", "force_generic_plan"] {
            client
                .batch_execute(&format!("SET plan_cache_mode = {mode}"))
                .unwrap();
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN EXECUTE many({arguments})"), &[])
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            let plan = plan.join("\n");
            for table in ["tasks", "attempts", "receipts"] {
                if plan.contains(&format!("Seq Scan on {table}")) {
                    failures.push(format!("{mode}: {table} read whole\n{plan}"));
                }
            }
        }
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .unwrap();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}
