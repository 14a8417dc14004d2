//! Tasks that wait for other tasks: the edges an enqueue writes, and the
//! children told of each parent's end in the transaction that ends it.
//!
//! The rules are `tessera-lease`'s ([`Waiting`], [`Task::unblock`],
//! [`Task::cancel_waiting`], [`TaskRecord::ended_since`]); the count of a
//! child's parents not ended is its edges not marked ended, read after the
//! child is locked, so two transactions ending two parents of one child
//! at once take turns on the child and the second sees the first's end.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use tessera_lease::{
    Cascade, DependencyError, MAX_PARENTS, ParentEnd, RunAfter, Task, TaskRecord, Unblocked,
    Waiting, check_batch,
};

use crate::backend::{LoadedTask, NewEdge, TaskChange, TaskHandle, WriteTransaction};
use crate::error::{Error, corrupt};
use crate::model::task::TaskRef;
use crate::store;

/// The most parents one statement marks ended; a failure's cancellations
/// reach further generations a round at a time.
const ENDS_PER_STATEMENT: usize = 1_000;

/// The tasks of `changes` that ended in them, with how each ended.
pub(crate) fn ended(changes: &[TaskChange<'_>]) -> Vec<(TaskHandle, ParentEnd)> {
    changes
        .iter()
        .filter_map(|change| Some((change.handle, change.after.ended_since(change.before)?)))
        .collect()
}

/// Tells the waiting children of every task in `ended` how it ended, in
/// this transaction: each child's edge from it ends, once; a child whose
/// last parent ended as it needed becomes ready (or scheduled); one that
/// needed a parent done which ended otherwise is cancelled
/// (`parent_failed`), and so, a round later, are its own waiting
/// children.
pub(crate) fn settle(
    writer: &dyn WriteTransaction,
    ended: Vec<(TaskHandle, ParentEnd)>,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let mut cascade = Cascade::of(ended);
    let mut woken = BTreeSet::new();
    while !cascade.is_done() {
        let parents = cascade.next(ENDS_PER_STATEMENT);
        let edges = writer.end_edges(&parents)?;
        // Each child once, with every end it was told of, locked in
        // reference order (as every transaction locking several tasks
        // locks them).
        let mut children: BTreeMap<TaskRef, (RunAfter, Vec<ParentEnd>)> = BTreeMap::new();
        for edge in edges {
            children
                .entry(edge.child)
                .or_insert((edge.run_after, Vec::new()))
                .1
                .push(edge.end);
        }
        let refs: Vec<&TaskRef> = children.keys().collect();
        let loaded = writer.lock_tasks(&refs)?;
        for ((child, (run_after, ends)), loaded) in children.iter().zip(loaded) {
            // A child purged meanwhile has no one to tell.
            let Some(loaded) = loaded else { continue };
            let open = writer.reads().open_parents(loaded.handle)?;
            let unfinished = u32::try_from(open.saturating_add(ends.len() as u64))
                .map_err(|_| corrupt("a child's count of parents"))?;
            let mut decided = Unblocked::Waiting(Waiting {
                unfinished,
                run_after: *run_after,
            });
            for end in ends {
                decided = match decided {
                    Unblocked::Waiting(waiting) => waiting
                        .on_parent_end(*end)
                        .map_err(|_| corrupt("a child's count of parents"))?,
                    settled => settled,
                };
            }
            let mut rules = Task::restore(loaded.record)?;
            let before = rules.record().clone();
            let changed = match decided {
                Unblocked::Waiting(_) => continue,
                Unblocked::Ready => rules.unblock(now),
                Unblocked::Cancelled => rules.cancel_waiting(),
            };
            if changed.is_empty() {
                // No longer waiting (an operator cancelled or retried it):
                // nothing to change.
                continue;
            }
            writer.save_task(loaded.handle, &before, rules.record(), now)?;
            if rules.record().leaves_unique_slot(loaded.unique_held) {
                writer.release_unique_slot(loaded.handle)?;
            }
            if let Some(end) = rules.record().ended_since(&before) {
                cascade.ended((loaded.handle, end));
            } else if woken.insert((child.namespace.clone(), loaded.queue.clone())) {
                // Claimable now: other processes' stores hear it once this
                // commits, and this store wakes the queue then.
                writer.signal_enqueued(&child.namespace, &loaded.queue)?;
                store::wake_after_commit(&child.namespace, &loaded.queue);
            }
        }
    }
    Ok(())
}

/// A task an operator's retry took out of its end goes back to waiting
/// while it has parents that have not ended (cancelled while it waited,
/// then retried), rather than run before them.
pub(crate) fn keep_waiting(
    writer: &dyn WriteTransaction,
    handle: TaskHandle,
    before: &TaskRecord,
    task: &mut Task,
) -> Result<(), Error> {
    if before.end().is_some()
        && task.record().end().is_none()
        && writer.reads().open_parents(handle)? > 0
    {
        let _ = task.wait_for_parents();
    }
    Ok(())
}

/// [`settle`] for one task changed from `before` to `after`.
pub(crate) fn settle_one(
    writer: &dyn WriteTransaction,
    handle: TaskHandle,
    before: &TaskRecord,
    after: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    match after.ended_since(before) {
        Some(end) => settle(writer, vec![(handle, end)], now),
        None => Ok(()),
    }
}

/// One task of an enqueue call, as [`start`] reads it: its reference,
/// its parents and rule, and whether this call created it.
pub(crate) struct NewChild<'a> {
    pub(crate) task: &'a TaskRef,
    pub(crate) parents: &'a [TaskRef],
    pub(crate) run_after: RunAfter,
    pub(crate) created: bool,
}

/// Starts the tasks an enqueue call created with parents, inserted
/// waiting: checks the call's parents (each named once, not the task
/// itself, at most [`MAX_PARENTS`], and each stored before the call or
/// created earlier in it, so edges never close a cycle; a `400` that
/// enqueues nothing otherwise), locks them (a submission ending one then
/// waits for this transaction, or this one waits and reads its end), and
/// for each child: ready (or scheduled) if every parent has ended as it
/// needs, cancelled (`parent_failed`) if one it needed done ended
/// otherwise, and otherwise an edge to each parent not ended.
pub(crate) fn start(
    writer: &dyn WriteTransaction,
    tasks: &[NewChild<'_>],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    if tasks.iter().all(|task| task.parents.is_empty()) {
        return Ok(());
    }
    for task in tasks {
        if let Some(parent) = task
            .parents
            .iter()
            .find(|parent| parent.namespace != task.task.namespace)
        {
            return Err(Error::InvalidInput {
                reason: format!(
                    "parent {parent} of task {} is in another namespace",
                    task.task
                ),
            });
        }
    }
    let created: BTreeSet<&TaskRef> = tasks
        .iter()
        .filter(|task| task.created)
        .map(|task| task.task)
        .collect();
    // Only what this call creates waits: a task stored already (a batch
    // sent again) is left as it is, its parents unchecked.
    fn parents_of<'a>(task: &NewChild<'a>) -> &'a [TaskRef] {
        if task.created { task.parents } else { &[] }
    }
    let mut wanted: Vec<&TaskRef> = tasks
        .iter()
        .filter(|task| task.parents.len() <= MAX_PARENTS)
        .flat_map(parents_of)
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let stored: BTreeMap<&TaskRef, LoadedTask> = wanted
        .iter()
        .copied()
        .zip(writer.lock_tasks(&wanted)?)
        .filter_map(|(parent, loaded)| Some((parent, loaded?)))
        .collect();
    let batch: Vec<(&TaskRef, &[TaskRef])> = tasks
        .iter()
        .map(|task| (task.task, parents_of(task)))
        .collect();
    check_batch(&batch, |parent| {
        stored.contains_key(parent) && !created.contains(parent)
    })
    .map_err(|error| Error::InvalidInput {
        reason: match error {
            DependencyError::UnknownParent { index, parent } => format!(
                "parent {} of task {} does not exist: a parent is stored already or comes \
                 earlier in the same batch",
                batch[index].1[parent], batch[index].0
            ),
            other => other.to_string(),
        },
    })?;
    let mut edges = Vec::new();
    for task in tasks
        .iter()
        .filter(|task| task.created && !task.parents.is_empty())
    {
        let mut ended = Vec::new();
        let mut found = Vec::new();
        for parent in task.parents {
            // Created by an earlier enqueue of the batch, or stored: a
            // parent a duplicate stood for is neither.
            let Some(loaded) = stored.get(parent) else {
                return Err(Error::InvalidInput {
                    reason: format!(
                        "parent {parent} of task {} was not created: a unique duplicate \
                         created nothing to wait for",
                        task.task
                    ),
                });
            };
            let end = loaded.record.end();
            ended.extend(end);
            found.push((loaded.handle, end));
        }
        let decided =
            Waiting::at_enqueue(task.parents.len(), &ended, task.run_after).map_err(|error| {
                Error::InvalidInput {
                    reason: error.to_string(),
                }
            })?;
        let child = writer
            .lock_tasks(&[task.task])?
            .pop()
            .flatten()
            .ok_or_else(|| corrupt("a task created in this transaction"))?;
        // An edge to every parent, in the order named, those ended
        // already marked so: the child's read of its parents' outputs
        // finds them all.
        edges.extend(
            found
                .into_iter()
                .enumerate()
                .map(|(place, (parent, ended))| NewEdge {
                    parent,
                    child: child.handle,
                    run_after: task.run_after,
                    ended,
                    place,
                }),
        );
        let mut rules = Task::restore(child.record)?;
        let before = rules.record().clone();
        match decided {
            Unblocked::Waiting(_) => continue,
            Unblocked::Ready => {
                let _ = rules.unblock(now);
            }
            Unblocked::Cancelled => {
                let _ = rules.cancel_waiting();
            }
        }
        writer.save_task(child.handle, &before, rules.record(), now)?;
        if rules.record().leaves_unique_slot(child.unique_held) {
            writer.release_unique_slot(child.handle)?;
        }
    }
    writer.insert_edges(&edges)?;
    Ok(())
}
