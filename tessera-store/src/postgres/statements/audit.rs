//! The audit rows and per-minute counters, their pages and their
//! retention.

pub(in crate::postgres) const INSERT_EVENT: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
pub(in crate::postgres) const ADD_TO_COUNTER: &str = "INSERT INTO access_counters \
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
pub(in crate::postgres) const EVENTS_OF_PRINCIPAL: &str = concat!(
    event_columns!(),
    "WHERE principal = $1 AND at >= $2 AND at <= $4 AND (at, id) < ($4, $5) \
     ORDER BY at DESC, id DESC LIMIT $3"
);
/// Every event at or after `$1`, newest written first, below the cursor's
/// row id `$3`: a backward range of the primary key, as SQLite reads its
/// row ids, so a page reads no row it does not return.
pub(in crate::postgres) const EVENTS_ALL: &str = concat!(
    event_columns!(),
    "WHERE at >= $1 AND id < $3 ORDER BY id DESC LIMIT $2"
);
macro_rules! counter_columns {
    () => {
        "SELECT minute, principal, namespace, action, outcome, count FROM access_counters "
    };
}
pub(in crate::postgres) const COUNTERS_OF_PRINCIPAL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $2 AND principal = $1 ORDER BY minute DESC LIMIT $3"
);
pub(in crate::postgres) const COUNTERS_ALL: &str = concat!(
    counter_columns!(),
    "WHERE minute >= $1 ORDER BY minute DESC LIMIT $2"
);
/// The oldest events, below row id `$1` (the first at or after the cutoff
/// `$2`, see [`first_event_at_or_after`](crate::backend::rows::first_event_at_or_after))
/// and older than the cutoff, at most `$3`: a range of the primary key
/// from its start.
pub(in crate::postgres) const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN (SELECT id FROM access_audit \
     WHERE id < $1 AND at < $2 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED)";
/// The first event with a row id at or after `$1`.
pub(in crate::postgres) const EVENT_FROM: &str =
    "SELECT id, at FROM access_audit WHERE id >= $1 ORDER BY id LIMIT 1";
/// The lowest and highest event row ids.
pub(in crate::postgres) const EVENT_SPAN: &str =
    "SELECT (SELECT min(id) FROM access_audit), (SELECT max(id) FROM access_audit)";
pub(in crate::postgres) const PURGE_COUNTERS: &str = "DELETE FROM access_counters \
     WHERE (minute, principal, namespace, action, outcome) IN \
     (SELECT minute, principal, namespace, action, outcome FROM access_counters \
     WHERE minute < $1 ORDER BY minute LIMIT $2 FOR UPDATE SKIP LOCKED)";
