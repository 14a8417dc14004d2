//! Unique keys: at no time do two tasks hold one unique key of a queue.
//!
//! A task holds its key from its acknowledged enqueue until it is
//! finished (a submission accepted, failed for good, cancelled or
//! discarded), in the store's default counted states (waiting or leased).
//! Only what the real-time order makes certain is flagged: a later task
//! acknowledged as stored after the holder's enqueue completed, while
//! nothing that could have finished the holder was invoked before the
//! later enqueue completed, or while the holder is still unfinished at
//! the end (a finished attempt stays finished: a run retries nothing).
//! Two tasks both unfinished at the end both hold the key there, in
//! whatever order they were stored.
//!
//! Enqueues are grouped by queue and key once; within a key the created
//! tasks are compared pairwise, and they are few while keys are unique.

use std::collections::BTreeMap;

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Operation, Outcome, Step};
use crate::index::{Index, TaskSteps};
use crate::lease::may_end_lease;
use crate::state::{AttemptState, FinalState, FinalTask};

pub(crate) fn unique_keys(index: &Index<'_>, end: &FinalState, anomalies: &mut Vec<Anomaly>) {
    let mut created: BTreeMap<(&str, &str), Vec<(&str, &Step)>> = BTreeMap::new();
    for (task, steps) in &index.tasks {
        for step in &steps.named {
            let Operation::Enqueue {
                queue,
                unique_key: Some(key),
                ..
            } = &step.operation
            else {
                continue;
            };
            if step.completion.outcome() == Some(&Outcome::Enqueued) {
                let queue = queue.as_deref().unwrap_or_default();
                created.entry((queue, key)).or_default().push((task, step));
            }
        }
    }
    for ((queue, key), enqueued) in &created {
        for (task, later) in enqueued {
            let holder = enqueued
                .iter()
                .filter(|(holder, enqueue)| {
                    let both_at_end = || {
                        (enqueue.invoked, enqueue.id) < (later.invoked, later.id)
                            && unfinished(end.tasks.get(*holder))
                            && unfinished(end.tasks.get(*task))
                    };
                    holder != task
                        && (enqueue.precedes(later)
                            && certainly_holds(&index.tasks[holder], end.tasks.get(*holder), later)
                            || both_at_end())
                })
                .max_by_key(|(_, enqueue)| enqueue.completed);
            if let Some((holder, enqueue)) = holder {
                anomalies.push(anomaly(
                    AnomalyKind::DuplicateUniqueKey,
                    task,
                    vec![enqueue.id, later.id],
                    format!(
                        "stored with unique key {key} of queue {queue:?} while task {holder} \
                         held it"
                    ),
                ));
            }
        }
    }
}

/// Whether a task ends with an attempt unfinished, so holds its key at
/// the end and held it since it was stored.
fn unfinished(end: Option<&FinalTask>) -> bool {
    end.is_some_and(|end| end.attempts.iter().any(|a| !a.state.is_final()))
}

/// Whether the task of `steps` (ending as `end` shows) certainly still
/// held its key when `later` completed.
fn certainly_holds(steps: &TaskSteps<'_>, end: Option<&FinalTask>, later: &Step) -> bool {
    if unfinished(end) {
        return true;
    }
    let Some(end) = end else {
        return false;
    };
    // A discard can come from any claim that finds a lease lapsed on its
    // last try, or from the store's own upkeep: no certainty.
    if end
        .attempts
        .iter()
        .any(|a| a.state == AttemptState::Discarded)
    {
        return false;
    }
    !steps.named.iter().any(|step| {
        may_end_lease(step)
            && !matches!(step.operation, Operation::Snooze { .. })
            && later.completed > Some(step.invoked)
    })
}
