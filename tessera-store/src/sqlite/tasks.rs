//! Namespaces, tasks, attempts and receipts.

use rusqlite::{Row, params};

use super::readers::Reader;
use super::writer::Writer;
use crate::backend::rows::{AttemptRow, ListingRow, MatchingRow, ReceiptRow, TaskRow};

/// `$select` (a statement ending in its `WHERE` conditions) once per task
/// priority, highest first, each arm `$order` (an `ORDER BY`, `LIMIT 1` and
/// any locking clause) and skipped when the floor parameter `$floor` is
/// above its priority; the first row found (or the first `$limit`, when
/// given) ends the statement. The claim
/// indexes lead with the priority, so each arm is one index search and
/// the statement at most `MAX_PRIORITY + 1` of them
/// ([`priorities`](tessera_lease::priorities)), however many entries are
/// not yet due.
macro_rules! by_priority {
    ($select:expr, $order:expr, $floor:expr) => {
        by_priority!($select, $order, $floor, "1")
    };
    ($select:expr, $order:expr, $floor:expr, $limit:expr) => {
        concat!(
            "SELECT * FROM (",
            $select,
            " AND priority = 3 AND ",
            $floor,
            " <= 3 ",
            $order,
            ") AS p3 UNION ALL SELECT * FROM (",
            $select,
            " AND priority = 2 AND ",
            $floor,
            " <= 2 ",
            $order,
            ") AS p2 UNION ALL SELECT * FROM (",
            $select,
            " AND priority = 1 AND ",
            $floor,
            " <= 1 ",
            $order,
            ") AS p1 UNION ALL SELECT * FROM (",
            $select,
            " AND priority = 0 AND ",
            $floor,
            " <= 0 ",
            $order,
            ") AS p0 LIMIT ",
            $limit
        )
    };
}
// `by_priority!` spells out every priority.
const _: () = assert!(tessera_lease::MAX_PRIORITY == 3);

pub(crate) const INSERT_NAMESPACE: &str = "INSERT INTO namespaces \
     (name, kind, created_at, purge_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING";

/// The ids of the tasks of namespaces past their purge time `?1`, at most
/// `?2`, found through `namespaces_purge` and `tasks_ref`.
macro_rules! session_tasks {
    () => {
        "(SELECT t.id FROM namespaces n JOIN tasks t ON t.namespace = n.name \
         WHERE n.purge_at IS NOT NULL AND n.purge_at <= ?1 ORDER BY t.id LIMIT ?2)"
    };
}

/// A batch of purged sessions' tasks: their receipts, their attempts,
/// then the tasks themselves, each statement over the same batch.
pub(crate) const PURGE_SESSION_TASKS: [&str; 3] = [
    concat!("DELETE FROM receipts WHERE task IN ", session_tasks!()),
    concat!("DELETE FROM attempts WHERE task IN ", session_tasks!()),
    concat!("DELETE FROM tasks WHERE id IN ", session_tasks!()),
];

/// Attempts of namespace `?6` in state `?1` that reached it at or before
/// `?2`, after `(?3, ?4)` in (changed_at, task) order, at most `?5`: one
/// range of `attempts_changed`, the state read beside it.
pub(crate) const FINISHED_ATTEMPTS: &str = "SELECT changed_at, task FROM attempts \
     WHERE namespace = ?6 AND (changed_at, task) > (?3, ?4) AND changed_at <= ?2 \
     AND state = ?1 ORDER BY changed_at, task LIMIT ?5";

/// A page of namespace names, after `?1`, at most `?2`.
pub(crate) const NAMESPACE_NAMES: &str =
    "SELECT name FROM namespaces WHERE name > ?1 ORDER BY name LIMIT ?2";

/// A task's namespace and queue.
pub(crate) const TASK_PLACE: &str = "SELECT namespace, queue FROM tasks WHERE id = ?1";

/// A task's attempts: state and when it was reached.
pub(crate) const ATTEMPT_ENDS: &str =
    "SELECT state, changed_at FROM attempts WHERE task = ?1 ORDER BY number";

/// The deletes of one task with every row of its own: receipts,
/// attempts, its unique slot, the task.
pub(crate) const DELETE_TASK: [&str; 4] = [
    "DELETE FROM receipts WHERE task = ?1",
    "DELETE FROM attempts WHERE task = ?1",
    "DELETE FROM unique_slots WHERE (namespace, queue, slot, task_id) IN \
     (SELECT namespace, queue, unique_slot, task_id FROM tasks \
     WHERE id = ?1 AND unique_slot IS NOT NULL)",
    "DELETE FROM tasks WHERE id = ?1",
];

/// Namespaces past their purge time with no task left, at most `?2`.
pub(crate) const PURGE_NAMESPACES: &str = "DELETE FROM namespaces WHERE id IN \
     (SELECT id FROM namespaces WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.namespace = namespaces.name) \
     ORDER BY purge_at LIMIT ?2)";

pub(crate) const NAMESPACE_EXISTS: &str = "SELECT id FROM namespaces WHERE name = ?1";

pub(crate) const INSERT_TASK: &str = "INSERT INTO tasks (namespace, queue, task_id, version, \
     brief, brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority, partition_key, unique_key, unique_slot, unique_states, \
     lease_ms, deadline_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?11, 0, ?12, ?9, ?10, ?13, ?14, ?15, ?16, ?17, \
     ?18, ?19) \
     ON CONFLICT (namespace, task_id, version) DO NOTHING";

pub(crate) const TAKE_UNIQUE_SLOT: &str = "INSERT INTO unique_slots \
     (namespace, queue, slot, task_id, version, ends_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
     ON CONFLICT (namespace, queue, slot) DO NOTHING";

/// Up to `?2` unique slots whose window ended at or before `?1`, oldest
/// first: one range of the partial `unique_slots_ending` index.
pub(crate) const PURGE_ENDED_SLOTS: &str = "DELETE FROM unique_slots WHERE (namespace, queue, slot) \
     IN (SELECT namespace, queue, slot FROM unique_slots WHERE ends_at IS NOT NULL \
     AND ends_at <= ?1 ORDER BY ends_at LIMIT ?2)";

pub(crate) const UNIQUE_SLOT_HOLDER: &str = "SELECT task_id, version FROM unique_slots \
     WHERE namespace = ?1 AND queue = ?2 AND slot = ?3";

pub(crate) const FREE_UNIQUE_SLOT: &str =
    "DELETE FROM unique_slots WHERE namespace = ?1 AND queue = ?2 AND slot = ?3";

/// A task's slot row, then its slot columns.
pub(crate) const RELEASE_UNIQUE_SLOT: [&str; 2] = [
    "DELETE FROM unique_slots WHERE (namespace, queue, slot) = \
     (SELECT namespace, queue, unique_slot FROM tasks WHERE id = ?1)",
    "UPDATE tasks SET unique_slot = NULL, unique_states = NULL WHERE id = ?1",
];

pub(crate) const REPLACE_BRIEF: &str =
    "UPDATE tasks SET brief = ?2, brief_format = ?3 WHERE id = ?1";

/// A task row's columns, in [`TaskRow::from_row`] order, with the brief
/// (`$brief` is `brief`) or without it (`NULL`), followed by `$tail`.
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

/// The first task of a queue in `tasks_claim_order` order: the highest
/// priority with a claimable task, and in it ready ones (`claimable_at` 0)
/// in enqueue order, then those whose backoff or schedule ended, by when.
/// One search of `tasks_claim_order` per priority down to the first with
/// one (`?4` is 0); lapsed leases are in [`OLDEST_LAPSED`].
pub(crate) const OLDEST_CLAIMABLE: &str = by_priority!(
    select_tasks!(
        "brief",
        "WHERE namespace = ?1 AND queue = ?2 AND claimable_at IS NOT NULL AND claimable_at <= ?3"
    ),
    "ORDER BY claimable_at, id LIMIT 1",
    "?4"
);

/// A task of a queue claimable at `?3` if there is one: a ready attempt
/// or an ended backoff or schedule in `tasks_claim_order`, else a lapsed
/// lease in `attempts_lapse_order`. Index searches only, one per priority and
/// index at most, in one statement; no table row.
pub(crate) const HAS_CLAIMABLE: &str = concat!(
    "SELECT id FROM (",
    by_priority!(
        "SELECT id FROM tasks WHERE namespace = ?1 AND queue = ?2 \
         AND claimable_at IS NOT NULL AND claimable_at <= ?3",
        "LIMIT 1",
        "0"
    ),
    ") AS claimable UNION ALL SELECT task FROM (",
    by_priority!(
        "SELECT task FROM attempts WHERE namespace = ?1 AND queue = ?2 \
         AND state = 'leased' AND lapses_at <= ?3",
        "LIMIT 1",
        "0"
    ),
    ") AS lapsed LIMIT 1"
);

/// The lease of a queue that lapsed into being claimable first (its task,
/// when, and the task's priority), from priority `?4` up: one search of
/// the partial `attempts_lapse_order` index per priority.
pub(crate) const OLDEST_LAPSED: &str = by_priority!(
    "SELECT task, lapses_at, priority FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND state = 'leased' AND lapses_at <= ?3",
    "ORDER BY lapses_at, task LIMIT 1",
    "?4"
);

pub(crate) const TASK_BY_REF: &str = select_tasks!(
    "NULL",
    "WHERE namespace = ?1 AND task_id = ?2 AND version = ?3"
);

pub(crate) const TASK_BY_ID: &str = select_tasks!("NULL", "WHERE id = ?1");

pub(crate) const TASK_WITH_BRIEF_BY_ID: &str = select_tasks!("brief", "WHERE id = ?1");

pub(crate) const TASK_WITH_BRIEF_BY_REF: &str = select_tasks!(
    "brief",
    "WHERE namespace = ?1 AND task_id = ?2 AND version = ?3"
);

pub(crate) const UPDATE_TASK: &str =
    "UPDATE tasks SET last_token = ?2, claimable_at = ?3 WHERE id = ?1";

pub(crate) const UPDATE_CLAIMABLE: &str = "UPDATE tasks SET claimable_at = ?2 WHERE id = ?1";

pub(crate) const UPDATE_TOKEN: &str = "UPDATE tasks SET last_token = ?2 WHERE id = ?1";

pub(crate) const UPDATE_MAX_TRIES: &str = "UPDATE tasks SET max_tries = ?2 WHERE id = ?1";

pub(crate) const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task, number, namespace, queue, \
     state, until_at, tries, priority, changed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8)";

pub(crate) const ATTEMPTS_OF_TASK: &str = "SELECT number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error FROM attempts WHERE task = ?1 \
     ORDER BY number";

pub(crate) const UPDATE_ATTEMPT: &str = "UPDATE attempts SET state = ?3, until_at = ?4, \
     tries = ?5, holder = ?6, token = ?7, granted_at = ?8, expires_at = ?9, lapses_at = ?10, \
     discarded = ?11, last_error = ?12, changed_at = coalesce(?13, changed_at) \
     WHERE task = ?1 AND number = ?2";

pub(crate) const UPDATE_ATTEMPT_STATE: &str = "UPDATE attempts SET state = ?3, until_at = ?4, \
     lapses_at = ?5, discarded = ?6, last_error = ?7, changed_at = coalesce(?8, changed_at) \
     WHERE task = ?1 AND number = ?2";

pub(crate) const EXTEND_ATTEMPT: &str = "UPDATE attempts SET expires_at = ?3, lapses_at = ?4 \
     WHERE task = ?1 AND number = ?2";

/// [`EXTEND_ATTEMPT`] with the progress value a heartbeat carried.
pub(crate) const EXTEND_ATTEMPT_PROGRESS: &str = "UPDATE attempts SET expires_at = ?3, \
     lapses_at = ?4, progress = ?5 WHERE task = ?1 AND number = ?2";

/// An attempt's progress value alone (a heartbeat that moved no expiry).
pub(crate) const UPDATE_PROGRESS: &str =
    "UPDATE attempts SET progress = ?3 WHERE task = ?1 AND number = ?2";

/// The progress values of a task's attempts, in number order.
pub(crate) const PROGRESS_OF_TASK: &str = "SELECT number, progress FROM attempts \
     WHERE task = ?1 AND progress IS NOT NULL ORDER BY number";

/// A namespace's attempts after position (`?2`, `?3`, `?4`) in
/// (changed_at, task, number) order, whose state changed at or before
/// `?5`, of queue `?6`, in state `?7` and of partition key `?9` where those
/// are set, each with its task's reference: one range of `attempts_changed`.
pub(crate) const ATTEMPTS_MATCHING: &str = "SELECT a.changed_at, a.task, a.number, \
     t.task_id, t.version FROM attempts a JOIN tasks t ON t.id = a.task \
     WHERE a.namespace = ?1 AND (a.changed_at, a.task, a.number) > (?2, ?3, ?4) \
     AND a.changed_at <= ?5 AND (?6 IS NULL OR a.queue = ?6) AND (?7 IS NULL OR a.state = ?7) \
     AND (?9 IS NULL OR t.partition_key = ?9) \
     ORDER BY a.changed_at, a.task, a.number LIMIT ?8";

/// Leased attempts of a namespace whose lease expired, at most `?3`.
pub(crate) const LAPSED_LEASES: &str = "SELECT task FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' AND expires_at <= ?2 LIMIT ?3";

/// [`LAPSED_LEASES`] of one queue (`?4`), the longest expired first.
pub(crate) const LAPSED_IN_QUEUE: &str = "SELECT task FROM attempts \
     WHERE namespace = ?1 AND queue = ?4 AND state = 'leased' AND expires_at <= ?2 \
     ORDER BY expires_at, task LIMIT ?3";

pub(crate) const COUNT_LAPSED_LEASES: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' AND expires_at <= ?2";

/// A listing's columns and join, in [`ListingRow::from_row`] order.
macro_rules! select_listing {
    ($tail:literal) => {
        concat!(
            "SELECT a.id, a.number, a.state, a.until_at, a.discarded, a.tries, ",
            "t.queue, t.task_id, t.version, t.partition_key, a.progress ",
            "FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = ?1 AND a.state = ?2 ",
            $tail
        )
    };
}

/// A namespace's attempts in one state after attempt row `?3`, oldest
/// first: one range of `attempts_state`, whose entries end in the row id
/// (attempts are inserted at enqueue, so row ids are enqueue order), each
/// task by its row id.
pub(crate) const TASKS_BY_STATE_OLDEST: &str =
    select_listing!("AND a.id > ?3 ORDER BY a.id LIMIT ?4");

/// [`TASKS_BY_STATE_OLDEST`] newest first, before row `?3`.
pub(crate) const TASKS_BY_STATE_NEWEST: &str =
    select_listing!("AND a.id < ?3 ORDER BY a.id DESC LIMIT ?4");

/// Attempts per state in a namespace, from the `attempts_state` index alone.
pub(crate) const COUNT_BY_STATE: &str = "SELECT state, count(*) FROM attempts \
     WHERE namespace = ?1 GROUP BY state";

/// Per queue: claim-order entries claimable at `?2`, and later.
pub(crate) const QUEUE_CLAIMABLE: &str = "SELECT queue, \
     sum(claimable_at <= ?2), sum(claimable_at > ?2) \
     FROM tasks WHERE namespace = ?1 AND claimable_at IS NOT NULL GROUP BY queue";

/// Per queue: live and lapsed leases.
pub(crate) const QUEUE_LEASED: &str = "SELECT queue, count(*) FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' GROUP BY queue";

pub(crate) const INSERT_RECEIPT: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// A receipt row's columns, in [`ReceiptRow::from_row`] order.
macro_rules! select_receipts {
    ($tail:literal) => {
        concat!(
            "SELECT attempt, token, principal, idempotency_key, artifact, digest, ",
            "accepted_at, output FROM receipts ",
            $tail
        )
    };
}

pub(crate) const RECEIPT_BY_KEY: &str =
    select_receipts!("WHERE principal = ?1 AND task = ?2 AND idempotency_key = ?3");

pub(crate) const RECEIPTS_OF_ATTEMPT: &str =
    select_receipts!("WHERE task = ?1 AND attempt = ?2 ORDER BY id");

pub(crate) const RECEIPTS_OF_TASK: &str =
    select_receipts!("WHERE task = ?1 ORDER BY attempt, id LIMIT ?2");

impl TaskRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            queue: row.get(1)?,
            task_id: row.get(2)?,
            version: row.get(3)?,
            brief: row.get(4)?,
            brief_format: row.get(5)?,
            lapse_backoff_ms: row.get(6)?,
            last_token: row.get(7)?,
            claimable_at: row.get(8)?,
            created_at: row.get(9)?,
            max_tries: row.get(10)?,
            priority: row.get(11)?,
            partition_key: row.get(12)?,
            unique_key: row.get(13)?,
            unique_states: row.get(14)?,
            lease_ms: row.get(15)?,
            deadline_at: row.get(16)?,
        })
    }
}

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

impl AttemptRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            number: row.get(0)?,
            state: row.get(1)?,
            until_at: row.get(2)?,
            tries: row.get(3)?,
            holder: row.get(4)?,
            token: row.get(5)?,
            granted_at: row.get(6)?,
            expires_at: row.get(7)?,
            lapses_at: row.get(8)?,
            discarded: row.get(9)?,
            last_error: row.get(10)?,
        })
    }
}

impl ListingRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            position: row.get(0)?,
            number: row.get(1)?,
            state: row.get(2)?,
            until_at: row.get(3)?,
            discarded: row.get(4)?,
            tries: row.get(5)?,
            queue: row.get(6)?,
            task_id: row.get(7)?,
            version: row.get(8)?,
            partition_key: row.get(9)?,
            progress: row.get(10)?,
        })
    }
}

/// A page of a namespace's attempts in `state`, after attempt row
/// `after` in the order `sql` lists them.
pub(crate) fn tasks_by_state(
    reader: &Reader<'_>,
    sql: &str,
    namespace: &str,
    state: &str,
    after: i64,
    limit: i64,
) -> rusqlite::Result<Vec<ListingRow>> {
    reader.all(
        sql,
        params![namespace, state, after, limit],
        ListingRow::from_row,
    )
}

impl ReceiptRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            attempt: row.get(0)?,
            token: row.get(1)?,
            principal: row.get(2)?,
            idempotency_key: row.get(3)?,
            artifact: row.get(4)?,
            digest: row.get(5)?,
            accepted_at: row.get(6)?,
            output: row.get(7)?,
        })
    }
}

/// Creates a namespace row unless it exists; returns whether it was created.
pub(crate) fn insert_namespace(
    writer: &Writer<'_>,
    name: &str,
    kind: &str,
    created_at: i64,
    purge_at: Option<i64>,
) -> rusqlite::Result<bool> {
    Ok(writer.execute(INSERT_NAMESPACE, params![name, kind, created_at, purge_at])? == 1)
}

/// One retention batch of purged sessions' tasks, at most `limit`, with
/// their attempts and receipts; returns how many tasks it deleted.
pub(crate) fn purge_session_tasks(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    let [receipts, attempts, tasks] = PURGE_SESSION_TASKS;
    writer.execute(receipts, params![threshold, limit])?;
    writer.execute(attempts, params![threshold, limit])?;
    writer.execute(tasks, params![threshold, limit])
}

/// Finished attempts' positions (see [`FINISHED_ATTEMPTS`]).
pub(crate) fn finished_attempts(
    reader: &Reader<'_>,
    namespace: &str,
    state: &str,
    cutoff: i64,
    after: (i64, i64),
    limit: i64,
) -> rusqlite::Result<Vec<(i64, i64)>> {
    reader.all(
        FINISHED_ATTEMPTS,
        params![state, cutoff, after.0, after.1, limit, namespace],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
}

/// A page of namespace names (see [`NAMESPACE_NAMES`]).
pub(crate) fn namespace_names(
    reader: &Reader<'_>,
    after: &str,
    limit: i64,
) -> rusqlite::Result<Vec<String>> {
    reader.all(NAMESPACE_NAMES, params![after, limit], |row| row.get(0))
}

/// A task's namespace and queue, if it is there.
pub(crate) fn task_place(
    reader: &Reader<'_>,
    id: i64,
) -> rusqlite::Result<Option<(String, String)>> {
    reader.optional(TASK_PLACE, [id], |row| Ok((row.get(0)?, row.get(1)?)))
}

/// A task's attempts' states and when each was reached.
pub(crate) fn attempt_ends(reader: &Reader<'_>, id: i64) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(ATTEMPT_ENDS, [id], |row| Ok((row.get(0)?, row.get(1)?)))
}

/// Deletes a task with every row of its own; the rows deleted.
pub(crate) fn delete_task(writer: &Writer<'_>, id: i64) -> rusqlite::Result<usize> {
    let mut deleted = 0;
    for statement in DELETE_TASK {
        deleted += writer.execute(statement, [id])?;
    }
    Ok(deleted)
}

/// Whether a namespace row exists.
pub(crate) fn namespace_exists(reader: &Reader<'_>, name: &str) -> rusqlite::Result<bool> {
    Ok(reader
        .optional(NAMESPACE_EXISTS, [name], |row| row.get::<_, i64>(0))?
        .is_some())
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

/// The first task of a queue in claim-index order claimable at `now`
/// (see [`OLDEST_CLAIMABLE`]).
pub(crate) fn oldest_claimable(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    now: i64,
) -> rusqlite::Result<Option<TaskRow>> {
    reader.optional(
        OLDEST_CLAIMABLE,
        params![namespace, queue, now, 0],
        TaskRow::from_row,
    )
}

/// The task whose lease in a queue lapsed into being claimable first by
/// `now`, of priority `floor` or above: its row id, when, and its priority
/// (see [`OLDEST_LAPSED`]).
pub(crate) fn oldest_lapsed(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    now: i64,
    floor: u8,
) -> rusqlite::Result<Option<(i64, i64, i64)>> {
    reader.optional(
        OLDEST_LAPSED,
        params![namespace, queue, now, floor],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
}

/// Whether a queue has a task claimable at `now`: a ready attempt, an
/// ended backoff or a lapsed lease (see [`HAS_CLAIMABLE`]).
pub(crate) fn has_claimable(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    now: i64,
) -> rusqlite::Result<bool> {
    Ok(reader
        .optional(HAS_CLAIMABLE, params![namespace, queue, now], |row| {
            row.get::<_, i64>(0)
        })?
        .is_some())
}

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

/// Inserts a new attempt, never yet tried, in its first state (ready or
/// scheduled), with its task's priority.
pub(crate) fn insert_attempt(
    writer: &Writer<'_>,
    task: i64,
    namespace: &str,
    queue: &str,
    priority: i64,
    row: &AttemptRow,
    changed_at: i64,
) -> rusqlite::Result<()> {
    writer.execute(
        INSERT_ATTEMPT,
        params![
            task,
            row.number,
            namespace,
            queue,
            row.state,
            row.until_at,
            priority,
            changed_at
        ],
    )?;
    Ok(())
}

/// A task's attempts in number order.
pub(crate) fn attempts_of_task(
    reader: &Reader<'_>,
    task: i64,
) -> rusqlite::Result<Vec<AttemptRow>> {
    reader.all(ATTEMPTS_OF_TASK, [task], AttemptRow::from_row)
}

/// Writes every column of an attempt, and when it changed (kept if
/// `None`).
pub(crate) fn update_attempt(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
    changed_at: Option<i64>,
) -> rusqlite::Result<()> {
    writer.execute(
        UPDATE_ATTEMPT,
        params![
            task,
            row.number,
            row.state,
            row.until_at,
            row.tries,
            row.holder,
            row.token,
            row.granted_at,
            row.expires_at,
            row.lapses_at,
            row.discarded,
            row.last_error,
            changed_at,
        ],
    )?;
    Ok(())
}

/// Writes an attempt's state alone (and its lapse time, which only a
/// leased attempt has).
pub(crate) fn update_attempt_state(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
    changed_at: Option<i64>,
) -> rusqlite::Result<()> {
    writer.execute(
        UPDATE_ATTEMPT_STATE,
        params![
            task,
            row.number,
            row.state,
            row.until_at,
            row.lapses_at,
            row.discarded,
            row.last_error,
            changed_at
        ],
    )?;
    Ok(())
}

/// Writes an attempt's lease expiry and lapse time alone: its row and its
/// `attempts_leased` entry.
pub(crate) fn extend_attempt(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
) -> rusqlite::Result<()> {
    writer.execute(
        EXTEND_ATTEMPT,
        params![task, row.number, row.expires_at, row.lapses_at],
    )?;
    Ok(())
}

/// Writes an attempt's lease expiry and lapse time with a heartbeat's
/// progress value, or (without an expiry, `row` `None`) the progress alone.
pub(crate) fn save_progress(
    writer: &Writer<'_>,
    task: i64,
    number: i64,
    row: Option<&AttemptRow>,
    progress: &str,
) -> rusqlite::Result<()> {
    match row {
        Some(row) => writer.execute(
            EXTEND_ATTEMPT_PROGRESS,
            params![task, number, row.expires_at, row.lapses_at, progress],
        )?,
        None => writer.execute(UPDATE_PROGRESS, params![task, number, progress])?,
    };
    Ok(())
}

/// The progress values of a task's attempts.
pub(crate) fn progress_of_task(
    reader: &Reader<'_>,
    task: i64,
) -> rusqlite::Result<Vec<(i64, String)>> {
    reader.all(PROGRESS_OF_TASK, [task], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })
}

/// One page of attempts matching a bulk filter (see [`ATTEMPTS_MATCHING`]):
/// each one's position, then its task's id and version.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attempts_matching(
    reader: &Reader<'_>,
    namespace: &str,
    after: (i64, i64, i64),
    upto: i64,
    queue: Option<&str>,
    state: Option<&str>,
    partition: Option<&str>,
    limit: i64,
) -> rusqlite::Result<Vec<MatchingRow>> {
    reader.all(
        ATTEMPTS_MATCHING,
        params![
            namespace, after.0, after.1, after.2, upto, queue, state, limit, partition
        ],
        |row| {
            Ok((
                (row.get(0)?, row.get(1)?, row.get(2)?),
                row.get(3)?,
                row.get(4)?,
            ))
        },
    )
}

/// Tasks with an expired lease in a namespace, at most `limit`.
pub(crate) fn lapsed_leases(
    reader: &Reader<'_>,
    namespace: &str,
    queue: Option<&str>,
    now: i64,
    limit: i64,
) -> rusqlite::Result<Vec<i64>> {
    match queue {
        Some(queue) => reader.all(
            LAPSED_IN_QUEUE,
            params![namespace, now, limit, queue],
            |row| row.get(0),
        ),
        None => reader.all(LAPSED_LEASES, params![namespace, now, limit], |row| {
            row.get(0)
        }),
    }
}

/// How many leases in a namespace have lapsed.
pub(crate) fn count_lapsed_leases(
    reader: &Reader<'_>,
    namespace: &str,
    now: i64,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(COUNT_LAPSED_LEASES, params![namespace, now], |row| {
            row.get(0)
        })?
        .unwrap_or(0))
}

/// Per queue: tasks claimable at `now` and later, from the claim order.
pub(crate) fn queue_claimable(
    reader: &Reader<'_>,
    namespace: &str,
    now: i64,
) -> rusqlite::Result<Vec<(String, i64, i64)>> {
    reader.all(QUEUE_CLAIMABLE, rusqlite::params![namespace, now], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
}

/// Per queue: leases, from the lease index.
pub(crate) fn queue_leased(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(QUEUE_LEASED, [namespace], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })
}

/// Attempts per state name in a namespace.
pub(crate) fn count_by_state(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(COUNT_BY_STATE, [namespace], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })
}

/// A new receipt's columns.
#[derive(Debug, Clone)]
pub(crate) struct NewReceipt<'a> {
    pub(crate) task: i64,
    pub(crate) attempt: i64,
    pub(crate) token: i64,
    pub(crate) principal: &'a str,
    pub(crate) idempotency_key: &'a str,
    pub(crate) artifact: &'a str,
    pub(crate) digest: &'a str,
    pub(crate) accepted_at: i64,
    pub(crate) output: Option<&'a [u8]>,
}

/// Inserts a receipt.
pub(crate) fn insert_receipt(
    writer: &Writer<'_>,
    receipt: &NewReceipt<'_>,
) -> rusqlite::Result<()> {
    writer.execute(
        INSERT_RECEIPT,
        params![
            receipt.task,
            receipt.attempt,
            receipt.token,
            receipt.principal,
            receipt.idempotency_key,
            receipt.artifact,
            receipt.digest,
            receipt.accepted_at,
            receipt.output,
        ],
    )?;
    Ok(())
}

/// The receipt stored under (principal, task, idempotency key).
pub(crate) fn receipt_by_key(
    reader: &Reader<'_>,
    principal: &str,
    task: i64,
    key: &str,
) -> rusqlite::Result<Option<ReceiptRow>> {
    reader.optional(
        RECEIPT_BY_KEY,
        params![principal, task, key],
        ReceiptRow::from_row,
    )
}

/// The receipts of one attempt (one per accepted submission).
pub(crate) fn receipts_of_attempt(
    reader: &Reader<'_>,
    task: i64,
    attempt: i64,
) -> rusqlite::Result<Vec<ReceiptRow>> {
    reader.all(
        RECEIPTS_OF_ATTEMPT,
        params![task, attempt],
        ReceiptRow::from_row,
    )
}

/// A task's receipts in attempt order, at most `limit`.
pub(crate) fn receipts_of_task(
    reader: &Reader<'_>,
    task: i64,
    limit: i64,
) -> rusqlite::Result<Vec<ReceiptRow>> {
    reader.all(RECEIPTS_OF_TASK, params![task, limit], ReceiptRow::from_row)
}
