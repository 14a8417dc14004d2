//! Audit events, counters, and retention deletes.

use rusqlite::{Row, params};

use super::connection::{Reader, Writer};
use crate::backend::rows::{CounterRow, EventRow};

pub(crate) const INSERT_EVENT: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

pub(crate) const ADD_TO_COUNTER: &str = "INSERT INTO access_counters \
     (minute, principal, namespace, action, outcome, count) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
     ON CONFLICT (minute, principal, namespace, action, outcome) \
     DO UPDATE SET count = count + excluded.count";

pub(crate) const EVENTS_OF_PRINCIPAL: &str = "SELECT at, principal, namespace, action, outcome, \
     resource, ip_hash FROM access_audit WHERE principal = ?1 AND at >= ?2 \
     ORDER BY at DESC LIMIT ?3";

/// The newest events from row id `?1` on (the first at or after the
/// time `?2`, see [`first_event_at_or_after`]): a range of the table's own
/// b-tree, newest first.
pub(crate) const EVENTS_ALL: &str = "SELECT at, principal, namespace, action, outcome, \
     resource, ip_hash FROM access_audit WHERE id >= ?1 AND at >= ?2 \
     ORDER BY id DESC LIMIT ?3";

/// The first event with a row id at or after `?1`.
pub(crate) const EVENT_FROM: &str =
    "SELECT id, at FROM access_audit WHERE id >= ?1 ORDER BY id LIMIT 1";

/// The lowest and highest event row ids.
pub(crate) const EVENT_SPAN: &str = "SELECT (SELECT min(id) FROM access_audit), \
     (SELECT max(id) FROM access_audit)";

/// One principal's counters: a search of the clustered key by minute
/// (from the retention cutoff on), filtered by principal.
pub(crate) const COUNTERS_OF_PRINCIPAL: &str = "SELECT minute, principal, namespace, action, \
     outcome, count FROM access_counters WHERE minute >= ?2 AND principal = ?1 \
     ORDER BY minute DESC LIMIT ?3";

pub(crate) const COUNTERS_ALL: &str = "SELECT minute, principal, namespace, action, outcome, \
     count FROM access_counters WHERE minute >= ?1 ORDER BY minute DESC LIMIT ?2";

/// The oldest events, below row id `?1` (the first at or after the cutoff
/// `?2`) and older than the cutoff, at most `?3`: a range of the table's
/// own b-tree from its start.
pub(crate) const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN \
     (SELECT id FROM access_audit WHERE id < ?1 AND at < ?2 ORDER BY id LIMIT ?3)";

/// The oldest counters before minute `?1`, at most `?2`, found and deleted
/// through the clustered key's minute prefix.
pub(crate) const PURGE_COUNTERS: &str = "DELETE FROM access_counters \
     WHERE (minute, principal, namespace, action, outcome) IN \
     (SELECT minute, principal, namespace, action, outcome FROM access_counters \
     WHERE minute < ?1 ORDER BY minute LIMIT ?2)";

pub(crate) const PURGE_KEYS: &str = "DELETE FROM access_keys WHERE id IN \
     (SELECT id FROM access_keys WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

pub(crate) const PURGE_PRINCIPALS: &str = "DELETE FROM access_principals WHERE id IN \
     (SELECT id FROM access_principals WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

pub(crate) const PURGE_LIMITS: &str = "DELETE FROM access_limits WHERE id IN \
     (SELECT id FROM access_limits WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

impl EventRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            at: row.get(0)?,
            principal: row.get(1)?,
            namespace: row.get(2)?,
            action: row.get(3)?,
            outcome: row.get(4)?,
            resource: row.get(5)?,
            ip_hash: row.get(6)?,
        })
    }
}

impl CounterRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            minute: row.get(0)?,
            principal: row.get(1)?,
            namespace: row.get(2)?,
            action: row.get(3)?,
            outcome: row.get(4)?,
            count: row.get(5)?,
        })
    }
}

pub(crate) fn insert_event(writer: &Writer<'_>, event: &EventRow) -> rusqlite::Result<()> {
    writer
        .execute(
            INSERT_EVENT,
            params![
                event.at,
                event.principal,
                event.namespace,
                event.action,
                event.outcome,
                event.resource,
                event.ip_hash
            ],
        )
        .map(drop)
}

/// Adds `counter.count` to its row, creating it if needed.
pub(crate) fn add_to_counter(writer: &Writer<'_>, counter: &CounterRow) -> rusqlite::Result<()> {
    writer
        .execute(
            ADD_TO_COUNTER,
            params![
                counter.minute,
                counter.principal,
                counter.namespace,
                counter.action,
                counter.outcome,
                counter.count
            ],
        )
        .map(drop)
}

/// Newest first, at or after `since`.
pub(crate) fn events(
    reader: &Reader<'_>,
    principal: Option<&str>,
    since: i64,
    limit: i64,
) -> rusqlite::Result<Vec<EventRow>> {
    match principal {
        Some(principal) => reader.all(
            EVENTS_OF_PRINCIPAL,
            params![principal, since, limit],
            EventRow::from_row,
        ),
        None => {
            let from = first_event_at_or_after(reader, since)?;
            reader.all(EVENTS_ALL, params![from, since, limit], EventRow::from_row)
        }
    }
}

/// The row id from which every event is at or after `at`, and before
/// which every event is older: audit rows are appended in time order, so
/// the time of the first row at or after an id grows with the id, and a
/// binary search of the row ids finds the bound in O(log n) probes of
/// O(log n) each. Were the clock ever set back, an event written after
/// that could sit below the bound (listings skip it, and retention deletes
/// it only once every row before it is older than the cutoff); none is
/// ever read or deleted early, as both filter by time too.
pub(crate) fn first_event_at_or_after(reader: &Reader<'_>, at: i64) -> rusqlite::Result<i64> {
    let span = reader.optional(EVENT_SPAN, [], |row| {
        Ok((row.get::<_, Option<i64>>(0)?, row.get::<_, Option<i64>>(1)?))
    })?;
    let Some((Some(mut low), Some(last))) = span else {
        return Ok(0);
    };
    // The answer is in low..=high; high is one past the last row.
    let mut high = last.saturating_add(1);
    while low < high {
        let middle = low + (high - low) / 2;
        match reader.optional(EVENT_FROM, [middle], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
        })? {
            Some((_, time)) if time >= at => high = middle,
            Some((id, _)) => low = id.saturating_add(1),
            None => high = middle,
        }
    }
    Ok(low)
}

/// One retention batch of events: up to `limit` of the oldest, older than
/// `threshold`; returns how many it deleted.
pub(crate) fn purge_events(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    let below = first_event_at_or_after(writer, threshold)?;
    writer.execute(PURGE_EVENTS, params![below, threshold, limit])
}

/// Newest minute first, at or after minute `since`.
pub(crate) fn counters(
    reader: &Reader<'_>,
    principal: Option<&str>,
    since: i64,
    limit: i64,
) -> rusqlite::Result<Vec<CounterRow>> {
    match principal {
        Some(principal) => reader.all(
            COUNTERS_OF_PRINCIPAL,
            params![principal, since, limit],
            CounterRow::from_row,
        ),
        None => reader.all(COUNTERS_ALL, params![since, limit], CounterRow::from_row),
    }
}

/// One retention batch: deletes up to `limit` rows of one table whose time
/// is past `threshold`; returns how many it deleted.
pub(crate) fn purge(
    writer: &Writer<'_>,
    statement: &'static str,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(statement, params![threshold, limit])
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use proptest::prelude::*;

    use super::*;
    use crate::sqlite::{SqliteBackend, SqliteOptions};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Events appended in time order, some deleted: the bound splits
        /// them into those older than the time and those at or after it.
        #[test]
        fn the_row_id_bound_splits_events_by_time(
            steps in proptest::collection::vec((0_i64..3, any::<bool>()), 0..60),
            target in 0_i64..200,
        ) {
            let backend = SqliteBackend::for_tests(SqliteOptions::in_memory());
            let mut at = 0;
            backend.writer.connection().transaction(Utc::now(), &backend.meter, &backend.rules, |w| {
                for (step, keep) in &steps {
                    at += step;
                    let event = EventRow {
                        at,
                        principal: "p".into(),
                        namespace: "n".into(),
                        action: "claim".into(),
                        outcome: "ok".into(),
                        resource: None,
                        ip_hash: None,
                    };
                    insert_event(w, &event)?;
                    if !keep {
                        w.execute("DELETE FROM access_audit WHERE id = ?1", [w.last_insert_rowid()])?;
                    }
                }
                Ok(())
            }).unwrap();
            let (bound, rows) = backend.with_reader(|reader| {
                let bound = first_event_at_or_after(reader, target)?;
                let rows = reader.all("SELECT id, at FROM access_audit", [], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
                })?;
                Ok((bound, rows))
            }).unwrap();
            for (id, at) in rows {
                prop_assert_eq!(id >= bound, at >= target, "row {} at {} bound {}", id, at, bound);
            }
        }
    }
}
