//! The searches across both claim indexes: a queue's claimable tasks in
//! `tasks_claim_order` and its lapsed leases in `attempts_lapse_order`,
//! each priority one turn of a lateral subquery ([`each_priority!`]).

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
pub(in crate::postgres) const NEXT_CLAIMABLE: &str = each_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// [`NEXT_CLAIMABLE`] without taking it, for a read.
pub(in crate::postgres) const PEEK_CLAIMABLE: &str = each_priority!(
    claimable_tasks!(),
    "ORDER BY claimable_at, id LIMIT 1",
    "$4::bigint"
);
/// [`NEXT_LAPSED`] without taking it, for a read.
pub(in crate::postgres) const PEEK_LAPSED: &str = each_priority!(
    lapsed_leases!(),
    "ORDER BY lapses_at, task LIMIT 1",
    "$4::bigint"
);
/// The lease of a queue that lapsed first, from priority `$4` up, its
/// attempt locked.
pub(in crate::postgres) const NEXT_LAPSED: &str = each_priority!(
    lapsed_leases!(),
    "ORDER BY lapses_at, task LIMIT 1 FOR UPDATE SKIP LOCKED",
    "$4::bigint"
);
/// Index searches only, at most one per priority and index.
pub(in crate::postgres) const HAS_CLAIMABLE: &str = concat!(
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
/// A priority's due entries of `tasks_claim_order`, in its order.
pub(in crate::postgres) const CANDIDATE_TASKS: &str = "SELECT id, claimable_at FROM tasks \
     WHERE namespace = $1 AND queue = $2 AND priority = $3 AND claimable_at IS NOT NULL \
     AND claimable_at <= $4 ORDER BY claimable_at, id LIMIT $5";
/// A priority's due lapsed leases from `attempts_lapse_order`, in its order.
pub(in crate::postgres) const CANDIDATE_LAPSED: &str = "SELECT task, lapses_at FROM attempts \
     WHERE namespace = $1 AND queue = $2 AND priority = $3 AND state = 'leased' \
     AND lapses_at <= $4 ORDER BY lapses_at, task LIMIT $5";
/// Tasks with an expired lease, each once, locked or skipped.
pub(in crate::postgres) const LAPSED_TASKS: &str = "SELECT DISTINCT task FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2 LIMIT $3";
/// [`LAPSED_TASKS`] of one queue (`$4`), the longest expired first: a
/// claim of a limited queue records its own lapses, whatever other queues
/// of the namespace hold. A task with several lapsed attempts may be
/// listed once per attempt.
pub(in crate::postgres) const LAPSED_IN_QUEUE: &str = "SELECT task FROM attempts \
     WHERE namespace = $1 AND queue = $4 AND state = 'leased' AND expires_at <= $2 \
     ORDER BY expires_at, task LIMIT $3";
