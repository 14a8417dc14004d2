//! Whether each fault a run struck landed where it can do harm, read from
//! the run's history: a run whose faults missed proves nothing, so it
//! fails rather than passing as a chaos run.

use tessera_check::{Completion, History, Operation, Outcome, Step};

use crate::run::{Fault, Struck};

/// What shows that `fault` landed, in words, for a run that lacks it.
pub(crate) fn evidence_wanted(fault: Fault) -> &'static str {
    match fault {
        Fault::KillWorker => "a worker killed while it held a lease",
        Fault::KillLockHolder => "a process killed holding the write lock",
        Fault::RefuseWrites => "a write refused while writes were refused",
        Fault::RestartServer => "an operation under way when the server stopped",
        Fault::TerminateBackends => "a connection terminated",
        Fault::ExhaustPool => "a caller kept waiting while the connection slots were held",
        Fault::CutNetwork => "an operation under way when the network was cut",
        Fault::StallNetwork => "an operation held up while the network stalled",
        Fault::PauseHolder => {
            "a paused worker's heartbeat or submission answered under a token granted again"
        }
    }
}

/// Whether `struck` landed, judged from `history`.
pub(crate) fn landed(struck: &Struck, history: &History) -> bool {
    let steps = history.steps();
    match struck.fault {
        Fault::KillWorker => struck
            .process
            .is_some_and(|process| held_a_lease(steps, process, struck.began)),
        // The holder said it held the lock before it was killed.
        Fault::KillLockHolder => true,
        Fault::RefuseWrites => steps.iter().any(|step| {
            step.invoked >= struck.began
                && step.invoked <= struck.lifted
                && matches!(&step.completion, Completion::Fail { error } if error == "storage_quota_exhausted")
        }),
        Fault::TerminateBackends => struck.count > 0,
        // Invoked while the slots were held, and answered only after they
        // were let go, or not at all.
        Fault::ExhaustPool => steps.iter().any(|step| {
            step.invoked >= struck.began
                && step.invoked < struck.lifted
                && step.completed.is_none_or(|done| done >= struck.lifted)
        }),
        Fault::RestartServer | Fault::CutNetwork => {
            steps.iter().any(|step| under_way(step, struck.began))
        }
        // Held up by the stall: invoked before it was lifted, answered
        // after it began (or never).
        Fault::StallNetwork => steps.iter().any(|step| {
            step.invoked < struck.lifted && step.completed.is_none_or(|done| done > struck.began)
        }),
        Fault::PauseHolder => {
            let (refused, answered) = stale_answers(steps, struck);
            refused + answered > 0
        }
    }
}

/// Whether `step` was invoked before `at` and not answered by then.
fn under_way(step: &Step, at: u64) -> bool {
    step.invoked < at && step.completed.is_none_or(|done| done > at)
}

/// The lease a step's grant gave: task and token.
fn grant(step: &Step) -> Option<(&str, i64)> {
    match step.completion.outcome() {
        Some(Outcome::Granted { task, token, .. }) => Some((task.as_str(), *token)),
        _ => None,
    }
}

/// The lease an operation acts under: task and token.
fn acts_under(operation: &Operation) -> Option<(&str, i64)> {
    match operation {
        Operation::Heartbeat { task, token, .. }
        | Operation::Submit { task, token, .. }
        | Operation::Fail { task, token, .. } => Some((task.as_str(), *token)),
        _ => None,
    }
}

/// Whether `process` held a lease at `at`: granted to it before, and
/// neither submitted nor failed by it by then.
fn held_a_lease(steps: &[Step], process: u32, at: u64) -> bool {
    steps
        .iter()
        .filter(|step| step.id.process == process && step.completed.is_some_and(|done| done < at))
        .filter_map(grant)
        .any(|(task, token)| {
            !steps.iter().any(|step| {
                step.id.process == process
                    && step.completed.is_some_and(|done| done < at)
                    && acts_under(&step.operation) == Some((task, token))
                    && matches!(step.completion, Completion::Ok { .. })
            })
        })
}

/// The heartbeats and submissions a worker paused by `struck` had
/// answered after its pause, under a token of its own whose task another
/// process was granted meanwhile: how many were refused, and how many
/// answered otherwise (accepted, or unknown).
///
/// The worker was stopped from `began` to `lifted`, so its own leases are
/// those of claims it invoked before the pause, answered before it or
/// recorded only after it was continued (a claim the store granted while
/// the worker was stopped).
pub(crate) fn stale_answers(steps: &[Step], struck: &Struck) -> (usize, usize) {
    let (Some(process), at) = (struck.process, struck.began) else {
        return (0, 0);
    };
    let own: Vec<(&str, i64)> = steps
        .iter()
        .filter(|step| step.id.process == process && step.invoked < at)
        .filter_map(grant)
        .collect();
    let stale = steps.iter().filter(|step| {
        step.id.process == process
            && step.completed.is_some_and(|done| done > at)
            && acts_under(&step.operation).is_some_and(|(task, token)| {
                own.contains(&(task, token))
                    && steps.iter().any(|other| {
                        other.id.process != process
                            && other.invoked > at
                            && grant(other).is_some_and(|(t, newer)| t == task && newer > token)
                    })
            })
    });
    stale.fold((0, 0), |(refused, other), step| match step.completion {
        Completion::Fail { .. } => (refused + 1, other),
        _ => (refused, other + 1),
    })
}

/// Every fault kind `struck` holds that never landed, each with what was
/// wanted: a kind lands if one of its strikes did.
pub(crate) fn missed(struck: &[Struck], history: &History) -> Vec<String> {
    let mut kinds: Vec<Fault> = struck.iter().map(|s| s.fault).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .into_iter()
        .filter(|kind| {
            !struck
                .iter()
                .filter(|s| s.fault == *kind)
                .any(|s| landed(s, history))
        })
        .map(|kind| format!("{kind:?}: no {}", evidence_wanted(kind)))
        .collect()
}
