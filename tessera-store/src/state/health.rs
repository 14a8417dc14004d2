//! Per-namespace health snapshots: kept 15 s, dropped by any successful
//! state change in the namespace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tessera_lease::Namespace;

use crate::model::health::{HEALTH_SNAPSHOT_TTL, HealthSnapshot};

/// The most namespaces whose snapshots are kept; past it the cache starts
/// afresh (a snapshot is only a saving, never the truth).
const CACHED_NAMESPACES: usize = 10_000;

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
    pub(crate) changes: AtomicU64,
}

impl HealthCache {
    pub(crate) fn fresh(&self, namespace: &Namespace, now: Instant) -> Option<HealthSnapshot> {
        let snapshots = self.snapshots.lock();
        let cached = snapshots.get(namespace)?;
        (now.saturating_duration_since(cached.taken) < HEALTH_SNAPSHOT_TTL)
            .then(|| cached.snapshot.clone())
    }

    pub(crate) fn keep(&self, snapshot: &HealthSnapshot, taken: Instant, changes_before: u64) {
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

    /// Every snapshot held, however old.
    pub(crate) fn all(&self) -> Vec<HealthSnapshot> {
        self.snapshots
            .lock()
            .values()
            .map(|cached| cached.snapshot.clone())
            .collect()
    }

    pub(crate) fn invalidate(&self, namespace: &Namespace) {
        let mut snapshots = self.snapshots.lock();
        self.changes.fetch_add(1, Ordering::SeqCst);
        snapshots.remove(namespace);
    }
}
