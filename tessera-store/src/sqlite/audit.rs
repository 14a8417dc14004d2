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

pub(crate) const EVENTS_ALL: &str = "SELECT at, principal, namespace, action, outcome, \
     resource, ip_hash FROM access_audit WHERE at >= ?1 ORDER BY at DESC LIMIT ?2";

/// One principal's counters: a search of the clustered key by minute
/// (from the retention cutoff on), filtered by principal.
pub(crate) const COUNTERS_OF_PRINCIPAL: &str = "SELECT minute, principal, namespace, action, \
     outcome, count FROM access_counters WHERE minute >= ?2 AND principal = ?1 \
     ORDER BY minute DESC LIMIT ?3";

pub(crate) const COUNTERS_ALL: &str = "SELECT minute, principal, namespace, action, outcome, \
     count FROM access_counters WHERE minute >= ?1 ORDER BY minute DESC LIMIT ?2";

pub(crate) const PURGE_EVENTS: &str = "DELETE FROM access_audit WHERE id IN \
     (SELECT id FROM access_audit WHERE at < ?1 ORDER BY at LIMIT ?2)";

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
        None => reader.all(EVENTS_ALL, params![since, limit], EventRow::from_row),
    }
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
