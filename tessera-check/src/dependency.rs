//! Tasks that wait for other tasks: a child runs only after its parents.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Operation, Outcome, Step};
use crate::index::{Index, TaskSteps};
use crate::state::{AttemptState, FinalState};

/// No acknowledged grant of a task enqueued to run once its parents are
/// done completed before a submission of each parent was invoked.
///
/// A parent is done only once a submission of it was accepted, which
/// happens between that submission's invocation and its completion (or,
/// answer lost, at any moment after its invocation). So a grant whose
/// claim completed before every submission of some parent that may have
/// happened was even invoked ran before that parent was done.
///
/// Only what every call that may have created the task says is checked:
/// a task one of whose creating enqueues named no parents, or ran on any
/// outcome, is not. A parent the history never names (enqueued before the
/// run) is not checked either.
pub(crate) fn parents(
    task: &str,
    steps: &TaskSteps<'_>,
    index: &Index<'_>,
    anomalies: &mut Vec<Anomaly>,
) {
    let Some((enqueue, parents)) = waits_for_parents(steps) else {
        return;
    };
    for grant in &steps.grants {
        for parent in parents {
            let Some(parent_steps) = index.tasks.get(parent.as_str()) else {
                continue;
            };
            let submitted_before = parent_steps.named.iter().any(|step| {
                submission_may_be_accepted(step)
                    && grant.step.completed.is_none_or(|done| step.invoked < done)
            });
            if !submitted_before {
                anomalies.push(anomaly(
                    AnomalyKind::RanBeforeParent,
                    task,
                    vec![enqueue.id, grant.step.id],
                    format!(
                        "token {} granted before any submission of parent {parent} was asked for",
                        grant.token
                    ),
                ));
            }
        }
    }
}

/// The parents every creating enqueue of the task names, with one of
/// those enqueues; `None` where one names none or runs on any outcome.
fn waits_for_parents<'h>(steps: &TaskSteps<'h>) -> Option<(&'h Step, &'h [String])> {
    let mut found = None;
    for step in steps.creating_enqueues() {
        let Operation::Enqueue {
            after, any_outcome, ..
        } = &step.operation
        else {
            continue;
        };
        if after.is_empty() || *any_outcome {
            return None;
        }
        found.get_or_insert((step, after.as_slice()));
    }
    found
}

/// Whether the task may have been cancelled by a parent it needed done:
/// it was enqueued to run once its parents are done, and one of them
/// ended at the end of the run with no attempt done, or is missing.
pub(crate) fn may_be_cancelled_by_parent(steps: &TaskSteps<'_>, end: &FinalState) -> bool {
    steps.creating_enqueues().any(|step| {
        let Operation::Enqueue {
            after, any_outcome, ..
        } = &step.operation
        else {
            return false;
        };
        !*any_outcome
            && after.iter().any(|parent| match end.tasks.get(parent) {
                None => true,
                Some(task) => {
                    task.attempts.iter().all(|a| a.state.is_final())
                        && !task.attempts.iter().any(|a| a.state == AttemptState::Done)
                }
            })
    })
}

/// The earliest moment a parent the task of `steps` needed done may have
/// ended otherwise, by the history: a cancel of it or a failure report
/// for good that may have happened (its invocation), or, a generation up
/// at most `depth` times, its own parent's such end. `None` when no
/// parent can have.
pub(crate) fn parent_failure(
    steps: &TaskSteps<'_>,
    tasks: &BTreeMap<&str, TaskSteps<'_>>,
    depth: usize,
) -> Option<DateTime<Utc>> {
    let (_, parents) = waits_for_parents(steps)?;
    parents
        .iter()
        .filter_map(|parent| {
            let parent = tasks.get(parent.as_str())?;
            let own = parent
                .named
                .iter()
                .filter(|step| {
                    matches!(
                        step.operation,
                        Operation::Cancel { .. } | Operation::Fail { retry: false, .. }
                    ) && step.completion.may_have_happened()
                })
                .map(|step| step.invoked_wall)
                .min();
            let inherited = depth
                .checked_sub(1)
                .and_then(|depth| parent_failure(parent, tasks, depth));
            own.into_iter().chain(inherited).min()
        })
        .min()
}

/// A submission that was accepted, or whose answer was lost.
fn submission_may_be_accepted(step: &Step) -> bool {
    matches!(step.operation, Operation::Submit { .. })
        && match step.completion.outcome() {
            Some(outcome) => matches!(outcome, Outcome::Accepted { .. } | Outcome::Replayed { .. }),
            None => step.completion.may_have_happened(),
        }
}
