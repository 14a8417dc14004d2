//! Bulk actions by filter: an operator's cancel or retry of every task a
//! [`BulkFilter`] matches, paged in transactions of [`BULK_BATCH`] tasks.

use std::collections::HashSet;

use tessera_audit::Action;
use tessera_lease::{LeaseError, Namespace, Task};

use crate::backend::{TaskChange, TaskHandle, WriteTransaction};
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::audit::Trail;
use crate::model::bulk::{BULK_BATCH, BulkFilter, BulkPosition};
use crate::model::task::TaskRef;
use crate::ops::dependency;
use crate::store::Store;

/// A lease rule an operator applies to one task.
type Rule = fn(&mut Task) -> Result<Vec<tessera_lease::AttemptNumber>, LeaseError>;

impl Store {
    /// Cancels every task of `namespace` with an attempt that matches
    /// `filter`, as [`cancel_task`](Self::cancel_task) cancels one: its
    /// attempts not yet final become cancelled, and the holder of a
    /// leased one learns it at its next heartbeat, submit or failure
    /// report (`409 task_cancelled`). A task with nothing left to cancel
    /// is passed over. Returns how many tasks it changed.
    ///
    /// Paged: each transaction takes at most [`BULK_BATCH`] tasks from one
    /// range of an index on (namespace, changed_at, task, attempt) of the
    /// attempts at rest, then of the leases in flight, so no
    /// call holds the writer for long, and each batch that changed tasks
    /// writes one audit row, `cancel_tasks`, naming the filter and how
    /// many it changed (`filter:queue=…,state=…/n200`). Only attempts whose
    /// state changed at or before the call's start are looked at, so the
    /// scan ends. A failure after some batches committed leaves those
    /// committed. Needs the `enqueue` scope and the namespace grant.
    pub fn cancel_tasks(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        filter: &BulkFilter,
    ) -> Result<u64, Error> {
        self.bulk(caller, namespace, filter, Action::CancelTasks, Task::cancel)
    }

    /// Retries every task of `namespace` with an attempt that matches
    /// `filter`, as [`retry_task`](Self::retry_task) retries one: its
    /// failed, discarded and cancelled attempts become ready again, with
    /// one more try if they were out of tries. A task with nothing to
    /// retry, or with an attempt that has had
    /// [`MAX_TRIES`](tessera_lease::MAX_TRIES) tries, is passed over.
    /// Returns how many tasks it changed. Paged and audited
    /// (`retry_tasks`) as [`cancel_tasks`](Self::cancel_tasks) is, with
    /// the same permissions.
    pub fn retry_tasks(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        filter: &BulkFilter,
    ) -> Result<u64, Error> {
        self.bulk(caller, namespace, filter, Action::RetryTasks, Task::retry)
    }

    fn bulk(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        filter: &BulkFilter,
        action: Action,
        rule: Rule,
    ) -> Result<u64, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, action)?;
        let upto = self.now_utc();
        let mut after = BulkPosition::start(filter);
        let mut total = 0_u64;
        // The tasks this call changed, so none is changed twice: another
        // process whose clock is behind this one's can move a task changed
        // here back into the scan, ahead of its position, stamped before
        // the call began.
        let mut done: HashSet<TaskHandle> = HashSet::new();
        loop {
            let now = self.now_utc();
            let (changed, next) = self.perform_or_count(&scope, now, |writer| {
                let (changed, next) =
                    batch(writer, namespace, filter, after, upto, now, rule, &done)?;
                let trail = if changed.is_empty() {
                    Trail::Count(tessera_audit::Outcome::Ok)
                } else {
                    Trail::Row(filter.resource(changed.len()))
                };
                Ok(((changed, next), trail))
            })?;
            if !changed.is_empty() {
                total += changed.len() as u64;
                done.extend(changed);
                self.namespace_changed(namespace);
            }
            match next {
                Some(position) => after = position,
                None => break,
            }
        }
        Ok(total)
    }
}

/// One batch: up to [`BULK_BATCH`] tasks with an attempt matching after
/// `after`, each locked, ruled on and written at `now`, but those of
/// `done`, which the call changed already. Returns the tasks it changed,
/// and where the next batch starts (`None`: the scan is done).
#[allow(clippy::too_many_arguments)]
fn batch(
    writer: &dyn WriteTransaction,
    namespace: &Namespace,
    filter: &BulkFilter,
    after: BulkPosition,
    upto: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
    rule: Rule,
    done: &HashSet<TaskHandle>,
) -> Result<(Vec<TaskHandle>, Option<BulkPosition>), Error> {
    // Attempts, not tasks, are paged: a task with several matching
    // attempts takes several of the page, and is ruled on once.
    let found = writer.attempts_matching(namespace, filter, after, upto, BULK_BATCH)?;
    let next = if found.len() == BULK_BATCH {
        found.last().map(|(position, _)| *position)
    } else {
        after.after_at_rest(filter)
    };
    let mut refs: Vec<&TaskRef> = found.iter().map(|(_, task)| task).collect();
    refs.sort_unstable();
    refs.dedup();
    let loaded = writer.lock_tasks(&refs)?;
    let mut ruled = Vec::with_capacity(loaded.len());
    for loaded in loaded.into_iter().flatten() {
        if done.contains(&loaded.handle) {
            continue;
        }
        let before = loaded.record.clone();
        let mut task = Task::restore(loaded.record)?;
        // Matched on a read without locks: another process may have
        // changed the task before its lock was taken (a claim of a ready
        // task, say), so the state is checked again on the locked record.
        if filter.state.is_some_and(|state| {
            !task
                .attempts()
                .iter()
                .any(|attempt| attempt.state.name() == state)
        }) {
            continue;
        }
        match rule(&mut task) {
            Ok(_) => {
                dependency::keep_waiting(writer, loaded.handle, &before, &mut task)?;
                ruled.push((loaded.handle, loaded.unique_held, before, task));
            }
            // Nothing to do for this one (already final, nothing to
            // retry, out of tries): passed over.
            Err(
                LeaseError::NothingToCancel
                | LeaseError::NothingToRetry
                | LeaseError::OutOfRange { .. },
            ) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let changes: Vec<TaskChange<'_>> = ruled
        .iter()
        .map(|(handle, _, before, task)| TaskChange {
            handle: *handle,
            before,
            after: task.record(),
            at: now,
        })
        .collect();
    writer.write_acknowledged(&changes, &[], &[])?;
    // Tasks whose attempts left the states their unique slot counts.
    for (handle, held, _, task) in &ruled {
        if task.record().leaves_unique_slot(*held) {
            writer.release_unique_slot(*handle)?;
        }
    }
    dependency::settle(writer, dependency::ended(&changes), now)?;
    Ok((changes.iter().map(|change| change.handle).collect(), next))
}
