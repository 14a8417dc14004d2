//! Counts for the health snapshot and the queue limits: attempts by
//! state, queue depths, leases of a queue or a partition.

/// A namespace's attempts counted by state: the leased ones from
/// `attempts_lapse_order`, the rest from `attempts_at_rest`.
pub(in crate::postgres) const COUNT_BY_STATE: &str = "SELECT state, count(*) FROM attempts \
     WHERE namespace = $1 AND state <> 'leased' GROUP BY state \
     UNION ALL SELECT 'leased', count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' HAVING count(*) > 0";
/// Per queue: claim-order entries claimable at `$2`, and later.
pub(in crate::postgres) const QUEUE_CLAIMABLE: &str = "SELECT queue, \
     count(*) FILTER (WHERE claimable_at <= $2), count(*) FILTER (WHERE claimable_at > $2) \
     FROM tasks WHERE namespace = $1 AND claimable_at IS NOT NULL GROUP BY queue";
/// Per queue: when the first-enqueued task a claim could take at `$2` was
/// enqueued: the smallest row id per queue from the claim order, then one
/// task row per queue.
pub(in crate::postgres) const QUEUE_OLDEST_READY: &str = "SELECT queue, created_at FROM tasks \
     WHERE id IN (SELECT min(id) FROM tasks WHERE namespace = $1 \
     AND claimable_at IS NOT NULL AND claimable_at <= $2 GROUP BY queue)";
/// Per queue: live and lapsed leases.
pub(in crate::postgres) const QUEUE_LEASED: &str = "SELECT queue, count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' GROUP BY queue";
pub(in crate::postgres) const COUNT_LAPSED: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = $1 AND state = 'leased' AND expires_at <= $2";
/// The leased attempts of a queue, from `attempts_lapse_order`.
pub(in crate::postgres) const LEASED_IN_QUEUE: &str = "SELECT count(*) FROM attempts \
     WHERE namespace = $1 AND queue = $2 AND state = 'leased'";
/// The leased attempts of one partition of a queue.
pub(in crate::postgres) const LEASED_IN_PARTITION: &str = "SELECT count(*) FROM attempts a \
     JOIN tasks t ON t.id = a.task WHERE a.namespace = $1 AND a.queue = $2 \
     AND a.state = 'leased' AND t.partition_key = $3";
