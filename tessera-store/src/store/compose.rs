//! The audit composition every operation runs through: which audit row
//! or counter each outcome leaves, in which transaction, and the
//! maintenance a successful write makes due.

use chrono::{DateTime, Utc};
use tessera_audit::{Outcome, Resource};

use crate::backend::{ReadTransaction, WriteTransaction};
use crate::error::Error;
use crate::model::access::PrincipalId;
use crate::model::audit::{ActionScope, Trail};
use crate::store::Store;

/// Writes `principal`'s due `last_used_at` as the transaction's optional
/// tail: a refusal or failure never fails the action it rides with.
pub(crate) fn carry_observation(
    writer: &dyn WriteTransaction,
    due: Option<PrincipalId>,
    now: DateTime<Utc>,
) {
    if let Some(principal) = due {
        writer.optional(&mut |writer| writer.touch_principal(principal, now));
    }
}

impl Store {
    /// Counts a request that is not audited (denied, failed, no-op) in
    /// memory. Such a request never writes, but at the buffer's bound: once
    /// 1,024 distinct counters wait it writes them, so a stream of requests
    /// that write nothing cannot grow the buffer without limit. Counters
    /// whose minute has passed are written by [`Store::maintain`] (which a
    /// host runs at [`Store::next_maintenance`], and the store after each
    /// successful write) or before an audit read. A failed write is left
    /// to the buffer's retry delay.
    pub(crate) fn count(&self, scope: &ActionScope, outcome: Outcome) {
        let now = self.now_utc();
        if outcome == Outcome::StorageQuotaExhausted {
            crate::observe::quota_refused(scope.action());
            // A provider's quota resets at the next 00:00 UTC, as the
            // refusal's `reset_at` says.
            *self.quota_refused_until.lock() = Some(tessera_admission::next_utc_midnight(now));
        }
        let full = {
            let mut counters = self.counters.lock();
            counters.increment(scope.counter(now, outcome));
            counters.take_full(now)
        };
        if let Some(batch) = full {
            let _ = self.write_counters(batch, now);
        }
    }

    /// Runs a write action at `now` (the time its lease, receipt or key
    /// carries): `work` and its audit row in one transaction. `work`
    /// returns its value and the resource the row names. A failure is
    /// counted with its outcome; after a success, due maintenance runs.
    pub(crate) fn perform<T>(
        &self,
        scope: &ActionScope,
        now: DateTime<Utc>,
        mut work: impl FnMut(&dyn WriteTransaction) -> Result<(T, Option<Resource>), Error>,
    ) -> Result<T, Error> {
        self.perform_or_count(scope, now, |writer| {
            let (value, resource) = work(writer)?;
            Ok((value, Trail::Row(resource)))
        })
    }

    /// [`perform`](Self::perform) for an action that may turn out to be a
    /// no-op: `work` says whether it leaves an audit row ([`Trail::Row`],
    /// written in the same transaction, or [`Trail::Written`] by the work
    /// itself, with the principal's
    /// `last_used_at` if it is due) or is only counted ([`Trail::Count`],
    /// e.g. a replayed submission or an empty claim, which write nothing).
    pub(crate) fn perform_or_count<T>(
        &self,
        scope: &ActionScope,
        now: DateTime<Utc>,
        mut work: impl FnMut(&dyn WriteTransaction) -> Result<(T, Trail), Error>,
    ) -> Result<T, Error> {
        let _span = crate::observe::operation(scope);
        let due = self.due_observation(scope, now);
        let result = self.write_with_tail(|writer| {
            let (value, trail) = work(writer)?;
            match &trail {
                Trail::Row(resource) => {
                    writer.insert_event(&scope.event(now, resource.clone()))?;
                    carry_observation(writer, due, now);
                }
                Trail::Written => carry_observation(writer, due, now),
                Trail::Count(_) => {}
            }
            Ok((value, trail))
        });
        match result {
            Ok(((value, Trail::Row(_) | Trail::Written), carried)) => {
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
            writer.insert_event(&scope.event(now, resource.clone()))?;
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
    pub(crate) fn due_observation(
        &self,
        scope: &ActionScope,
        now: DateTime<Utc>,
    ) -> Option<PrincipalId> {
        let principal = scope.principal?;
        self.observations
            .lock()
            .is_due(&principal, now)
            .then_some(principal)
    }

    /// Records a carried `last_used_at` once its transaction committed.
    pub(crate) fn observed(&self, due: Option<PrincipalId>, committed: bool, now: DateTime<Utc>) {
        if let (Some(principal), true) = (due, committed) {
            self.observations.lock().written(&principal, now);
        }
    }

    /// Runs a read action on a read connection, then writes its audit row
    /// (see [`audit_read`](Self::audit_read)).
    pub(crate) fn perform_read<T>(
        &self,
        scope: &ActionScope,
        read: impl FnMut(&dyn ReadTransaction) -> Result<(T, Option<Resource>), Error>,
    ) -> Result<T, Error> {
        let _span = crate::observe::operation(scope);
        let (value, resource) = self
            .read(read)
            .inspect_err(|error| self.count(scope, error.outcome()))?;
        self.audit_read(scope, resource)?;
        Ok(value)
    }

    /// Maintenance that is due, after a successful write; its failures are
    /// left for the next time (a refusal is not retried in a loop).
    pub(crate) fn after_write(&self) {
        *self.quota_refused_until.lock() = None;
        let _ = self.maintain();
    }
}
