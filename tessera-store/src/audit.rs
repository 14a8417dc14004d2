//! Audit persistence: one row per successful action in the action's own
//! transaction, buffered counters for everything else, and retention.
//!
//! The rules (what a row holds, when counters are due, when retention runs,
//! what is visible) are `tessera-audit`'s; this module carries them out.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::{
    Action, AuditEvent, Counter, CounterBatch, CounterKey, IpHash, Minute, Outcome, Resource,
    RetentionRun, RetentionSchedule, RetentionStep, visible_since,
};
use tessera_lease::Namespace;

use crate::access::{Caller, PrincipalId};
use crate::db::{Reader, Writer};
use crate::error::{Error, corrupt};
use crate::sql::access::touch_principal;
use crate::sql::audit::{self as sql, CounterRow, EventRow};
use crate::sql::{from_millis, millis};
use crate::store::Store;

/// The namespace recorded for actions that are not in one (key management,
/// authentication). No namespace name can be `*`.
pub const STORE_NAMESPACE: &str = "*";

/// The most events, and separately the most counters, one audit read
/// returns.
pub const MAX_AUDIT_ROWS: usize = 1000;

/// Who did what where: the fields an audit row or a counter shares.
#[derive(Debug, Clone)]
pub(crate) struct ActionScope {
    principal: Option<PrincipalId>,
    namespace: Option<Namespace>,
    action: Action,
    ip_hash: Option<IpHash>,
}

impl ActionScope {
    pub(crate) fn new(
        principal: Option<PrincipalId>,
        namespace: Option<&Namespace>,
        action: Action,
    ) -> Self {
        Self {
            principal,
            namespace: namespace.cloned(),
            action,
            ip_hash: None,
        }
    }

    /// `caller` doing `action`, with its address hash.
    pub(crate) fn of(caller: &Caller, namespace: Option<&Namespace>, action: Action) -> Self {
        Self {
            principal: Some(caller.principal()),
            namespace: namespace.cloned(),
            action,
            ip_hash: caller.ip_hash().cloned(),
        }
    }

    /// The same scope with the caller's hashed address group.
    pub(crate) fn with_ip_hash(mut self, ip_hash: IpHash) -> Self {
        self.ip_hash = Some(ip_hash);
        self
    }

    fn audit_namespace(&self) -> tessera_audit::Namespace {
        let name = self
            .namespace
            .as_ref()
            .map_or(STORE_NAMESPACE, Namespace::as_str);
        tessera_audit::Namespace::new(name).expect("namespace names are valid audit identifiers")
    }

    /// The audit row of this action having succeeded at `now`.
    pub(crate) fn event(&self, now: DateTime<Utc>, resource: Option<Resource>) -> AuditEvent {
        let principal = self.principal.map_or_else(
            || tessera_audit::Principal::new("-").expect("a valid identifier"),
            PrincipalId::audit_principal,
        );
        let mut event = AuditEvent::new(now, principal, self.audit_namespace(), self.action);
        event.resource = resource;
        event.ip_hash = self.ip_hash.clone();
        event
    }

    fn counter(&self, now: DateTime<Utc>, outcome: Outcome) -> CounterKey {
        CounterKey::new(
            now,
            self.principal.map(PrincipalId::audit_principal),
            self.audit_namespace(),
            self.action,
            outcome,
        )
    }
}

/// What a write action leaves behind (see [`Store::perform_or_count`]).
#[derive(Debug, Clone)]
pub(crate) enum Trail {
    /// Its audit row, naming this resource.
    Row(Option<Resource>),
    /// Nothing written; counted with this outcome.
    Count(Outcome),
}

/// Appends `event` inside `writer`'s transaction.
pub(crate) fn insert_event(writer: &Writer<'_>, event: &AuditEvent) -> Result<(), Error> {
    sql::insert_event(
        writer,
        &EventRow {
            at: millis(event.time),
            principal: event.principal.as_str().to_owned(),
            namespace: event.namespace.as_str().to_owned(),
            action: event.action.as_str().to_owned(),
            outcome: event.outcome.as_str().to_owned(),
            resource: event.resource.as_ref().map(|r| r.as_str().to_owned()),
            ip_hash: event.ip_hash.as_ref().map(|h| h.as_str().to_owned()),
        },
    )?;
    Ok(())
}

/// Writes `principal`'s due `last_used_at` as the transaction's optional
/// tail: a refusal or failure never fails the action it rides with.
fn carry_observation(writer: &Writer<'_>, due: Option<PrincipalId>, now: DateTime<Utc>) {
    if let Some(principal) = due {
        writer.optional(|writer| touch_principal(writer, principal.get(), millis(now)));
    }
}

/// Which audit rows [`Store::audit`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// Only this principal's rows; `None` is the caller's own, or everyone's
    /// for an admin. Another principal's rows need an admin key.
    pub principal: Option<PrincipalId>,
    /// Only rows at or after this time; rows older than the retention window
    /// are never returned anyway.
    pub since: Option<DateTime<Utc>>,
    /// At most this many events, newest first, and at most this many
    /// counters, newest minute first (1 to [`MAX_AUDIT_ROWS`]).
    pub limit: usize,
}

impl Default for AuditQuery {
    fn default() -> Self {
        Self {
            principal: None,
            since: None,
            limit: 100,
        }
    }
}

/// An audit read: events of successful actions and counters of the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    /// Newest first.
    pub events: Vec<AuditEvent>,
    /// Newest minute first.
    pub counters: Vec<Counter>,
}

/// What one [`Store::maintain`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    /// Counter rows written (each a row upserted).
    pub counters_written: u64,
    /// Whether a retention run started (at most once per five minutes).
    pub retention_ran: bool,
    /// Expired rows retention deleted.
    pub rows_deleted: u64,
}

/// The retention schedule and when its last run started (for
/// [`Store::next_maintenance`]).
#[derive(Debug, Default)]
pub(crate) struct Retention {
    schedule: RetentionSchedule,
    last_start: Option<DateTime<Utc>>,
}

impl Retention {
    fn start(&mut self, now: DateTime<Utc>) -> Option<RetentionRun> {
        let run = self.schedule.start(now)?;
        self.last_start = Some(now);
        Some(run)
    }
}

/// The tables retention deletes from, each by its own index: rows past the
/// window for events and counters, rows past their purge time for
/// anonymous principals, their keys and limit rows.
const RETENTION_TABLES: &[&str] = &[
    sql::PURGE_KEYS,
    sql::PURGE_PRINCIPALS,
    sql::PURGE_LIMITS,
    sql::PURGE_EVENTS,
    sql::PURGE_COUNTERS,
];

/// The first counter minute inside the window that starts at `cutoff`.
fn first_visible_minute(cutoff: DateTime<Utc>) -> i64 {
    millis(cutoff).div_euclid(60_000) + i64::from(millis(cutoff).rem_euclid(60_000) != 0)
}

impl EventRow {
    fn event(&self) -> Result<AuditEvent, Error> {
        let bad = |_| corrupt("audit row");
        Ok(AuditEvent {
            time: from_millis(self.at),
            principal: tessera_audit::Principal::new(&self.principal).map_err(bad)?,
            namespace: tessera_audit::Namespace::new(&self.namespace).map_err(bad)?,
            action: self.action.parse().map_err(bad)?,
            outcome: self.outcome.parse().map_err(bad)?,
            resource: self
                .resource
                .as_deref()
                .map(Resource::new)
                .transpose()
                .map_err(bad)?,
            ip_hash: self
                .ip_hash
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(bad)?,
        })
    }
}

impl CounterRow {
    fn from_counter(counter: &Counter) -> Self {
        let key = &counter.key;
        Self {
            minute: millis(key.minute().start()).div_euclid(60_000),
            principal: key
                .principal()
                .map_or_else(String::new, |p| p.as_str().to_owned()),
            namespace: key.namespace().as_str().to_owned(),
            action: key.action().as_str().to_owned(),
            outcome: key.outcome().as_str().to_owned(),
            count: i64::try_from(counter.count).unwrap_or(i64::MAX),
        }
    }

    fn counter(&self) -> Result<Counter, Error> {
        let bad = |_| corrupt("counter row");
        let start = self
            .minute
            .checked_mul(60_000)
            .and_then(DateTime::from_timestamp_millis)
            .ok_or_else(|| corrupt("counter row"))?;
        let principal = match self.principal.as_str() {
            "" => None,
            name => Some(tessera_audit::Principal::new(name).map_err(bad)?),
        };
        Ok(Counter {
            key: CounterKey::new(
                Minute::from_start(start).map_err(bad)?.start(),
                principal,
                tessera_audit::Namespace::new(&self.namespace).map_err(bad)?,
                self.action.parse().map_err(bad)?,
                self.outcome.parse().map_err(bad)?,
            ),
            count: u64::try_from(self.count).unwrap_or(0),
        })
    }
}

impl Store {
    /// Counts a request that is not audited (denied, failed, no-op) in
    /// memory; written later by the counter rules.
    pub(crate) fn count(&self, scope: &ActionScope, outcome: Outcome) {
        let counter = scope.counter(self.now_utc(), outcome);
        self.counters.lock().increment(counter);
    }

    /// Runs a write action at `now` (the time its lease, receipt or key
    /// carries): `work` and its audit row in one transaction. `work`
    /// returns its value and the resource the row names. A failure is
    /// counted with its outcome; after a success, due maintenance runs.
    pub(crate) fn perform<T>(
        &self,
        scope: &ActionScope,
        now: DateTime<Utc>,
        work: impl FnOnce(&Writer<'_>) -> Result<(T, Option<Resource>), Error>,
    ) -> Result<T, Error> {
        self.perform_or_count(scope, now, |writer| {
            let (value, resource) = work(writer)?;
            Ok((value, Trail::Row(resource)))
        })
    }

    /// [`perform`](Self::perform) for an action that may turn out to be a
    /// no-op: `work` says whether it leaves an audit row ([`Trail::Row`],
    /// written in the same transaction, with the principal's
    /// `last_used_at` if it is due) or is only counted ([`Trail::Count`],
    /// e.g. a replayed submission or an empty claim, which write nothing).
    pub(crate) fn perform_or_count<T>(
        &self,
        scope: &ActionScope,
        now: DateTime<Utc>,
        work: impl FnOnce(&Writer<'_>) -> Result<(T, Trail), Error>,
    ) -> Result<T, Error> {
        let due = self.due_observation(scope, now);
        let result = self.write_with_tail(|writer| {
            let (value, trail) = work(writer)?;
            if let Trail::Row(resource) = &trail {
                insert_event(writer, &scope.event(now, resource.clone()))?;
                carry_observation(writer, due, now);
            }
            Ok((value, trail))
        });
        match result {
            Ok(((value, Trail::Row(_)), carried)) => {
                self.observed(due, carried, now);
                self.after_write();
                Ok(value)
            }
            Ok(((value, Trail::Count(outcome)), _)) => {
                self.count(scope, outcome);
                Ok(value)
            }
            Err(error) => {
                self.count(scope, error.outcome());
                Err(error)
            }
        }
    }

    /// Writes the audit row of a read action that already answered (with
    /// the principal's `last_used_at` if it is due). If storage refuses the
    /// row for a quota, the read still answers and the loss is counted as
    /// `storage_quota_exhausted` for the action, unless the store was
    /// opened with strict read audit.
    pub(crate) fn audit_read(
        &self,
        scope: &ActionScope,
        resource: Option<Resource>,
    ) -> Result<(), Error> {
        let now = self.now_utc();
        let due = self.due_observation(scope, now);
        let result = self.write_with_tail(|writer| {
            insert_event(writer, &scope.event(now, resource))?;
            carry_observation(writer, due, now);
            Ok(())
        });
        match result {
            Ok(((), carried)) => {
                self.observed(due, carried, now);
                self.after_write();
                Ok(())
            }
            Err(error) if error.is_quota_exhausted() && !self.config.strict_read_audit() => {
                self.count(scope, Outcome::StorageQuotaExhausted);
                Ok(())
            }
            Err(error) => {
                self.count(scope, error.outcome());
                Err(error)
            }
        }
    }

    /// The principal whose `last_used_at` an audited action of `scope` at
    /// `now` carries, if it is due (see [`Store::authenticate`]).
    fn due_observation(&self, scope: &ActionScope, now: DateTime<Utc>) -> Option<PrincipalId> {
        let principal = scope.principal?;
        self.observations
            .lock()
            .is_due(&principal, now)
            .then_some(principal)
    }

    /// Records a carried `last_used_at` once its transaction committed.
    fn observed(&self, due: Option<PrincipalId>, committed: bool, now: DateTime<Utc>) {
        if let (Some(principal), true) = (due, committed) {
            self.observations.lock().written(&principal, now);
        }
    }

    /// Runs a read action on a read connection, then writes its audit row
    /// (see [`audit_read`](Self::audit_read)).
    pub(crate) fn perform_read<T>(
        &self,
        scope: &ActionScope,
        read: impl FnOnce(&Reader<'_>) -> Result<(T, Option<Resource>), Error>,
    ) -> Result<T, Error> {
        let (value, resource) = self
            .read(read)
            .inspect_err(|error| self.count(scope, error.outcome()))?;
        self.audit_read(scope, resource)?;
        Ok(value)
    }

    /// Maintenance that is due, after a successful write; its failures are
    /// left for the next time (a refusal is not retried in a loop).
    pub(crate) fn after_write(&self) {
        let _ = self.maintain();
    }

    /// Does what is due now: writes counters whose minute has passed (or all,
    /// once 1,024 distinct counters wait) and runs retention if five minutes
    /// have passed since the last run. The store calls it after every
    /// successful write; a host with a timer may call it at
    /// [`next_maintenance`](Self::next_maintenance), so counters reach
    /// storage even when no write happens. Each batch is its own
    /// transaction; the first failure stops the call.
    pub fn maintain(&self) -> Result<Maintenance, Error> {
        let now = self.now_utc();
        let mut report = Maintenance::default();
        let batch = self.counters.lock().take_due(now);
        if let Some(batch) = batch {
            report.counters_written = self.write_counters(batch, now)?;
        }
        let run = self.retention.lock().start(now);
        if let Some(run) = run {
            report.retention_ran = true;
            report.rows_deleted = self.run_retention(run, now)?;
        }
        Ok(report)
    }

    /// When [`maintain`](Self::maintain) next has something to do without
    /// another request: the earlier of the counter buffer's next due time
    /// and the next retention run.
    pub fn next_maintenance(&self) -> Option<DateTime<Utc>> {
        let counters = self.counters.lock().poll_timeout();
        let retention = self
            .retention
            .lock()
            .last_start
            .map(|last| last + RetentionSchedule::INTERVAL);
        match (counters, retention) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes every waiting counter now, whatever its minute; returns the
    /// rows written.
    pub fn flush_counters(&self) -> Result<u64, Error> {
        let now = self.now_utc();
        let batch = self.counters.lock().take_all();
        match batch {
            Some(batch) => self.write_counters(batch, now),
            None => Ok(0),
        }
    }

    /// Counts waiting in memory, not yet written.
    pub fn pending_counters(&self) -> u64 {
        self.counters.lock().total()
    }

    fn write_counters(&self, batch: CounterBatch, now: DateTime<Utc>) -> Result<u64, Error> {
        let result = self.write(|writer| {
            for counter in batch.counters() {
                sql::add_to_counter(writer, &CounterRow::from_counter(counter))?;
            }
            Ok(batch.counters().len() as u64)
        });
        let mut buffer = self.counters.lock();
        match result {
            Ok(rows) => {
                buffer.written(batch);
                Ok(rows)
            }
            Err(error) => {
                buffer.failed(batch, now);
                Err(error)
            }
        }
    }

    fn run_retention(&self, run: RetentionRun, now: DateTime<Utc>) -> Result<u64, Error> {
        let batch = i64::try_from(run.batch_size()).unwrap_or(i64::MAX);
        let mut deleted = 0;
        for statement in RETENTION_TABLES {
            let threshold = match *statement {
                sql::PURGE_EVENTS => millis(run.cutoff()),
                sql::PURGE_COUNTERS => first_visible_minute(run.cutoff()),
                _ => millis(now),
            };
            loop {
                let rows =
                    self.write(|writer| Ok(sql::purge(writer, statement, threshold, batch)?))?;
                deleted += rows as u64;
                if run.after_batch(rows) == RetentionStep::Stop {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// Audit events and counters: a caller's own, or (admin) anyone's or
    /// everyone's. Waiting counters are written first so the read sees
    /// them; if storage refuses that write, the read answers without them.
    /// Only rows inside the retention window are returned. Audited as
    /// `read_audit`.
    pub fn audit(&self, caller: &Caller, query: &AuditQuery) -> Result<AuditPage, Error> {
        let scope = ActionScope::of(caller, None, Action::ReadAudit);
        let principal = self.rows_of(
            caller,
            &scope,
            query.principal,
            "only an admin reads another principal's audit",
        )?;
        match self.flush_counters() {
            Ok(_) => {}
            Err(error) if error.is_quota_exhausted() => {}
            Err(error) => {
                self.count(&scope, error.outcome());
                return Err(error);
            }
        }
        let now = self.now_utc();
        let window = visible_since(now);
        let since = query.since.map_or(window, |since| since.max(window));
        let limit = i64::try_from(query.limit.clamp(1, MAX_AUDIT_ROWS)).unwrap_or(1);
        let name = principal.map(|p| p.to_string());
        self.perform_read(&scope, |reader| {
            let events = sql::events(reader, name.as_deref(), millis(since), limit)?
                .iter()
                .map(EventRow::event)
                .collect::<Result<Vec<_>, _>>()?;
            let counters =
                sql::counters(reader, name.as_deref(), first_visible_minute(since), limit)?
                    .iter()
                    .map(CounterRow::counter)
                    .collect::<Result<Vec<_>, _>>()?;
            Ok((AuditPage { events, counters }, None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{KeySpec, insert_key};
    use crate::{Grant, ManualClock, StoreConfig};
    use chrono::TimeZone;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn anonymous_principals_their_keys_and_limits_are_purged_keyed_ones_kept() {
        let start = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let clock = ManualClock::new(start);
        let store =
            Store::open_in_memory(StoreConfig::default().with_clock(Arc::new(clock.clone())))
                .unwrap();
        let admin = store.create_admin_key("ops").unwrap();
        let purge_at = start + chrono::TimeDelta::hours(1);
        let session = store
            .write(|writer| {
                let issued = insert_key(
                    writer,
                    &KeySpec::anonymous("demo").with_grant(Grant::AllNamespaces),
                    start,
                    Some(purge_at),
                )?;
                writer.execute(
                    "INSERT INTO access_limits (subject, window_start, count, purge_at) \
                     VALUES ('mint:group', ?1, 1, ?2)",
                    [millis(start), millis(purge_at)],
                )?;
                Ok(issued)
            })
            .unwrap();
        assert_eq!(session.info.expires_at, Some(purge_at));
        assert!(store.authenticate(Some(session.secret.expose())).is_ok());

        clock.advance(Duration::from_secs(2 * 3600));
        // Past its purge time the key no longer works, even before retention.
        assert!(store.authenticate(Some(session.secret.expose())).is_err());
        let report = store.maintain().unwrap();
        assert!(report.retention_ran);
        // Its key, its principal and its limit row.
        assert_eq!(report.rows_deleted, 3);
        assert!(store.authenticate(Some(admin.secret.expose())).is_ok());
        let left: i64 = store
            .read(|reader| {
                Ok(reader
                    .optional("SELECT count(*) FROM access_principals", [], |row| {
                        row.get(0)
                    })?
                    .unwrap_or(0))
            })
            .unwrap();
        assert_eq!(left, 1);
    }

    #[test]
    fn the_first_visible_minute_starts_inside_the_window() {
        let on_minute = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        assert_eq!(first_visible_minute(on_minute), millis(on_minute) / 60_000);
        let inside = on_minute + chrono::TimeDelta::milliseconds(1);
        assert_eq!(first_visible_minute(inside), millis(on_minute) / 60_000 + 1);
    }

    #[test]
    fn counter_rows_round_trip() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 30).unwrap();
        let scope = ActionScope::new(Some(PrincipalId::parse("p3").unwrap()), None, Action::Claim);
        let counter = Counter {
            key: scope.counter(now, Outcome::Empty),
            count: 5,
        };
        let row = CounterRow::from_counter(&counter);
        assert_eq!(row.principal, "p3");
        assert_eq!(row.namespace, STORE_NAMESPACE);
        assert_eq!(row.counter().unwrap(), counter);
        let anonymous = ActionScope::new(None, None, Action::Authenticate);
        let counter = Counter {
            key: anonymous.counter(now, Outcome::Unauthorized),
            count: 1,
        };
        let row = CounterRow::from_counter(&counter);
        assert_eq!(row.principal, "");
        assert_eq!(row.counter().unwrap(), counter);
    }
}
