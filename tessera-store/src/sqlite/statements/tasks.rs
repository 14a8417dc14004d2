//! The `tasks` table: a task's insert, its reads by reference and by row
//! id, its narrow updates, and its deletes with every row of its own.
//!
//! A task row is read on every claim, ack and heartbeat, so it is read by
//! position: [`COLUMNS`] names the columns in the order [`select_tasks!`]
//! selects them, `column!` finds a name's position in it at compile time,
//! and a test checks each statement's columns against it. (A lookup by
//! name in rusqlite compares the name with each column's, about 1.8 µs a
//! task row, more than the whole read by position.)

use rusqlite::{Row, params};

use super::position;
use crate::backend::rows::TaskRow;
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

/// A task row's columns, in the order [`select_tasks!`] selects them.
pub(crate) const COLUMNS: [&str; 17] = [
    "id",
    "queue",
    "task_id",
    "version",
    "brief",
    "brief_format",
    "lapse_backoff_ms",
    "last_token",
    "claimable_at",
    "created_at",
    "max_tries",
    "priority",
    "partition_key",
    "unique_key",
    "unique_states",
    "lease_ms",
    "deadline_at",
];

/// A task row's [`COLUMNS`], with the brief (`$brief` is `brief`) or
/// without it (`NULL AS brief`), followed by `$tail`.
macro_rules! select_tasks {
    ($brief:literal, $tail:literal) => {
        concat!(
            "SELECT id, queue, task_id, version, ",
            $brief,
            ", brief_format, lapse_backoff_ms, last_token, claimable_at, created_at, max_tries, ",
            "priority, partition_key, unique_key, unique_states, lease_ms, deadline_at ",
            "FROM tasks ",
            $tail
        )
    };
}
pub(crate) use select_tasks;

/// The position of a task column in [`COLUMNS`], found at compile time.
macro_rules! column {
    ($name:literal) => {
        const { position(&COLUMNS, $name) }
    };
}

impl TaskRow {
    /// Decodes a row of [`select_tasks!`].
    pub(crate) fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(column!("id"))?,
            queue: row.get(column!("queue"))?,
            task_id: row.get(column!("task_id"))?,
            version: row.get(column!("version"))?,
            brief: row.get(column!("brief"))?,
            brief_format: row.get(column!("brief_format"))?,
            lapse_backoff_ms: row.get(column!("lapse_backoff_ms"))?,
            last_token: row.get(column!("last_token"))?,
            claimable_at: row.get(column!("claimable_at"))?,
            created_at: row.get(column!("created_at"))?,
            max_tries: row.get(column!("max_tries"))?,
            priority: row.get(column!("priority"))?,
            partition_key: row.get(column!("partition_key"))?,
            unique_key: row.get(column!("unique_key"))?,
            unique_states: row.get(column!("unique_states"))?,
            lease_ms: row.get(column!("lease_ms"))?,
            deadline_at: row.get(column!("deadline_at"))?,
        })
    }
}

pub(crate) const INSERT_TASK: &str = "INSERT INTO tasks (namespace, queue, task_id, version, \
     brief, brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority, partition_key, unique_key, unique_slot, unique_states, \
     lease_ms, deadline_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?11, 0, ?12, ?9, ?10, ?13, ?14, ?15, ?16, ?17, \
     ?18, ?19) \
     ON CONFLICT (namespace, task_id, version) DO NOTHING";

/// A new task's columns.
#[derive(Debug, Clone)]
pub(crate) struct NewTask<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) version: i64,
    pub(crate) brief: &'a [u8],
    pub(crate) brief_format: &'a str,
    pub(crate) alternatives: i64,
    pub(crate) lapse_backoff_ms: i64,
    pub(crate) max_tries: i64,
    pub(crate) created_at: i64,
    pub(crate) enqueued_by: &'a str,
    /// The claim index entry ([`claimable_column`](crate::backend::rows::claimable_column)).
    pub(crate) claimable_at: Option<i64>,
    pub(crate) priority: i64,
    pub(crate) partition_key: Option<&'a str>,
    pub(crate) unique_key: Option<&'a str>,
    pub(crate) unique_slot: Option<&'a str>,
    pub(crate) unique_states: Option<i64>,
    pub(crate) lease_ms: Option<i64>,
    pub(crate) deadline_at: Option<i64>,
}

/// Inserts a task; `None` if one with the same reference exists.
pub(crate) fn insert_task(
    writer: &Writer<'_>,
    task: &NewTask<'_>,
) -> rusqlite::Result<Option<i64>> {
    let changed = writer.execute(
        INSERT_TASK,
        params![
            task.namespace,
            task.queue,
            task.task_id,
            task.version,
            task.brief,
            task.brief_format,
            task.alternatives,
            task.lapse_backoff_ms,
            task.created_at,
            task.enqueued_by,
            task.max_tries,
            task.claimable_at,
            task.priority,
            task.partition_key,
            task.unique_key,
            task.unique_slot,
            task.unique_states,
            task.lease_ms,
            task.deadline_at,
        ],
    )?;
    Ok((changed == 1).then(|| writer.last_insert_rowid()))
}

pub(crate) const TASK_BY_REF: &str = select_tasks!(
    "NULL AS brief",
    "WHERE namespace = ?1 AND task_id = ?2 AND version = ?3"
);

pub(crate) const TASK_WITH_BRIEF_BY_REF: &str = select_tasks!(
    "brief",
    "WHERE namespace = ?1 AND task_id = ?2 AND version = ?3"
);

pub(crate) const TASK_BY_ID: &str = select_tasks!("NULL AS brief", "WHERE id = ?1");

pub(crate) const TASK_WITH_BRIEF_BY_ID: &str = select_tasks!("brief", "WHERE id = ?1");

/// A task by its reference, with its brief if `with_brief`.
pub(crate) fn task_by_ref(
    reader: &Reader<'_>,
    namespace: &str,
    task_id: &str,
    version: i64,
    with_brief: bool,
) -> rusqlite::Result<Option<TaskRow>> {
    let sql = if with_brief {
        TASK_WITH_BRIEF_BY_REF
    } else {
        TASK_BY_REF
    };
    reader.optional(sql, params![namespace, task_id, version], TaskRow::from_row)
}

/// A task by its row id, with its brief if `with_brief`.
pub(crate) fn task_by_id(
    reader: &Reader<'_>,
    id: i64,
    with_brief: bool,
) -> rusqlite::Result<Option<TaskRow>> {
    let sql = if with_brief {
        TASK_WITH_BRIEF_BY_ID
    } else {
        TASK_BY_ID
    };
    reader.optional(sql, [id], TaskRow::from_row)
}

pub(crate) const UPDATE_TASK: &str =
    "UPDATE tasks SET last_token = ?2, claimable_at = ?3 WHERE id = ?1";

pub(crate) const UPDATE_CLAIMABLE: &str = "UPDATE tasks SET claimable_at = ?2 WHERE id = ?1";

pub(crate) const UPDATE_TOKEN: &str = "UPDATE tasks SET last_token = ?2 WHERE id = ?1";

pub(crate) const UPDATE_MAX_TRIES: &str = "UPDATE tasks SET max_tries = ?2 WHERE id = ?1";

pub(crate) const REPLACE_BRIEF: &str =
    "UPDATE tasks SET brief = ?2, brief_format = ?3 WHERE id = ?1";

/// Writes a task's token counter and when it is next claimable.
pub(crate) fn update_task(
    writer: &Writer<'_>,
    id: i64,
    last_token: i64,
    claimable_at: Option<i64>,
) -> rusqlite::Result<()> {
    writer.execute(UPDATE_TASK, params![id, last_token, claimable_at])?;
    Ok(())
}

/// Writes when a task is next claimable.
pub(crate) fn update_claimable(
    writer: &Writer<'_>,
    id: i64,
    claimable_at: Option<i64>,
) -> rusqlite::Result<()> {
    writer.execute(UPDATE_CLAIMABLE, params![id, claimable_at])?;
    Ok(())
}

/// Writes a task's token counter.
pub(crate) fn update_token(writer: &Writer<'_>, id: i64, last_token: i64) -> rusqlite::Result<()> {
    writer.execute(UPDATE_TOKEN, params![id, last_token])?;
    Ok(())
}

/// Writes a task's number of tries.
pub(crate) fn update_max_tries(
    writer: &Writer<'_>,
    id: i64,
    max_tries: i64,
) -> rusqlite::Result<()> {
    writer.execute(UPDATE_MAX_TRIES, params![id, max_tries])?;
    Ok(())
}

/// Replaces a task's brief and its format.
pub(crate) fn replace_brief(
    writer: &Writer<'_>,
    id: i64,
    brief: &[u8],
    format: &str,
) -> rusqlite::Result<()> {
    writer.execute(REPLACE_BRIEF, params![id, brief, format])?;
    Ok(())
}

/// A task's namespace and queue.
pub(crate) const TASK_PLACE: &str = "SELECT namespace, queue FROM tasks WHERE id = ?1";

/// A task's namespace and queue, if it is there.
pub(crate) fn task_place(
    reader: &Reader<'_>,
    id: i64,
) -> rusqlite::Result<Option<(String, String)>> {
    reader.optional(TASK_PLACE, [id], |row| {
        Ok((row.get("namespace")?, row.get("queue")?))
    })
}

/// The deletes of one task with every row of its own: its attempts
/// (with their receipts), its unique slot, its edges to parents and
/// children, the task.
pub(crate) const DELETE_TASK: [&str; 5] = [
    "DELETE FROM attempts WHERE task = ?1",
    "DELETE FROM task_edges WHERE parent = ?1",
    "DELETE FROM task_edges WHERE child = ?1",
    "DELETE FROM unique_slots WHERE (namespace, queue, slot, task_id) IN \
     (SELECT namespace, queue, unique_slot, task_id FROM tasks \
     WHERE id = ?1 AND unique_slot IS NOT NULL)",
    "DELETE FROM tasks WHERE id = ?1",
];

/// Deletes a task with every row of its own; the rows deleted.
pub(crate) fn delete_task(writer: &Writer<'_>, id: i64) -> rusqlite::Result<usize> {
    let mut deleted = 0;
    for statement in DELETE_TASK {
        deleted += writer.execute(statement, [id])?;
    }
    Ok(deleted)
}

/// The ids of the tasks of namespaces past their purge time `?1`, at most
/// `?2`, found through `namespaces_purge` and `tasks_ref`.
macro_rules! session_tasks {
    () => {
        "(SELECT t.id FROM namespaces n JOIN tasks t ON t.namespace = n.name \
         WHERE n.purge_at IS NOT NULL AND n.purge_at <= ?1 ORDER BY t.id LIMIT ?2)"
    };
}

/// A batch of purged sessions' tasks: their attempts (with their
/// receipts), their edges to their parents (a task's parents are of its
/// namespace, so every edge goes with its child), then the tasks
/// themselves, each statement over the same batch.
pub(crate) const PURGE_SESSION_TASKS: [&str; 3] = [
    concat!("DELETE FROM attempts WHERE task IN ", session_tasks!()),
    concat!("DELETE FROM task_edges WHERE child IN ", session_tasks!()),
    concat!("DELETE FROM tasks WHERE id IN ", session_tasks!()),
];

/// One retention batch of purged sessions' tasks, at most `limit`, with
/// their attempts; returns how many tasks it deleted.
pub(crate) fn purge_session_tasks(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    let [attempts, edges, tasks] = PURGE_SESSION_TASKS;
    writer.execute(attempts, params![threshold, limit])?;
    writer.execute(edges, params![threshold, limit])?;
    writer.execute(tasks, params![threshold, limit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::statements::claim::OLDEST_CLAIMABLE;
    use crate::sqlite::{SqliteBackend, SqliteOptions};

    #[test]
    fn every_task_statement_selects_the_columns_in_their_order() {
        let backend = SqliteBackend::for_tests(SqliteOptions::in_memory());
        for sql in [
            TASK_BY_REF,
            TASK_WITH_BRIEF_BY_REF,
            TASK_BY_ID,
            TASK_WITH_BRIEF_BY_ID,
            OLDEST_CLAIMABLE,
        ] {
            let columns = backend.with_reader(|reader| reader.columns(sql)).unwrap();
            assert_eq!(columns, COLUMNS, "{sql}");
        }
    }
}
