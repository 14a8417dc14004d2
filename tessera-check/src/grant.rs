//! When a claim may grant at all: never on a queue certainly paused, never
//! past its task's deadline.

use chrono::TimeDelta;

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Operation, Outcome, Step};
use crate::index::{Grant, Index, TaskSteps, acknowledged};
use crate::state::FinalTask;

/// No grant is acknowledged whose claim was invoked after a pause of its
/// queue was acknowledged, unless a resume that may have happened can be
/// placed after the pause and before the grant: one not acknowledged
/// before the pause was invoked, invoked before the grant completed.
///
/// Pauses are few: each grant is compared with its queue's settings only.
pub(crate) fn paused(index: &Index<'_>, anomalies: &mut Vec<Anomaly>) {
    for grant in index.tasks.values().flat_map(|steps| &steps.grants) {
        let Some(settings) = index.queues.get(grant.queue) else {
            continue;
        };
        if let Some(pause) = certain_pause(settings, grant) {
            anomalies.push(anomaly(
                AnomalyKind::GrantWhilePaused,
                grant.task,
                vec![pause.id, grant.step.id],
                format!(
                    "token {} granted on queue {} while it was paused",
                    grant.token, grant.queue
                ),
            ));
        }
    }
}

/// The latest acknowledged pause of `settings` certainly in force for
/// the whole of `grant`'s claim.
fn certain_pause<'h>(settings: &[&'h Step], grant: &Grant<'_>) -> Option<&'h Step> {
    let resumed = |pause: &Step| {
        settings.iter().any(|step| {
            matches!(step.operation, Operation::ResumeQueue { .. })
                && step.completion.may_have_happened()
                && !step.precedes(pause)
                && grant.step.completed > Some(step.invoked)
        })
    };
    settings
        .iter()
        .copied()
        .filter(|step| {
            matches!(step.operation, Operation::PauseQueue { .. })
                && acknowledged(step)
                && step.precedes(grant.step)
        })
        .filter(|pause| !resumed(pause))
        .max_by_key(|pause| pause.completed)
}

/// No grant's store time is past the deadline its task was enqueued with
/// (beyond the clock skew allowed). A task enqueued by several calls that
/// may each have made it has the latest of their deadlines, and none if
/// one gave none.
pub(crate) fn deadline(
    task: &str,
    steps: &TaskSteps<'_>,
    skew: TimeDelta,
    anomalies: &mut Vec<Anomaly>,
) {
    let mut latest = None;
    let mut by = Vec::new();
    for step in steps.creating_enqueues() {
        let Operation::Enqueue { deadline, .. } = &step.operation else {
            continue;
        };
        let Some(deadline) = deadline else {
            return;
        };
        latest = latest.max(Some(*deadline));
        by.push(step.id);
    }
    let Some(deadline) = latest else {
        return;
    };
    for grant in &steps.grants {
        if grant.granted_at > deadline + skew {
            let mut operations = by.clone();
            operations.push(grant.step.id);
            anomalies.push(anomaly(
                AnomalyKind::GrantAfterDeadline,
                task,
                operations,
                format!(
                    "token {} granted at {}, the deadline was {deadline}",
                    grant.token, grant.granted_at
                ),
            ));
        }
    }
}

/// A one-attempt task's tries at the end, where the final state gives
/// them, are its grants (its last token: tokens count one per grant) less
/// the snoozes applied to it: every acknowledged snooze, and any of those
/// whose answer was lost. Anything else means a snooze spent a try, or a
/// grant was not counted as one.
pub(crate) fn tries(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    anomalies: &mut Vec<Anomaly>,
) {
    let Some(end) = end else {
        return;
    };
    let [attempt] = end.attempts.as_slice() else {
        return;
    };
    let Some(tries) = attempt.tries else {
        return;
    };
    let grants = end.last_token.unwrap_or(0);
    let snoozes: Vec<&Step> = steps
        .named
        .iter()
        .copied()
        .filter(|step| matches!(step.operation, Operation::Snooze { .. }))
        .collect();
    let acknowledged = snoozes
        .iter()
        .filter(|step| matches!(step.completion.outcome(), Some(Outcome::Snoozed { .. })))
        .count();
    let unknown = snoozes
        .iter()
        .filter(|step| step.completion.may_have_happened() && step.completion.outcome().is_none())
        .count();
    let most = grants - i64::try_from(acknowledged).unwrap_or(i64::MAX);
    let least = most - i64::try_from(unknown).unwrap_or(i64::MAX);
    let tries = i64::from(tries);
    if tries < least || tries > most {
        anomalies.push(anomaly(
            AnomalyKind::TriesMiscounted,
            task,
            snoozes.iter().map(|step| step.id).collect(),
            format!(
                "{tries} tries at the end after {grants} grants and {acknowledged} snoozes \
                 ({unknown} more unknown)"
            ),
        ));
    }
}
