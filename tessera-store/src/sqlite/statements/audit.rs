//! The `access_audit` and `access_day_counters` tables: audit events,
//! the per-minute counters, and their retention deletes.

use rusqlite::{Row, params};

use crate::backend::rows::{self, CounterRow, EventRow};
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const INSERT_EVENT: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Appends an audit event.
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

impl EventRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            at: row.get("at")?,
            principal: row.get("principal")?,
            namespace: row.get("namespace")?,
            action: row.get("action")?,
            outcome: row.get("outcome")?,
            resource: row.get("resource")?,
            ip_hash: row.get("ip_hash")?,
            id: row.get("id")?,
        })
    }
}

pub(crate) const EVENTS_OF_PRINCIPAL: &str = "SELECT at, principal, namespace, action, outcome, \
     resource, ip_hash, id FROM access_audit WHERE principal = ?1 AND at >= ?2 \
     AND at <= ?4 AND (at, id) < (?4, ?5) ORDER BY at DESC, id DESC LIMIT ?3";

/// The newest events from row id `?1` on (the first at or after the
/// time `?2`, see [`first_event_at_or_after`]) and below row id `?4` (a
/// cursor's): a range of the table's own b-tree, newest first.
pub(crate) const EVENTS_ALL: &str = "SELECT at, principal, namespace, action, outcome, \
     resource, ip_hash, id FROM access_audit WHERE id >= ?1 AND at >= ?2 AND id < ?4 \
     ORDER BY id DESC LIMIT ?3";

/// Newest first, at or after `since` and before the cursor `before`
/// (time and row id) if there is one.
pub(crate) fn events(
    reader: &Reader<'_>,
    principal: Option<&str>,
    since: i64,
    before: Option<(i64, i64)>,
    limit: i64,
) -> rusqlite::Result<Vec<EventRow>> {
    let (at, id) = before.unwrap_or((i64::MAX, i64::MAX));
    match principal {
        Some(principal) => reader.all(
            EVENTS_OF_PRINCIPAL,
            params![principal, since, limit, at, id],
            EventRow::from_row,
        ),
        None => {
            let from = first_event_at_or_after(reader, since)?;
            reader.all(
                EVENTS_ALL,
                params![from, since, limit, id],
                EventRow::from_row,
            )
        }
    }
}

/// The first event with a row id at or after `?1`.
pub(crate) const EVENT_FROM: &str =
    "SELECT id, at FROM access_audit WHERE id >= ?1 ORDER BY id LIMIT 1";

/// The lowest and highest event row ids.
pub(crate) const EVENT_SPAN: &str = "SELECT (SELECT min(id) FROM access_audit) AS low, \
     (SELECT max(id) FROM access_audit) AS high";

/// The row id from which every event is at or after `at`, and before
/// which every event is older (see
/// [`first_event_at_or_after`](rows::first_event_at_or_after)).
pub(crate) fn first_event_at_or_after(reader: &Reader<'_>, at: i64) -> rusqlite::Result<i64> {
    let span = reader.optional(EVENT_SPAN, [], |row| {
        Ok((
            row.get::<_, Option<i64>>("low")?,
            row.get::<_, Option<i64>>("high")?,
        ))
    })?;
    let span = span.and_then(|(low, high)| low.zip(high));
    rows::first_event_at_or_after(span, at, |id| {
        reader.optional(EVENT_FROM, [id], |row| {
            Ok((row.get::<_, i64>("id")?, row.get::<_, i64>("at")?))
        })
    })
}

/// The oldest events, below row id `?1` (the first at or after the cutoff
/// `?2`) and older than the cutoff, at most `?3`: a range of the table's
/// own b-tree from its start.
pub(crate) const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN \
     (SELECT id FROM access_audit WHERE id < ?1 AND at < ?2 ORDER BY id LIMIT ?3)";

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

/// Adds to the counter's row for its minute of the day: to its count if
/// the row holds the same minute, in place of it if the row holds an
/// older one (the same minute a day or more earlier); a row already on a
/// newer minute keeps it.
pub(crate) const ADD_TO_COUNTER: &str = "INSERT INTO access_day_counters \
     (day_minute, principal, namespace, action, outcome, minute, count) \
     VALUES (?1 % 1440, ?2, ?3, ?4, ?5, ?1, ?6) \
     ON CONFLICT (day_minute, principal, namespace, action, outcome) DO UPDATE SET \
     count = CASE WHEN minute = excluded.minute THEN count + excluded.count \
     WHEN minute < excluded.minute THEN excluded.count ELSE count END, \
     minute = max(minute, excluded.minute)";

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

impl CounterRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            minute: row.get("minute")?,
            principal: row.get("principal")?,
            namespace: row.get("namespace")?,
            action: row.get("action")?,
            outcome: row.get("outcome")?,
            count: row.get("count")?,
        })
    }
}

/// One principal's counters from minute `?2` on. The table holds at most
/// one day of each counter, so a read of the 24-hour window reads it
/// whole, as a search of it by minute would.
pub(crate) const COUNTERS_OF_PRINCIPAL: &str = "SELECT minute, principal, namespace, action, \
     outcome, count FROM access_day_counters WHERE minute >= ?2 AND principal = ?1 \
     ORDER BY minute DESC LIMIT ?3";

/// Every counter from minute `?1` on; see [`COUNTERS_OF_PRINCIPAL`].
pub(crate) const COUNTERS_ALL: &str = "SELECT minute, principal, namespace, action, outcome, \
     count FROM access_day_counters WHERE minute >= ?1 ORDER BY minute DESC LIMIT ?2";

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

/// Counters that went quiet: of the minutes of the day `?1` to `?2`
/// (exclusive), those whose row still holds a minute before `?3` (no
/// counter of theirs came since a day earlier), at most `?4`; found
/// through the clustered key's minute-of-day prefix.
pub(crate) const PURGE_COUNTERS: &str = "DELETE FROM access_day_counters \
     WHERE (day_minute, principal, namespace, action, outcome) IN \
     (SELECT day_minute, principal, namespace, action, outcome FROM access_day_counters \
     WHERE day_minute >= ?1 AND day_minute < ?2 AND minute < ?3 LIMIT ?4)";

/// The minutes of the day before a retention cutoff whose quiet counters
/// one retention run deletes: the last hour's. Retention runs every five
/// minutes while the store is maintained, so every minute of the day is
/// visited within an hour of passing the cutoff; a quiet counter whose
/// minute was missed (no maintenance that hour) waits for its minute to
/// come round again, and no read ever returns it meanwhile.
pub(crate) const PURGED_DAY_MINUTES: i64 = 60;

/// Minutes in a day: the `1440` of the counter statements' `% 1440`.
const DAY: i64 = 1440;

/// One retention batch of counters: up to `limit` of those that went quiet
/// in the [`PURGED_DAY_MINUTES`] minutes of the day before minute
/// `cutoff`; returns how many it deleted.
pub(crate) fn purge_counters(
    writer: &Writer<'_>,
    cutoff: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    let start = (cutoff - PURGED_DAY_MINUTES).rem_euclid(DAY);
    let end = cutoff.rem_euclid(DAY);
    // The band is one range of minutes of the day, or two across midnight.
    let ranges: &[(i64, i64)] = if start < end {
        &[(start, end)]
    } else {
        &[(start, DAY), (0, end)]
    };
    let mut deleted = 0;
    for (from, to) in ranges {
        let left = limit - i64::try_from(deleted).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        deleted += writer.execute(PURGE_COUNTERS, params![from, to, cutoff, left])?;
    }
    Ok(deleted)
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
                        id: 0,
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
