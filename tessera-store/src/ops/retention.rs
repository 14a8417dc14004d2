//! Retention of finished work: tasks whose every attempt is final are
//! purged, with every row of their own, once their keep time has passed
//! ([`Retention`]).

use std::collections::BTreeMap;

use tessera_audit::{Action, Resource, RetentionRun};
use tessera_lease::{Namespace, QueueName, Retention, StateName};

use crate::backend::{FinishedPosition, TaskHandle};
use crate::error::Error;
use crate::model::audit::ActionScope;
use crate::store::Store;

/// The final states, each searched in a namespace as one range of the
/// index of attempts at rest by when they changed.
const FINAL_STATES: [StateName; 4] = [
    StateName::Done,
    StateName::Failed,
    StateName::Discarded,
    StateName::Cancelled,
];

/// What one batch did: tasks purged, rows deleted, and the namespaces
/// changed.
type Batch = (u64, u64, Vec<Namespace>);

/// How long after its window ends a unique slot is kept.
const SLOT_MARGIN: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

/// Namespaces read at a time.
const NAMESPACE_PAGE: usize = 100;

impl Store {
    /// Purges the finished tasks whose keep time has passed at the run's
    /// start, by their queue's keep times ([`Store::set_queue_retention`])
    /// or the store's: namespace by namespace, for each final state, the
    /// attempts that reached it at or before its latest cutoff (found in
    /// the namespace's range of the index of attempts at rest by when they
    /// changed), a batch of at most
    /// [`RetentionRun::batch_size`] (500) at a time, each batch its own
    /// transaction. Attempts kept longer than the shortest keep time of
    /// their state in the namespace (another state's, or a queue that
    /// keeps longer) lie in that range too and are read again by each run
    /// until they are due. A batch locks the
    /// tasks it found (on PostgreSQL, passing over those another
    /// transaction holds), weighs each by all its attempts
    /// ([`Retention::purgeable`](tessera_lease::Retention::purgeable): every
    /// attempt final and past its keep time), deletes those due with their
    /// attempts, receipts and unique slot, and writes one audit row
    /// `purge_tasks` per queue it purged from, naming the queue and the
    /// count, by the store (principal `-`). Returns the tasks purged and
    /// the rows deleted.
    pub(crate) fn purge_finished(&self, run: &RetentionRun) -> Result<(u64, u64), Error> {
        let retention = self.config.retention();
        let now = run.started_at();
        let limit = run.batch_size();
        let (mut tasks, mut rows) = (0, 0);
        let mut after_namespace: Option<Namespace> = None;
        loop {
            let namespaces = self.read(|reader| {
                Ok(reader.namespace_names(after_namespace.as_ref(), NAMESPACE_PAGE)?)
            })?;
            for namespace in &namespaces {
                // Queues with keep times of their own: the search of a
                // state reaches up to the latest cutoff of any of them,
                // and each task found is weighed by its queue's.
                let own: BTreeMap<QueueName, Retention> = self
                    .read(|reader| Ok(reader.namespace_retention(namespace)?))?
                    .into_iter()
                    .collect();
                let retention_of = |queue: &QueueName| own.get(queue).copied().unwrap_or(retention);
                for state in FINAL_STATES {
                    let Some(cutoff) = std::iter::once(&retention)
                        .chain(own.values())
                        .filter_map(|keep| keep.cutoff(state, now))
                        .max()
                    else {
                        continue;
                    };
                    let mut after: FinishedPosition = (i64::MIN, i64::MIN);
                    loop {
                        // The search reads; a write transaction is opened only
                        // when it found something, and weighs it again under its
                        // locks.
                        let found = self.read(|reader| {
                            Ok(reader.finished_attempts(namespace, state, cutoff, after, limit)?)
                        })?;
                        let next = (found.len() >= limit)
                            .then(|| found.last().copied())
                            .flatten();
                        let mut handles: Vec<TaskHandle> =
                            found.iter().map(|(_, task)| TaskHandle(*task)).collect();
                        handles.sort_unstable();
                        handles.dedup();
                        let (purged, deleted, changed): Batch = if handles.is_empty() {
                            (0, 0, Vec::new())
                        } else {
                            self.write(|writer| {
                                let locked = writer.lock_finished(&handles)?;
                                let mut due: Vec<_> = locked
                                    .iter()
                                    .filter(|task| {
                                        retention_of(&task.queue)
                                            .purgeable(task.attempts.iter().copied(), now)
                                    })
                                    .collect();
                                // A parent stays while a child waits:
                                // the child reads its output when it runs.
                                let candidates: Vec<TaskHandle> =
                                    due.iter().map(|task| task.handle).collect();
                                if !candidates.is_empty() {
                                    let kept = writer.reads().parents_of_waiting(&candidates)?;
                                    due.retain(|task| !kept.contains(&task.handle));
                                }
                                if due.is_empty() {
                                    return Ok((0, 0, Vec::new()));
                                }
                                let ids: Vec<TaskHandle> =
                                    due.iter().map(|task| task.handle).collect();
                                let deleted = writer.delete_tasks(&ids)?;
                                let mut by_queue: BTreeMap<(&Namespace, &QueueName), u64> =
                                    BTreeMap::new();
                                for task in &due {
                                    *by_queue.entry((&task.namespace, &task.queue)).or_default() +=
                                        1;
                                }
                                for ((namespace, queue), count) in &by_queue {
                                    let scope =
                                        ActionScope::new(None, Some(namespace), Action::PurgeTasks);
                                    let resource =
                                        Resource::new(&format!("queue:{queue}/n{count}")).ok();
                                    writer.insert_event(&scope.event(now, resource))?;
                                }
                                let mut changed: Vec<Namespace> = by_queue
                                    .keys()
                                    .map(|(namespace, _)| (*namespace).clone())
                                    .collect();
                                changed.dedup();
                                Ok((ids.len() as u64, deleted as u64, changed))
                            })?
                        };
                        tasks += purged;
                        rows += deleted;
                        for namespace in &changed {
                            self.namespace_changed(namespace);
                        }
                        match next {
                            Some(position) => after = position,
                            None => break,
                        }
                    }
                }
            }
            match namespaces.last() {
                Some(last) if namespaces.len() >= NAMESPACE_PAGE => {
                    after_namespace = Some(last.clone());
                }
                _ => break,
            }
        }
        Ok((tasks, rows))
    }

    /// Deletes the unique slots whose window ended at least
    /// [`SLOT_MARGIN`] before the run started, a batch of at most
    /// [`RetentionRun::batch_size`] at a time: no enqueue maps to such a
    /// slot again (a later one falls in a later period), so a windowed
    /// key held for good costs a row only while its window lasts. The
    /// margin covers a process whose clock reads behind. Returns the rows
    /// deleted.
    pub(crate) fn purge_ended_slots(&self, run: &RetentionRun) -> Result<u64, Error> {
        let cutoff = run.started_at() - SLOT_MARGIN;
        let limit = run.batch_size();
        let mut deleted = 0;
        loop {
            let rows = self.write(|writer| Ok(writer.purge_ended_slots(cutoff, limit)?))?;
            deleted += rows as u64;
            if rows < limit {
                return Ok(deleted);
            }
        }
    }

    /// Deletes every unpaused schedule's fire rows but its latest, a
    /// batch of at most [`RetentionRun::batch_size`] at a time: only the
    /// latest fire decides the next one (a scheduler reads it under the
    /// schedule's lock), so a schedule keeps one row however long it
    /// runs. A paused schedule gains no fire. Returns the rows deleted.
    #[cfg(feature = "schedule")]
    pub(crate) fn trim_schedule_fires(&self, run: &RetentionRun) -> Result<u64, Error> {
        let limit = run.batch_size();
        let mut deleted = 0;
        let mut after: Option<(Namespace, tessera_lease::ScheduleName)> = None;
        loop {
            let page = self.read(|reader| {
                Ok(reader.active_schedules(
                    after.as_ref().map(|(namespace, name)| (namespace, name)),
                    NAMESPACE_PAGE,
                )?)
            })?;
            for row in &page {
                loop {
                    let rows = self.write(|writer| {
                        Ok(writer.trim_fires(&row.namespace, &row.name, limit)?)
                    })?;
                    deleted += rows as u64;
                    if rows < limit {
                        break;
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() >= NAMESPACE_PAGE => {
                    after = Some((last.namespace.clone(), last.name.clone()));
                }
                _ => break,
            }
        }
        Ok(deleted)
    }
}
