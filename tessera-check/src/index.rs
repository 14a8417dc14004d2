//! The history grouped once for every check: each task's steps and
//! grants, each queue's and each schedule's settings, and the scheduler
//! passes.
//!
//! Grouping is one pass over the steps into ordered maps (O(n log n)),
//! and the steps in each group keep the history's order of invocation.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::history::{Completion, History, Operation, OperationId, Outcome, Step};

/// An acknowledged grant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant<'h> {
    /// The claim that was granted.
    pub(crate) step: &'h Step,
    /// The queue the claim named.
    pub(crate) queue: &'h str,
    pub(crate) task: &'h str,
    pub(crate) attempt: u32,
    pub(crate) token: i64,
    pub(crate) granted_at: DateTime<Utc>,
    pub(crate) expires_at: DateTime<Utc>,
}

/// One task's steps.
#[derive(Debug, Default)]
pub(crate) struct TaskSteps<'h> {
    /// Steps that name the task before running (all but claims).
    pub(crate) named: Vec<&'h Step>,
    pub(crate) grants: Vec<Grant<'h>>,
}

impl<'h> TaskSteps<'h> {
    /// Enqueues that may have created the task: acknowledged as stored,
    /// or unknown (a duplicate created nothing).
    pub(crate) fn creating_enqueues(&self) -> impl Iterator<Item = &'h Step> + '_ {
        self.named.iter().copied().filter(|step| {
            matches!(step.operation, Operation::Enqueue { .. })
                && match &step.completion {
                    Completion::Ok { outcome } => *outcome == Outcome::Enqueued,
                    Completion::Unknown { .. } => true,
                    Completion::Fail { .. } => false,
                }
        })
    }
}

/// The history, grouped.
#[derive(Debug, Default)]
pub(crate) struct Index<'h> {
    /// Steps and grants by task.
    pub(crate) tasks: BTreeMap<&'h str, TaskSteps<'h>>,
    /// Claims whose outcome is unknown.
    pub(crate) unknown_claims: Vec<OperationId>,
    /// Pauses, resumes and limits, by queue.
    pub(crate) queues: BTreeMap<&'h str, Vec<&'h Step>>,
    /// Pauses and resumes, by schedule.
    pub(crate) schedules: BTreeMap<&'h str, Vec<&'h Step>>,
    /// Scheduler passes.
    pub(crate) passes: Vec<&'h Step>,
    /// Bulk cancels, each of a queue's tasks in one state.
    pub(crate) bulk_cancels: Vec<&'h Step>,
}

impl<'h> Index<'h> {
    pub(crate) fn new(history: &'h History) -> Self {
        let mut index = Self::default();
        for step in history.steps() {
            match &step.operation {
                Operation::Claim { queue } => match step.completion.outcome() {
                    Some(Outcome::Granted {
                        task,
                        attempt,
                        token,
                        granted_at,
                        expires_at,
                    }) => index.tasks.entry(task).or_default().grants.push(Grant {
                        step,
                        queue,
                        task,
                        attempt: *attempt,
                        token: *token,
                        granted_at: *granted_at,
                        expires_at: *expires_at,
                    }),
                    Some(_) => {}
                    None => {
                        if step.completion.may_have_happened() {
                            index.unknown_claims.push(step.id);
                        }
                    }
                },
                Operation::PauseQueue { queue }
                | Operation::ResumeQueue { queue }
                | Operation::SetLimits { queue, .. } => {
                    index.queues.entry(queue).or_default().push(step);
                }
                Operation::PauseSchedule { schedule } | Operation::ResumeSchedule { schedule } => {
                    index.schedules.entry(schedule).or_default().push(step);
                }
                Operation::FireSchedules => index.passes.push(step),
                Operation::CancelTasks { .. } => index.bulk_cancels.push(step),
                operation => {
                    if let Some(task) = operation.task() {
                        index.tasks.entry(task).or_default().named.push(step);
                    }
                }
            }
        }
        index
    }
}

/// Whether `step` was acknowledged.
pub(crate) fn acknowledged(step: &Step) -> bool {
    step.completion.outcome().is_some()
}
