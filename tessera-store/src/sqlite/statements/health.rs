//! The counts health and queue depth report: attempts per state, lapsed
//! leases, and per queue the claim order's due and later entries and the
//! leases, each from an index alone.

use rusqlite::params;

use crate::sqlite::readers::Reader;

/// Attempts per state in a namespace, from the `attempts_state` index alone.
pub(crate) const COUNT_BY_STATE: &str = "SELECT state, count(*) AS attempts FROM attempts \
     WHERE namespace = ?1 GROUP BY state";

/// Attempts per state name in a namespace.
pub(crate) fn count_by_state(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(COUNT_BY_STATE, [namespace], |row| {
        Ok((row.get("state")?, row.get("attempts")?))
    })
}

pub(crate) const COUNT_LAPSED_LEASES: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' AND expires_at <= ?2";

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

/// Per queue: claim-order entries claimable at `?2`, and later.
pub(crate) const QUEUE_CLAIMABLE: &str = "SELECT queue, \
     sum(claimable_at <= ?2) AS due, sum(claimable_at > ?2) AS later \
     FROM tasks WHERE namespace = ?1 AND claimable_at IS NOT NULL GROUP BY queue";

/// Per queue: tasks claimable at `now` and later, from the claim order.
pub(crate) fn queue_claimable(
    reader: &Reader<'_>,
    namespace: &str,
    now: i64,
) -> rusqlite::Result<Vec<(String, i64, i64)>> {
    reader.all(QUEUE_CLAIMABLE, params![namespace, now], |row| {
        Ok((row.get("queue")?, row.get("due")?, row.get("later")?))
    })
}

/// Per queue: when the first-enqueued task a claim could take at `?2` was
/// enqueued. The smallest task row id per queue is a search of the claim
/// order alone (its entries end in the id); then one task row is read per
/// queue.
pub(crate) const QUEUE_OLDEST_READY: &str = "SELECT queue, created_at FROM tasks \
     WHERE id IN (SELECT min(id) FROM tasks WHERE namespace = ?1 \
     AND claimable_at IS NOT NULL AND claimable_at <= ?2 GROUP BY queue)";

/// Per queue: when its first-enqueued claimable task was enqueued.
pub(crate) fn queue_oldest_ready(
    reader: &Reader<'_>,
    namespace: &str,
    now: i64,
) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(QUEUE_OLDEST_READY, params![namespace, now], |row| {
        Ok((row.get("queue")?, row.get("created_at")?))
    })
}

/// Per queue: live and lapsed leases.
pub(crate) const QUEUE_LEASED: &str = "SELECT queue, count(*) AS leased FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' GROUP BY queue";

/// Per queue: leases, from the lease index.
pub(crate) fn queue_leased(
    reader: &Reader<'_>,
    namespace: &str,
) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(QUEUE_LEASED, [namespace], |row| {
        Ok((row.get("queue")?, row.get("leased")?))
    })
}
