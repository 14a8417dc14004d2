//! Purges: a task the history made may be missing at the end only when
//! the store's retention may have purged it.
//!
//! The store purges a task once every attempt has ended (done, failed,
//! discarded or cancelled) and the keep time of each attempt's state has
//! passed since it ended, and audits how many it purged from each queue.
//! So a missing task is excused only when, for each of its attempts, the
//! history shows an end it may have reached:
//! - done: a submission of the attempt that may have been accepted
//!   (acknowledged, or its answer lost) under a token no older than any
//!   acknowledged grant of the attempt: a submission accepted first
//!   leaves nothing to grant after it, and one made after a newer grant
//!   is stale;
//! - failed: a failure report for good that may have happened;
//! - discarded: the attempt may have had all its tries (its acknowledged
//!   grants and every claim whose answer was lost reach the `max_tries`
//!   its enqueue recorded);
//! - cancelled: a cancel of the task, or a bulk cancel of its queue, that
//!   may have happened, or, for a task enqueued to run once its parents
//!   are done, a cancel or a failure for good of a parent (or of its
//!   parents, a few generations up) that may have happened;
//!
//! and when the earliest moment the attempt can have ended so, plus that
//! state's keep time, is no later than the read of the end. That moment
//! is no earlier than the end's own evidence (an acknowledged receipt's
//! acceptance, else the invocation of the call that may have ended it),
//! nor than the last moment the history shows the attempt unfinished:
//! its task's acknowledged enqueue, an enqueue answered as a duplicate of
//! it (it held its unique slot), an acknowledged grant (at its store
//! time), heartbeat, failure report or snooze of the attempt, or an
//! acknowledged acceptance (done is never undone). Those times come from
//! the clocks of the processes that recorded them, the attempt's end and
//! the purge from those of the stores that made them, and the read from
//! the reader's: the clock skew allowed is granted twice.
//!
//! Only a task some acknowledged operation shows was made is weighed: one
//! that may never have been needs no purge to be missing.
//!
//! Last, no more tasks of a queue are excused than the store's audit
//! counts purged from that queue, and no more in all than it counts in
//! all (a task whose queue the history does not show counts there only):
//! a task excused beyond the count vanished without a purge.
//!
//! Each missing task's steps are read once, attempt by attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use chrono::{DateTime, TimeDelta, Utc};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::dependency;
use crate::history::{Completion, Operation, Outcome, Step};
use crate::index::{Index, TaskSteps, acknowledged};
use crate::lease::lease_of;
use crate::state::{AttemptState, FinalRetention, FinalState};

/// How many generations up a parent's failure is looked for, to excuse a
/// cancelled task's purge.
const GENERATIONS: usize = 8;

/// The tasks the history made that are missing at the end, each excused
/// as purged or not.
#[derive(Debug, Default)]
pub(crate) struct Purges<'h> {
    excused: BTreeSet<&'h str>,
    /// Why each missing task not excused cannot have been purged (with
    /// retention on).
    refused: BTreeMap<&'h str, String>,
}

impl<'h> Purges<'h> {
    /// Weighs every task of `index` missing from `end`, and reports the
    /// queues where more are excused than the audit counts purged.
    pub(crate) fn new(
        index: &Index<'h>,
        end: &FinalState,
        skew: TimeDelta,
        anomalies: &mut Vec<Anomaly>,
    ) -> Self {
        let mut purges = Self::default();
        let Some(retention) = &end.retention else {
            return purges;
        };
        let held = slots_held(index);
        let fired = fired(index);
        let context = Context {
            retention,
            skew,
            unknown_claims: index.unknown_claims.len(),
            bulk_cancels: &index.bulk_cancels,
            tasks: &index.tasks,
        };
        let mut by_queue: BTreeMap<Option<&str>, Vec<&str>> = BTreeMap::new();
        for (task, steps) in &index.tasks {
            // Missing, and certainly made: what is not may never have
            // been, and needs no purge to be gone.
            if end.tasks.contains_key(*task) || !witnessed(task, steps, &held, &fired) {
                continue;
            }
            let queue = queue_of(steps);
            match context.weigh(steps, queue, held.get(task).copied()) {
                Ok(()) => {
                    purges.excused.insert(task);
                    by_queue.entry(queue).or_default().push(task);
                }
                Err(why) => {
                    purges.refused.insert(task, why);
                }
            }
        }
        counts(retention, &by_queue, anomalies);
        purges
    }

    /// Whether `task` is missing at the end and may have been purged.
    pub(crate) fn excuses(&self, task: &str) -> bool {
        self.excused.contains(task)
    }

    /// Why `task`, missing at the end, cannot have been purged; `None`
    /// when it may have been, or retention was off.
    pub(crate) fn refusal(&self, task: &str) -> Option<&str> {
        self.refused.get(task).map(String::as_str)
    }

    /// Every task excused as purged.
    pub(crate) fn excused(&self) -> impl Iterator<Item = &'h str> + '_ {
        self.excused.iter().copied()
    }
}

/// What the weighing of every task shares.
struct Context<'a, 'h> {
    retention: &'a FinalRetention,
    skew: TimeDelta,
    unknown_claims: usize,
    bulk_cancels: &'a [&'h Step],
    tasks: &'a BTreeMap<&'h str, TaskSteps<'h>>,
}

impl Context<'_, '_> {
    /// `Ok` if the task of `steps` (of `queue`, holding its unique slot at
    /// `held`) may have been purged before the end was read; else why not.
    fn weigh(
        &self,
        steps: &TaskSteps<'_>,
        queue: Option<&str>,
        held: Option<DateTime<Utc>>,
    ) -> Result<(), String> {
        let creating: Vec<&Step> = steps.creating_enqueues().collect();
        let recorded = |field: fn(&Operation) -> Option<u32>| {
            creating
                .iter()
                .filter_map(move |step| field(&step.operation))
        };
        let seen = steps
            .grants
            .iter()
            .map(|grant| grant.attempt)
            .chain(steps.named.iter().filter_map(|s| lease_of(s).map(|l| l.0)))
            .max()
            .unwrap_or(1);
        let attempts = recorded(alternatives).max().unwrap_or(1).max(seen);
        // The smallest recorded: the one that lets a discard come soonest.
        let max_tries = recorded(max_tries).min();
        // The task was there, unfinished, when an enqueue stored it or
        // found it holding its slot.
        let created = creating
            .iter()
            .filter(|step| acknowledged(step))
            .map(|step| step.invoked_wall)
            .chain(held)
            .max();
        let mut purge_from = DateTime::<Utc>::MIN_UTC;
        for attempt in 1..=attempts {
            let from = self.attempt(steps, queue, attempt, max_tries, created)?;
            purge_from = purge_from.max(from);
        }
        let read_at = self.retention.read_at;
        if purge_from > read_at + self.skew + self.skew {
            return Err(format!(
                "it may be purged from {purge_from} at the earliest, and the end was read at \
                 {read_at}"
            ));
        }
        Ok(())
    }

    /// When `attempt` of the task of `steps` lets its task be purged at the
    /// earliest, or why never.
    fn attempt(
        &self,
        steps: &TaskSteps<'_>,
        queue: Option<&str>,
        attempt: u32,
        max_tries: Option<u32>,
        created: Option<DateTime<Utc>>,
    ) -> Result<DateTime<Utc>, String> {
        let grants: Vec<_> = steps
            .grants
            .iter()
            .filter(|grant| grant.attempt == attempt)
            .collect();
        let newest = grants.iter().map(|grant| grant.token).max();
        let own: Vec<&Step> = steps
            .named
            .iter()
            .copied()
            .filter(|step| lease_of(step).is_some_and(|(a, _)| a == attempt))
            .collect();
        // The last moment the attempt was certainly unfinished (or done,
        // which it stays).
        let unfinished = own
            .iter()
            .filter_map(|step| match step.completion.outcome()? {
                Outcome::Extended { .. } | Outcome::Failed | Outcome::Snoozed { .. } => {
                    Some(step.invoked_wall)
                }
                Outcome::Accepted { receipt } | Outcome::Replayed { receipt } => {
                    Some(receipt.accepted_at)
                }
                _ => None,
            })
            .chain(grants.iter().map(|grant| grant.granted_at))
            .chain(created)
            .max();
        // Each end the attempt may have reached, with its earliest
        // evidence (`None`: none beyond `unfinished`).
        let mut ends: Vec<(AttemptState, Option<DateTime<Utc>>)> = Vec::new();
        let done = own
            .iter()
            .filter_map(|step| {
                let Operation::Submit { token, .. } = step.operation else {
                    return None;
                };
                match &step.completion {
                    Completion::Ok {
                        outcome: Outcome::Accepted { receipt } | Outcome::Replayed { receipt },
                    } => Some(receipt.accepted_at),
                    Completion::Unknown { .. } if newest.is_none_or(|n| token >= n) => {
                        Some(step.invoked_wall)
                    }
                    _ => None,
                }
            })
            .min();
        ends.extend(done.map(|at| (AttemptState::Done, Some(at))));
        let failed = own
            .iter()
            .filter(|step| {
                matches!(step.operation, Operation::Fail { retry: false, .. })
                    && step.completion.may_have_happened()
            })
            .map(|step| step.invoked_wall)
            .min();
        ends.extend(failed.map(|at| (AttemptState::Failed, Some(at))));
        let tries = grants.len() + self.unknown_claims;
        if max_tries.is_some_and(|most| tries >= most as usize) {
            ends.push((AttemptState::Discarded, None));
        }
        let bulk = self.bulk_cancels.iter().copied().filter(|step| {
            matches!(&step.operation, Operation::CancelTasks { queue: q, .. }
                if queue == Some(q.as_str()))
        });
        let cancelled = steps
            .named
            .iter()
            .copied()
            .filter(|step| matches!(step.operation, Operation::Cancel { .. }))
            .chain(bulk)
            .filter(|step| step.completion.may_have_happened())
            .map(|step| step.invoked_wall)
            .min();
        ends.extend(cancelled.map(|at| (AttemptState::Cancelled, Some(at))));
        // Cancelled by a parent it needed done that ended otherwise.
        let by_parent = dependency::parent_failure(steps, self.tasks, GENERATIONS);
        ends.extend(by_parent.map(|at| (AttemptState::Cancelled, Some(at))));
        if ends.is_empty() {
            return Err(format!(
                "attempt {attempt} shows no end: no submission that may have been accepted, \
                 failure for good, discard or cancel"
            ));
        }
        ends.iter()
            .filter_map(|(state, evidence)| {
                let keep = self.retention.keep(*state)?;
                let ended = unfinished
                    .max(*evidence)
                    .unwrap_or(DateTime::<Utc>::MIN_UTC);
                Some(
                    ended
                        .checked_add_signed(keep)
                        .unwrap_or(DateTime::<Utc>::MAX_UTC),
                )
            })
            .min()
            .ok_or_else(|| {
                let states: Vec<AttemptState> = ends.iter().map(|(state, _)| *state).collect();
                format!("attempt {attempt} may only have ended {states:?}, which are kept for good")
            })
    }
}

fn alternatives(operation: &Operation) -> Option<u32> {
    match operation {
        Operation::Enqueue { alternatives, .. } => alternatives.map(u32::from),
        _ => None,
    }
}

fn max_tries(operation: &Operation) -> Option<u32> {
    match operation {
        Operation::Enqueue { max_tries, .. } => *max_tries,
        _ => None,
    }
}

/// The queue the task's enqueue named, else the queue of a claim that
/// granted it.
fn queue_of<'h>(steps: &TaskSteps<'h>) -> Option<&'h str> {
    steps
        .creating_enqueues()
        .find_map(|step| match &step.operation {
            Operation::Enqueue { queue, .. } => queue.as_deref(),
            _ => None,
        })
        .or_else(|| steps.grants.first().map(|grant| grant.queue))
}

/// Whether an acknowledged operation shows the task was made: its
/// enqueue, a grant, an acknowledged call on it, an enqueue answered as
/// its duplicate, or a fire.
fn witnessed(
    task: &str,
    steps: &TaskSteps<'_>,
    held: &BTreeMap<&str, DateTime<Utc>>,
    fired: &BTreeSet<&str>,
) -> bool {
    !steps.grants.is_empty()
        || held.contains_key(task)
        || fired.contains(task)
        || steps
            .named
            .iter()
            .any(|step| match step.completion.outcome() {
                Some(Outcome::Duplicate { .. }) | None => false,
                Some(_) => true,
            })
}

/// The tasks acknowledged fires made.
fn fired<'h>(index: &Index<'h>) -> BTreeSet<&'h str> {
    index
        .passes
        .iter()
        .filter_map(|step| match step.completion.outcome() {
            Some(Outcome::Fired { fires }) => Some(fires),
            _ => None,
        })
        .flatten()
        .map(|fire| fire.task.as_str())
        .collect()
}

/// For each task an acknowledged enqueue was answered as a duplicate of,
/// the latest such enqueue's invocation: the task held its unique slot,
/// so was unfinished, then.
fn slots_held<'h>(index: &Index<'h>) -> BTreeMap<&'h str, DateTime<Utc>> {
    let mut held: BTreeMap<&str, DateTime<Utc>> = BTreeMap::new();
    for step in index.tasks.values().flat_map(|steps| &steps.named) {
        if let Some(Outcome::Duplicate { of }) = step.completion.outcome() {
            let at = held.entry(of.as_str()).or_insert(step.invoked_wall);
            *at = (*at).max(step.invoked_wall);
        }
    }
    held
}

/// No more tasks excused in a queue than the audit counts purged from
/// it, nor in all than it counts in all.
fn counts(
    retention: &FinalRetention,
    by_queue: &BTreeMap<Option<&str>, Vec<&str>>,
    anomalies: &mut Vec<Anomaly>,
) {
    let mut over = false;
    for (queue, tasks) in by_queue {
        let Some(queue) = queue else {
            continue;
        };
        let purged = retention.purged.get(*queue).copied().unwrap_or(0);
        if tasks.len() as u64 > purged {
            over = true;
            anomalies.push(anomaly(
                AnomalyKind::LostEnqueue,
                &format!("queue {queue}"),
                Vec::new(),
                beyond_count(tasks.iter().copied(), purged),
            ));
        }
    }
    let purged = retention.purged_total();
    let excused = by_queue.values().map(Vec::len).sum::<usize>() as u64;
    if !over && excused > purged {
        anomalies.push(anomaly(
            AnomalyKind::LostEnqueue,
            "*",
            Vec::new(),
            beyond_count(by_queue.values().flatten().copied(), purged),
        ));
    }
}

fn beyond_count<'a>(tasks: impl Iterator<Item = &'a str>, purged: u64) -> String {
    let tasks: Vec<&str> = tasks.collect();
    let mut detail = format!(
        "{} tasks are missing at the end and each may have been purged, but the store's audit \
         counts {purged} purged: at least {} vanished without a purge (",
        tasks.len(),
        tasks.len() as u64 - purged
    );
    for (n, task) in tasks.iter().take(10).enumerate() {
        if n > 0 {
            detail.push_str(", ");
        }
        detail.push_str(task);
    }
    if tasks.len() > 10 {
        let _ = write!(detail, ", … {} more", tasks.len() - 10);
    }
    detail.push(')');
    detail
}
