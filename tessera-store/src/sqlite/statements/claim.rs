//! The claim's searches of both claim indexes, `tasks_claim_order` and
//! `attempts_lapse_order`: the next claimable task, whether there is one,
//! a priority's candidates, and the leases a claim is admitted against.

use rusqlite::params;

use super::tasks::select_tasks;
use crate::backend::rows::TaskRow;
use crate::sqlite::readers::Reader;

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

/// The lease of a queue that lapsed into being claimable first (its task,
/// when, and the task's priority), from priority `?4` up: one search of
/// the partial `attempts_lapse_order` index per priority.
pub(crate) const OLDEST_LAPSED: &str = by_priority!(
    "SELECT task, lapses_at, priority FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND state = 'leased' AND lapses_at <= ?3",
    "ORDER BY lapses_at, task LIMIT 1",
    "?4"
);

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
        |row| {
            Ok((
                row.get("task")?,
                row.get("lapses_at")?,
                row.get("priority")?,
            ))
        },
    )
}

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

/// A priority's due entries of `tasks_claim_order`, in its order.
pub(crate) const CANDIDATE_TASKS: &str = "SELECT id, claimable_at FROM tasks \
     WHERE namespace = ?1 AND queue = ?2 AND priority = ?3 AND claimable_at IS NOT NULL \
     AND claimable_at <= ?4 ORDER BY claimable_at, id LIMIT ?5";

/// A priority's due lapsed leases from `attempts_lapse_order`, in its order.
pub(crate) const CANDIDATE_LAPSED: &str = "SELECT task, lapses_at FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND priority = ?3 AND state = 'leased' \
     AND lapses_at <= ?4 ORDER BY lapses_at, task LIMIT ?5";

/// A priority's due entries of both claim indexes, at most `limit` each.
#[allow(clippy::type_complexity)]
pub(crate) fn candidates(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    priority: u8,
    now: i64,
    limit: i64,
) -> rusqlite::Result<(Vec<(i64, Option<i64>)>, Vec<(i64, i64)>)> {
    let args = params![namespace, queue, priority, now, limit];
    let indexed = reader.all(CANDIDATE_TASKS, args, |row| {
        Ok((row.get("id")?, row.get("claimable_at")?))
    })?;
    let lapsed = reader.all(CANDIDATE_LAPSED, args, |row| {
        Ok((row.get("task")?, row.get("lapses_at")?))
    })?;
    Ok((indexed, lapsed))
}

/// The leased attempts of a queue, from `attempts_lapse_order` alone.
pub(crate) const LEASED_IN_QUEUE: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = ?1 AND queue = ?2 AND state = 'leased'";

/// How many of a queue's attempts are leased.
pub(crate) fn leased_in_queue(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(LEASED_IN_QUEUE, params![namespace, queue], |row| row.get(0))?
        .unwrap_or(0))
}

/// The leased attempts of one partition of a queue: the queue's leased
/// attempts from `attempts_lapse_order`, each task's key by its row id.
pub(crate) const LEASED_IN_PARTITION: &str = "SELECT count(*) FROM attempts a \
     JOIN tasks t ON t.id = a.task WHERE a.namespace = ?1 AND a.queue = ?2 \
     AND a.state = 'leased' AND t.partition_key = ?3";

/// How many of a partition's attempts are leased.
pub(crate) fn leased_in_partition(
    reader: &Reader<'_>,
    namespace: &str,
    queue: &str,
    key: &str,
) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(LEASED_IN_PARTITION, params![namespace, queue, key], |row| {
            row.get(0)
        })?
        .unwrap_or(0))
}
