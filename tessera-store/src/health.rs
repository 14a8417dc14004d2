//! Per-namespace health snapshots: kept 15 s, dropped by any successful
//! state change in the namespace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_audit::{Action, Outcome};
use tessera_lease::{Namespace, StateName};

use crate::access::{Caller, Scope};
use crate::audit::ActionScope;
use crate::db::Reader;
use crate::error::{Error, corrupt};
use crate::sql::millis;
use crate::sql::tasks as sql;
use crate::store::Store;

/// How long a health snapshot is served before it is taken again.
pub const HEALTH_SNAPSHOT_TTL: Duration = Duration::from_secs(15);

/// The most namespaces whose snapshots are kept; past it the cache starts
/// afresh (a snapshot is only a saving, never the truth).
const CACHED_NAMESPACES: usize = 10_000;

/// Attempts per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateCounts {
    /// Waiting to be claimed.
    pub ready: u64,
    /// Under a lease (lapsed ones included until they are claimed or
    /// expired; see [`HealthSnapshot::expired_leases`]).
    pub leased: u64,
    /// Submitted.
    pub done: u64,
    /// Given up.
    pub failed: u64,
    /// Waiting out a retry or lapse backoff.
    pub backoff: u64,
}

impl StateCounts {
    /// Every attempt.
    pub fn total(&self) -> u64 {
        self.ready + self.leased + self.done + self.failed + self.backoff
    }
}

/// A namespace's health at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// The namespace.
    pub namespace: Namespace,
    /// When the snapshot was taken; it is served unchanged for up to
    /// [`HEALTH_SNAPSHOT_TTL`] unless the namespace changes.
    pub taken_at: DateTime<Utc>,
    /// Attempts per state.
    pub attempts: StateCounts,
    /// Leases that lapsed and have not yet been taken over or expired.
    pub expired_leases: u64,
}

#[derive(Debug)]
struct Cached {
    snapshot: HealthSnapshot,
    taken: Instant,
}

/// Snapshots by namespace, and a change counter that keeps a refresh which
/// raced a change from being cached.
#[derive(Debug, Default)]
pub(crate) struct HealthCache {
    snapshots: Mutex<HashMap<Namespace, Cached>>,
    changes: AtomicU64,
}

impl HealthCache {
    fn fresh(&self, namespace: &Namespace, now: Instant) -> Option<HealthSnapshot> {
        let snapshots = self.snapshots.lock();
        let cached = snapshots.get(namespace)?;
        (now.saturating_duration_since(cached.taken) < HEALTH_SNAPSHOT_TTL)
            .then(|| cached.snapshot.clone())
    }

    fn keep(&self, snapshot: &HealthSnapshot, taken: Instant, changes_before: u64) {
        let mut snapshots = self.snapshots.lock();
        if self.changes.load(Ordering::SeqCst) != changes_before {
            return;
        }
        if snapshots.len() >= CACHED_NAMESPACES {
            snapshots.clear();
        }
        let cached = Cached {
            snapshot: snapshot.clone(),
            taken,
        };
        snapshots.insert(snapshot.namespace.clone(), cached);
    }

    pub(crate) fn invalidate(&self, namespace: &Namespace) {
        let mut snapshots = self.snapshots.lock();
        self.changes.fetch_add(1, Ordering::SeqCst);
        snapshots.remove(namespace);
    }
}

/// Takes a snapshot: attempts per state from the `attempts_state` index
/// and the expired leases from the namespace's `attempts_leased` entries;
/// no task row, brief or lease row is read.
fn take(
    reader: &Reader<'_>,
    namespace: &Namespace,
    now: DateTime<Utc>,
) -> Result<HealthSnapshot, Error> {
    let mut attempts = StateCounts::default();
    for (state, count) in sql::count_by_state(reader, namespace.as_str())? {
        let count = u64::try_from(count).unwrap_or(0);
        match state.parse::<StateName>() {
            Ok(StateName::Ready) => attempts.ready += count,
            Ok(StateName::Leased) => attempts.leased += count,
            Ok(StateName::Done) => attempts.done += count,
            Ok(StateName::Failed) => attempts.failed += count,
            Ok(StateName::Backoff) => attempts.backoff += count,
            Err(_) => return Err(corrupt("attempt state")),
        }
    }
    let expired = sql::count_lapsed_leases(reader, namespace.as_str(), millis(now))?;
    Ok(HealthSnapshot {
        namespace: namespace.clone(),
        taken_at: now,
        attempts,
        expired_leases: u64::try_from(expired).unwrap_or(0),
    })
}

impl Store {
    /// The health of `namespace`: attempts per state and lapsed leases.
    ///
    /// Needs the `read` scope and the namespace grant. Served from a
    /// snapshot for up to 15 s (repeats read zero rows), dropped by any
    /// successful state change in the namespace.
    ///
    /// Not audited: health is an aggregate status read served from that
    /// snapshot, not a read of a resource, so it writes nothing (no audit
    /// row, no `last_used_at`) and a success is not counted; a denial or a
    /// failure is counted as `read_health`. It answers while writes are
    /// refused.
    pub fn health(&self, caller: &Caller, namespace: &Namespace) -> Result<HealthSnapshot, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ReadHealth)?;
        if let Some(snapshot) = self.health.fresh(namespace, self.clock().now()) {
            return Ok(snapshot);
        }
        self.read(|reader| self.refresh_health(reader, namespace))
            .inspect_err(|error| self.count(&scope, error.outcome()))
    }

    /// The health of a public namespace (see
    /// [`StoreConfig::with_public_namespace`](crate::StoreConfig::with_public_namespace)),
    /// for a request without a key.
    ///
    /// Performs no key, identity or namespace lookup: a namespace that is
    /// not public is `401` at once, a public one is served like
    /// [`health`](Self::health). Not audited either; counted, success
    /// included (there is no principal whose activity it is), so it writes
    /// nothing and answers while writes are refused.
    pub fn public_health(&self, namespace: &Namespace) -> Result<HealthSnapshot, Error> {
        let scope = ActionScope::new(None, Some(namespace), Action::ReadHealth);
        if !self.config.is_public(namespace) {
            self.count(&scope, Outcome::Unauthorized);
            return Err(Error::Unauthorized);
        }
        let snapshot = match self.health.fresh(namespace, self.clock().now()) {
            Some(snapshot) => snapshot,
            None => self
                .read(|reader| self.refresh_health(reader, namespace))
                .inspect_err(|error| self.count(&scope, error.outcome()))?,
        };
        self.count(&scope, Outcome::Ok);
        Ok(snapshot)
    }

    fn refresh_health(
        &self,
        reader: &Reader<'_>,
        namespace: &Namespace,
    ) -> Result<HealthSnapshot, Error> {
        let changes = self.health.changes.load(Ordering::SeqCst);
        let taken = self.clock().now();
        let snapshot = take(reader, namespace, self.now_utc())?;
        self.health.keep(&snapshot, taken, changes);
        Ok(snapshot)
    }

    /// Called after every successful state change in `namespace`.
    pub(crate) fn namespace_changed(&self, namespace: &Namespace) {
        self.health.invalidate(namespace);
    }
}
