//! The `attempts` table: a task's attempts, their insert and updates,
//! progress, the listings by state and the ranges of
//! `attempts_changed_at_rest`.

pub(in crate::postgres) const ATTEMPTS_OF_TASK: &str = "SELECT number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error FROM attempts WHERE task = $1 \
     ORDER BY number";
pub(in crate::postgres) const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task, number, namespace, queue, state, \
     until_at, tries, priority, changed_at) VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8)";
pub(in crate::postgres) const UPDATE_ATTEMPT: &str = "UPDATE attempts SET state = $3, until_at = $4, tries = $5, \
     holder = $6, token = $7, granted_at = $8, expires_at = $9, lapses_at = $10, \
     discarded = $11, last_error = $12, changed_at = coalesce($13, changed_at) \
     WHERE task = $1 AND number = $2";
pub(in crate::postgres) const UPDATE_ATTEMPT_STATE: &str = "UPDATE attempts SET state = $3, until_at = $4, \
     lapses_at = $5, discarded = $6, last_error = $7, changed_at = coalesce($8, changed_at) \
     WHERE task = $1 AND number = $2";
/// [`UPDATE_ATTEMPT_STATE`] of a submission: the state and the receipt
/// it ended the attempt with, in one row write.
pub(in crate::postgres) const UPDATE_ATTEMPT_RECEIPT: &str = "UPDATE attempts SET state = $3, \
     until_at = $4, lapses_at = $5, discarded = $6, last_error = $7, \
     changed_at = coalesce($8, changed_at), idempotency_key = $9, digest = $10, \
     accepted_at = $11, output = $12 WHERE task = $1 AND number = $2";
pub(in crate::postgres) const EXTEND_ATTEMPT: &str = "UPDATE attempts SET expires_at = $3, lapses_at = $4 \
     WHERE task = $1 AND number = $2";
/// [`EXTEND_ATTEMPT`] with the progress value a heartbeat carried.
pub(in crate::postgres) const EXTEND_ATTEMPT_PROGRESS: &str = "UPDATE attempts SET expires_at = $3, \
     lapses_at = $4, progress = $5 WHERE task = $1 AND number = $2";
/// An attempt's progress value alone (a heartbeat that moved no expiry).
pub(in crate::postgres) const UPDATE_PROGRESS: &str =
    "UPDATE attempts SET progress = $3 WHERE task = $1 AND number = $2";
/// The progress values of a task's attempts, in number order.
pub(in crate::postgres) const PROGRESS_OF_TASK: &str = "SELECT number, progress FROM attempts \
     WHERE task = $1 AND progress IS NOT NULL ORDER BY number";
/// A bulk filter's page of a namespace's attempts whose state is
/// `$state` (a comparison with `'leased'`), after position ($2, $3, $4) in
/// (changed_at, task, number) order, whose state changed at or before
/// $5, of queue $6, in state $7 and of partition key $9 where those are
/// set, each with its task's reference.
macro_rules! attempts_matching {
    ($state:literal) => {
        concat!(
            "SELECT a.changed_at, a.task, a.number, t.task_id, t.version ",
            "FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = $1 AND a.state ",
            $state,
            " AND (a.changed_at, a.task, a.number) > ($2, $3, $4) ",
            "AND a.changed_at <= $5 AND ($6::text IS NULL OR a.queue = $6) ",
            "AND ($7::text IS NULL OR a.state = $7) ",
            "AND ($9::text IS NULL OR t.partition_key = $9) ",
            "ORDER BY a.changed_at, a.task, a.number LIMIT $8"
        )
    };
}
/// The attempts at rest (not leased) a bulk filter matches: one range of
/// `attempts_changed_at_rest`.
pub(in crate::postgres) const ATTEMPTS_MATCHING: &str = attempts_matching!("<> 'leased'");
/// The leased attempts a bulk filter matches: the namespace's leases in
/// flight, from `attempts_lapse_order`, sorted (a bounded few).
pub(in crate::postgres) const LEASED_MATCHING: &str = attempts_matching!("= 'leased'");
/// A listing's columns and join, in [`ListingRow`] order, of the state
/// `$2`, which `$state` (a comparison with `'leased'`) says is leased or
/// not, so the planner knows which index holds it.
macro_rules! select_listing {
    ($state:literal, $tail:expr) => {
        concat!(
            "SELECT a.task, a.number, a.state, a.until_at, a.discarded, a.tries, ",
            "t.queue, t.task_id, t.version, t.partition_key, a.progress, a.changed_at ",
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
pub(in crate::postgres) const TASKS_BY_STATE_OLDEST: &str =
    select_listing!("<> 'leased'", oldest_first!());
/// [`TASKS_BY_STATE_OLDEST`] newest first, before ($3, $4).
pub(in crate::postgres) const TASKS_BY_STATE_NEWEST: &str =
    select_listing!("<> 'leased'", newest_first!());
/// [`TASKS_BY_STATE_OLDEST`] of the leased attempts (`$2` is `leased`):
/// those of the namespace in `attempts_lapse_order`, sorted. They are the
/// leases in flight, so the sort is of a bounded few.
pub(in crate::postgres) const LEASED_OLDEST: &str = select_listing!("= 'leased'", oldest_first!());
/// [`LEASED_OLDEST`] newest first, before ($3, $4).
pub(in crate::postgres) const LEASED_NEWEST: &str = select_listing!("= 'leased'", newest_first!());
/// Attempts of namespace `$6` in state `$1` (a final one, never leased)
/// that reached it at or before `$2`, after `($3, $4)` in (changed_at,
/// task) order, at most `$5`: one range of `attempts_changed_at_rest`,
/// the state read beside it.
pub(in crate::postgres) const FINISHED_ATTEMPTS: &str = "SELECT changed_at, task FROM attempts \
     WHERE namespace = $6 AND state <> 'leased' AND (changed_at, task) > ($3, $4) \
     AND changed_at <= $2 AND state = $1 ORDER BY changed_at, task LIMIT $5";
/// The attempts of the tasks of `$1`: state and when it was reached.
pub(in crate::postgres) const ATTEMPT_ENDS: &str =
    "SELECT task, state, changed_at FROM attempts WHERE task = ANY($1) ORDER BY task, number";
