//! The `tasks` table: a task's reads by reference and by row id (locked
//! or not), its insert, its narrow updates, and the deletes of finished
//! tasks with every row of their own.

pub(in crate::postgres) const TASK_BY_REF: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3"
);
pub(in crate::postgres) const TASK_BY_REF_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3 FOR UPDATE"
);
pub(in crate::postgres) const TASK_BY_ID: &str =
    concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1");
pub(in crate::postgres) const TASK_BY_ID_LOCKED: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE id = $1 FOR UPDATE SKIP LOCKED"
);
pub(in crate::postgres) const FIND_TASK: &str =
    "SELECT id FROM tasks WHERE namespace = $1 AND task_id = $2 AND version = $3";
pub(in crate::postgres) const INSERT_TASK: &str = "INSERT INTO tasks (namespace, queue, task_id, version, brief, \
     brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority, partition_key, unique_key, unique_slot, unique_states, \
     lease_ms, deadline_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11, 0, $12, $9, $10, $13, $14, $15, $16, $17, \
     $18, $19) \
     ON CONFLICT (namespace, task_id, version) DO NOTHING RETURNING id";
pub(in crate::postgres) const REPLACE_BRIEF: &str =
    "UPDATE tasks SET brief = $2, brief_format = $3 WHERE id = $1";
pub(in crate::postgres) const UPDATE_TASK: &str =
    "UPDATE tasks SET last_token = $2, claimable_at = $3 WHERE id = $1";
pub(in crate::postgres) const UPDATE_TOKEN: &str = "UPDATE tasks SET last_token = $2 WHERE id = $1";
pub(in crate::postgres) const UPDATE_MAX_TRIES: &str =
    "UPDATE tasks SET max_tries = $2 WHERE id = $1";
pub(in crate::postgres) const UPDATE_CLAIMABLE: &str =
    "UPDATE tasks SET claimable_at = $2 WHERE id = $1";
/// The tasks of `$1` no other transaction holds, locked.
pub(in crate::postgres) const LOCK_FINISHED: &str = "SELECT id, namespace, queue FROM tasks \
     WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED";
/// Deletes the tasks of `$1` with their attempts (and so their
/// receipts) and unique slot; answers the rows deleted.
pub(in crate::postgres) const DELETE_TASKS: &str = "WITH gone AS (SELECT id, namespace, queue, task_id, \
     unique_slot FROM tasks WHERE id = ANY($1)), \
     a AS (DELETE FROM attempts WHERE task IN (SELECT id FROM gone) RETURNING 1), \
     u AS (DELETE FROM unique_slots s USING gone g WHERE g.unique_slot IS NOT NULL \
     AND s.namespace = g.namespace AND s.queue = g.queue AND s.slot = g.unique_slot \
     AND s.task_id = g.task_id RETURNING 1), \
     ep AS (DELETE FROM task_edges WHERE parent IN (SELECT id FROM gone) RETURNING 1), \
     ec AS (DELETE FROM task_edges WHERE child IN (SELECT id FROM gone) RETURNING 1), \
     t AS (DELETE FROM tasks WHERE id IN (SELECT id FROM gone) RETURNING 1) \
     SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM u) \
     + (SELECT count(*) FROM ep) + (SELECT count(*) FROM ec) + (SELECT count(*) FROM t)";
