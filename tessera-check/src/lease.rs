//! Leases: when one is certainly held, whether two of one attempt
//! overlap, and whether fencing tokens rise.
//!
//! Within a task the checks compare pairs of grants, which are few: each
//! grant uses up a try and attempts have a bounded number of tries.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Completion, Operation, OperationId, Outcome, Step};
use crate::index::{Grant, TaskSteps};
use crate::state::FinalTask;

/// The lease token and attempt a step acts under, if it acts under one.
pub(crate) fn lease_of(step: &Step) -> Option<(u32, i64)> {
    match step.operation {
        Operation::Heartbeat { attempt, token, .. }
        | Operation::Submit { attempt, token, .. }
        | Operation::Fail { attempt, token, .. }
        | Operation::Snooze { attempt, token, .. } => Some((attempt, token)),
        _ => None,
    }
}

/// Whether `step` may have ended its lease (or every lease, for a cancel).
pub(crate) fn may_end_lease(step: &Step) -> bool {
    let ends = match (&step.operation, &step.completion) {
        (Operation::Fail { .. } | Operation::Cancel { .. } | Operation::Snooze { .. }, _) => true,
        (Operation::Submit { .. }, Completion::Ok { outcome }) => {
            matches!(outcome, Outcome::Accepted { .. })
        }
        (Operation::Submit { .. }, _) => true,
        _ => false,
    };
    ends && step.completion.may_have_happened()
}

/// The end of `grant`'s lease as its acknowledged heartbeats extended
/// it, with the heartbeats that did.
pub(crate) fn lease_end(
    grant: &Grant<'_>,
    steps: &TaskSteps<'_>,
) -> (DateTime<Utc>, Vec<OperationId>) {
    let mut end = grant.expires_at;
    let mut extended_by = Vec::new();
    for step in &steps.named {
        if lease_of(step) != Some((grant.attempt, grant.token)) {
            continue;
        }
        if let Some(Outcome::Extended { expires_at }) = step.completion.outcome() {
            end = end.max(*expires_at);
            extended_by.push(step.id);
        }
    }
    (end, extended_by)
}

/// The earliest monotonic time from which `grant`'s lease may have been
/// ended by an operation (its holder's, or a cancel of the task): before
/// it, the lease is certainly held until its extended expiry. `None` if
/// nothing may have ended it.
pub(crate) fn may_end_from(grant: &Grant<'_>, steps: &TaskSteps<'_>) -> Option<u64> {
    steps
        .named
        .iter()
        .filter(|step| {
            may_end_lease(step)
                && (lease_of(step) == Some((grant.attempt, grant.token))
                    || matches!(step.operation, Operation::Cancel { .. }))
        })
        .map(|step| step.invoked)
        .min()
}

/// Where, in monotonic time, `cancel` can have taken effect between the
/// grant of `first` and the grant of `second`: an acknowledged cancel
/// within its own call, an unknown one any time after its invocation.
fn cancel_window(cancel: &Step, first: &Grant<'_>, second: &Grant<'_>) -> Option<(u64, u64)> {
    let upper = match cancel.completion {
        Completion::Ok { .. } => cancel.completed.unwrap_or(u64::MAX),
        _ => u64::MAX,
    };
    let from = cancel.invoked.max(first.step.invoked);
    let to = upper.min(second.step.completed.unwrap_or(u64::MAX));
    (from < to).then_some((from, to))
}

/// An overlap that only a cancel can excuse.
struct Excusable<'h> {
    anomaly: Anomaly,
    cancel: &'h Step,
    window: (u64, u64),
}

/// Two leases of one attempt overlap when their intervals (grant to
/// extended expiry, by the store's clock) intersect, unless the one with
/// the smaller token (granted first: tokens follow the store's order) may
/// have been ended by its holder or a cancel before the other was
/// acknowledged, or they overlap by no more than the clock skew allowed.
/// A grant's time is read when the claim starts, so it can be earlier
/// than an ending that committed before it; the token order is what the
/// store serialized.
///
/// A cancel takes effect once: it excuses an overlap only if it can be
/// placed after the first grant and before the second, and one cancel
/// excuses only overlaps it can all fall between at one moment.
pub(crate) fn leases(
    task: &str,
    steps: &TaskSteps<'_>,
    skew: TimeDelta,
    anomalies: &mut Vec<Anomaly>,
) {
    let ends: Vec<_> = steps.grants.iter().map(|g| lease_end(g, steps)).collect();
    let mut excusable = Vec::new();
    for (first, (end, extended_by)) in steps.grants.iter().zip(&ends) {
        for (second, (second_end, _)) in steps.grants.iter().zip(&ends) {
            if second.attempt != first.attempt
                || second.token <= first.token
                || second.granted_at + skew >= *end
                || first.granted_at >= *second_end + skew
            {
                continue;
            }
            let ended_by_holder = steps.named.iter().any(|step| {
                lease_of(step) == Some((first.attempt, first.token))
                    && may_end_lease(step)
                    && second.step.completed > Some(step.invoked)
            });
            if ended_by_holder {
                continue;
            }
            let mut operations = vec![first.step.id, second.step.id];
            operations.extend(extended_by);
            let found = anomaly(
                AnomalyKind::OverlappingLeases,
                task,
                operations,
                format!(
                    "attempt {}: token {} valid until {end}, token {} granted at {}",
                    first.attempt, first.token, second.token, second.granted_at
                ),
            );
            let cancels: Vec<(&Step, (u64, u64))> = steps
                .named
                .iter()
                .filter(|step| {
                    matches!(step.operation, Operation::Cancel { .. }) && may_end_lease(step)
                })
                .filter_map(|step| Some((*step, cancel_window(step, first, second)?)))
                .collect();
            match cancels[..] {
                [] => anomalies.push(found),
                [(cancel, window)] => excusable.push(Excusable {
                    anomaly: found,
                    cancel,
                    window,
                }),
                // Several cancels could: excused, without deciding which.
                _ => {}
            }
        }
    }
    placed_once(excusable, anomalies);
}

/// Overlaps each excusable by one cancel alone: the cancel is placed at
/// the moment inside the most of their windows, and the overlaps whose
/// window misses it are anomalies (named with the cancel).
fn placed_once(excusable: Vec<Excusable<'_>>, anomalies: &mut Vec<Anomaly>) {
    let mut by_cancel: BTreeMap<OperationId, Vec<Excusable<'_>>> = BTreeMap::new();
    for overlap in excusable {
        by_cancel
            .entry(overlap.cancel.id)
            .or_default()
            .push(overlap);
    }
    for (cancel, overlaps) in by_cancel {
        // The best moment is some window's start: sweep the starts.
        let covering = |at: u64| {
            overlaps
                .iter()
                .filter(|o| o.window.0 <= at && at <= o.window.1)
                .count()
        };
        let best = overlaps
            .iter()
            .map(|o| o.window.0)
            .max_by_key(|at| (covering(*at), std::cmp::Reverse(*at)))
            .unwrap_or(0);
        for overlap in overlaps {
            if overlap.window.0 <= best && best <= overlap.window.1 {
                continue;
            }
            let mut found = overlap.anomaly;
            found.operations.push(cancel);
            found.detail.push_str(
                "; the cancel that could have ended it takes effect once, \
                 at a moment another overlap needs",
            );
            anomalies.push(found);
        }
    }
}

pub(crate) fn tokens(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    purged: bool,
    anomalies: &mut Vec<Anomaly>,
) {
    for (n, a) in steps.grants.iter().enumerate() {
        for b in &steps.grants[n + 1..] {
            let (first, second) = if a.step.precedes(b.step) {
                (a, b)
            } else if b.step.precedes(a.step) {
                (b, a)
            } else if a.token == b.token {
                (a, b)
            } else {
                continue;
            };
            if first.token >= second.token {
                anomalies.push(anomaly(
                    AnomalyKind::TokenNotRising,
                    task,
                    vec![first.step.id, second.step.id],
                    format!("token {} granted, then token {}", first.token, second.token),
                ));
            }
        }
    }
    // A purged task's counter went with it.
    let highest = steps.grants.iter().max_by_key(|grant| grant.token);
    if let Some(grant) = highest.filter(|_| !purged) {
        let last = end.and_then(|t| t.last_token).unwrap_or(0);
        if last < grant.token {
            anomalies.push(anomaly(
                AnomalyKind::GrantLost,
                task,
                vec![grant.step.id],
                format!(
                    "token {} acknowledged, the counter ends at {last}",
                    grant.token
                ),
            ));
        }
    }
}
