//! Health reads: keyed and public, served from the snapshot cache.

use std::sync::atomic::Ordering;

use tessera_audit::{Action, Outcome};
use tessera_lease::Namespace;

use crate::backend::ReadTransaction;
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::audit::ActionScope;
use crate::model::health::HealthSnapshot;
use crate::store::Store;

impl Store {
    /// The health snapshots this store holds now, each as last taken (a
    /// namespace changed since has none until it is read again): for a
    /// metrics scrape that must cost no read. Not audited.
    pub fn cached_health(&self) -> Vec<HealthSnapshot> {
        self.health.all()
    }

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
        reader: &dyn ReadTransaction,
        namespace: &Namespace,
    ) -> Result<HealthSnapshot, Error> {
        let changes = self.health.changes.load(Ordering::SeqCst);
        let taken = self.clock().now();
        let now = self.now_utc();
        // Attempts per state and the expired leases, from indexes alone: no
        // task row, brief or lease row is read.
        let (attempts, expired_leases) = reader.health(namespace, now)?;
        // One row per configured queue; none for a namespace without any.
        let queues = reader.namespace_queue_settings(namespace)?;
        // Per queue, its unfinished tasks: one index entry read for each.
        let depths = reader.queue_depths(namespace, now)?;
        let snapshot = HealthSnapshot {
            namespace: namespace.clone(),
            taken_at: now,
            attempts,
            expired_leases,
            queues,
            depths,
        };
        self.health.keep(&snapshot, taken, changes);
        Ok(snapshot)
    }

    /// Called after every successful state change in `namespace`.
    pub(crate) fn namespace_changed(&self, namespace: &Namespace) {
        self.health.invalidate(namespace);
    }
}
