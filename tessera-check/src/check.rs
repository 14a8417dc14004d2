//! The checker: a pure function from a history and the final state to the
//! anomalies in them.
//!
//! Operations are grouped by task once (a map from task id to its steps),
//! so every check looks only at one task's steps. Within a task the
//! checks compare pairs of grants, which are few: each grant uses up a try
//! and attempts have a bounded number of tries.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::history::{Completion, History, Operation, OperationId, Outcome, Receipt, Step};
use crate::state::{AttemptState, FinalAttempt, FinalState, FinalTask};

/// What kind of thing went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AnomalyKind {
    /// Two acknowledged leases of one attempt were valid at once: the
    /// later was granted before the earlier's expiry (as extended by its
    /// acknowledged heartbeats), and the earlier was not ended first.
    OverlappingLeases,
    /// Two acknowledged grants of one task, one acknowledged before the
    /// other was asked for, whose tokens do not rise in that order (or are
    /// equal).
    TokenNotRising,
    /// The task's final token counter is below a token a grant
    /// acknowledged.
    GrantLost,
    /// An acknowledged submission is not in the final state as
    /// acknowledged.
    LostSubmit,
    /// One attempt has more than one receipt, or two different receipts
    /// were acknowledged for it.
    DoubledSubmit,
    /// A replay returned a receipt other than the one stored.
    ReplayMismatch,
    /// A submission was accepted under a token that a later acknowledged
    /// grant of the same attempt had already superseded.
    StaleSubmitAccepted,
    /// An acknowledged enqueue's task is missing at the end, or ended in a
    /// state no operation explains (done without a receipt, failed or
    /// cancelled by nobody).
    LostEnqueue,
    /// A grant, heartbeat, submission or failure report was acknowledged
    /// after the task's cancel was.
    RanAfterCancel,
    /// An acknowledged cancel left an attempt unfinished.
    LostCancel,
    /// The final state holds an effect that no acknowledged or unknown
    /// operation could have made.
    Unexplained,
}

impl AnomalyKind {
    /// Whether the anomaly is work lost: an acknowledged enqueue or
    /// submission missing from the end.
    pub fn is_loss(self) -> bool {
        matches!(self, Self::LostEnqueue | Self::LostSubmit | Self::GrantLost)
    }
}

/// One thing the history and the final state show went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// What went wrong.
    pub kind: AnomalyKind,
    /// The task it happened to.
    pub task: String,
    /// The operations involved, in id order.
    pub operations: Vec<OperationId>,
    /// What was seen, for a person.
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on task {}: {} [",
            self.kind, self.task, self.detail
        )?;
        for (n, id) in self.operations.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{id}")?;
        }
        f.write_str("]")
    }
}

/// The checker's verdict on one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[must_use]
pub struct Report {
    /// Every anomaly found, by kind, task and operations.
    pub anomalies: Vec<Anomaly>,
    /// Operations in the history.
    pub operations: usize,
    /// Operations whose outcome is unknown.
    pub unknown: usize,
    /// Acknowledged enqueues.
    pub enqueued: usize,
    /// Acknowledged grants.
    pub granted: usize,
    /// Acknowledged submissions, accepted or replayed.
    pub submitted: usize,
}

impl Report {
    /// Whether no anomaly was found.
    pub fn is_valid(&self) -> bool {
        self.anomalies.is_empty()
    }

    /// Anomalies that are lost work.
    pub fn lost(&self) -> usize {
        self.count(AnomalyKind::is_loss)
    }

    /// Anomalies that are a submission applied twice.
    pub fn doubled(&self) -> usize {
        self.count(|kind| kind == AnomalyKind::DoubledSubmit)
    }

    fn count(&self, which: impl Fn(AnomalyKind) -> bool) -> usize {
        self.anomalies.iter().filter(|a| which(a.kind)).count()
    }
}

/// An acknowledged grant.
#[derive(Debug, Clone, Copy)]
struct Grant<'h> {
    step: &'h Step,
    attempt: u32,
    token: i64,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

/// One task's steps.
#[derive(Debug, Default)]
struct TaskSteps<'h> {
    /// Steps that name the task before running (all but claims).
    named: Vec<&'h Step>,
    grants: Vec<Grant<'h>>,
}

/// Checks `history` against `end`, the store's state read after the run,
/// and returns every anomaly found.
///
/// Acknowledged operations must all show in the end; operations whose
/// outcome is unknown may or may not have happened, but every effect in
/// the end must be one some operation could have made.
pub fn check(history: &History, end: &FinalState) -> Report {
    check_with(history, end, &CheckOptions::default())
}

/// What the checker allows for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckOptions {
    /// The most two processes' clocks differ. Leases are timed by the
    /// clock of the process that granted or extended them, so two leases
    /// of one attempt may seem to overlap by up to this much when their
    /// times come from different clocks; only a longer overlap is an
    /// anomaly. Fencing tokens, not clocks, keep results correct: the
    /// stale-token check allows nothing for skew.
    pub clock_skew: TimeDelta,
}

/// [`check`], allowing for what `options` says.
pub fn check_with(history: &History, end: &FinalState, options: &CheckOptions) -> Report {
    let mut tasks: BTreeMap<&str, TaskSteps<'_>> = BTreeMap::new();
    let mut unknown_claims: Vec<OperationId> = Vec::new();
    let mut report = Report {
        anomalies: Vec::new(),
        operations: history.len(),
        unknown: 0,
        enqueued: 0,
        granted: 0,
        submitted: 0,
    };
    for step in history.steps() {
        if matches!(step.completion, Completion::Unknown { .. }) {
            report.unknown += 1;
        }
        match (&step.operation, step.completion.outcome()) {
            (Operation::Claim { .. }, Some(outcome)) => {
                if let Outcome::Granted {
                    task,
                    attempt,
                    token,
                    granted_at,
                    expires_at,
                } = outcome
                {
                    report.granted += 1;
                    tasks.entry(task).or_default().grants.push(Grant {
                        step,
                        attempt: *attempt,
                        token: *token,
                        granted_at: *granted_at,
                        expires_at: *expires_at,
                    });
                }
            }
            (Operation::Claim { .. }, None) => {
                if step.completion.may_have_happened() {
                    unknown_claims.push(step.id);
                }
            }
            (operation, outcome) => {
                match outcome {
                    Some(Outcome::Enqueued) => report.enqueued += 1,
                    Some(Outcome::Accepted { .. } | Outcome::Replayed { .. }) => {
                        report.submitted += 1;
                    }
                    _ => {}
                }
                let task = operation
                    .task()
                    .expect("every operation but a claim names a task");
                tasks.entry(task).or_default().named.push(step);
            }
        }
    }
    let anomalies = &mut report.anomalies;
    let mut unexplained_grants = 0;
    for (task, steps) in &tasks {
        let end_task = end.tasks.get(*task);
        leases(task, steps, options.clock_skew, anomalies);
        tokens(task, steps, end_task, anomalies);
        submits(task, steps, end_task, anomalies);
        enqueues(task, steps, end_task, anomalies);
        cancels(task, steps, end_task, anomalies);
        if let Some(last) = end_task.and_then(|t| t.last_token) {
            let acknowledged = i64::try_from(steps.grants.len()).unwrap_or(i64::MAX);
            unexplained_grants += (last - acknowledged).max(0);
        }
    }
    for (task, end_task) in &end.tasks {
        let steps = tasks.get(task.as_str());
        explained(task, steps, end_task, anomalies);
        if steps.is_none() {
            unexplained_grants += end_task.last_token.unwrap_or(0).max(0);
        }
    }
    // Tokens count grants, so every grant the end shows beyond the
    // acknowledged ones needs a claim whose outcome is unknown.
    let unknown = i64::try_from(unknown_claims.len()).unwrap_or(i64::MAX);
    if unexplained_grants > unknown {
        anomalies.push(Anomaly {
            kind: AnomalyKind::Unexplained,
            task: "*".to_owned(),
            operations: unknown_claims,
            detail: format!(
                "the final token counters show {unexplained_grants} grants nobody acknowledged, \
                 but only {unknown} claims have an unknown outcome"
            ),
        });
    }
    for anomaly in anomalies.iter_mut() {
        anomaly.operations.sort_unstable();
        anomaly.operations.dedup();
    }
    anomalies
        .sort_by(|a, b| (a.kind, &a.task, &a.operations).cmp(&(b.kind, &b.task, &b.operations)));
    report
}

fn anomaly(kind: AnomalyKind, task: &str, operations: Vec<OperationId>, detail: String) -> Anomaly {
    Anomaly {
        kind,
        task: task.to_owned(),
        operations,
        detail,
    }
}

/// The lease token and attempt a step acts under, if it acts under one.
fn lease_of(step: &Step) -> Option<(u32, i64)> {
    match step.operation {
        Operation::Heartbeat { attempt, token, .. }
        | Operation::Submit { attempt, token, .. }
        | Operation::Fail { attempt, token, .. } => Some((attempt, token)),
        _ => None,
    }
}

/// Whether `step` may have ended its lease (or every lease, for a cancel).
fn may_end_lease(step: &Step) -> bool {
    let ends = match (&step.operation, &step.completion) {
        (Operation::Fail { .. } | Operation::Cancel { .. }, _) => true,
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
fn lease_end(grant: &Grant<'_>, steps: &TaskSteps<'_>) -> (DateTime<Utc>, Vec<OperationId>) {
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

/// Two leases of one attempt overlap when their intervals (grant to
/// extended expiry, by the store's clock) intersect, unless the one with
/// the smaller token (granted first: tokens follow the store's order) may
/// have been ended by its holder or a cancel before the other was
/// acknowledged, or they overlap by no more than the clock skew allowed. A grant's time is read when the claim starts, so it can
/// be earlier than an ending that committed before it; the token order
/// is what the store serialized.
fn leases(task: &str, steps: &TaskSteps<'_>, skew: TimeDelta, anomalies: &mut Vec<Anomaly>) {
    let ends: Vec<_> = steps.grants.iter().map(|g| lease_end(g, steps)).collect();
    for (first, (end, extended_by)) in steps.grants.iter().zip(&ends) {
        for (second, (second_end, _)) in steps.grants.iter().zip(&ends) {
            if second.attempt != first.attempt
                || second.token <= first.token
                || second.granted_at + skew >= *end
                || first.granted_at >= *second_end + skew
            {
                continue;
            }
            let ended = steps.named.iter().any(|step| {
                let on_first = lease_of(step) == Some((first.attempt, first.token))
                    || matches!(step.operation, Operation::Cancel { .. });
                on_first && may_end_lease(step) && second.step.completed > Some(step.invoked)
            });
            if ended {
                continue;
            }
            let mut operations = vec![first.step.id, second.step.id];
            operations.extend(extended_by);
            anomalies.push(anomaly(
                AnomalyKind::OverlappingLeases,
                task,
                operations,
                format!(
                    "attempt {}: token {} valid until {end}, token {} granted at {}",
                    first.attempt, first.token, second.token, second.granted_at
                ),
            ));
        }
    }
}

fn tokens(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
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
    let highest = steps.grants.iter().max_by_key(|grant| grant.token);
    if let Some(grant) = highest {
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

fn same_receipt(a: &Receipt, b: &Receipt) -> bool {
    a == b
}

fn final_attempt(end: Option<&FinalTask>, number: u32) -> Option<&FinalAttempt> {
    end?.attempts
        .iter()
        .find(|attempt| attempt.number == number)
}

fn submits(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    anomalies: &mut Vec<Anomaly>,
) {
    // Acknowledged receipts per attempt, with the step that got each.
    let mut acknowledged: BTreeMap<u32, Vec<(&Receipt, &Step)>> = BTreeMap::new();
    for step in &steps.named {
        let Operation::Submit { attempt, token, .. } = step.operation else {
            continue;
        };
        let (receipt, accepted) = match step.completion.outcome() {
            Some(Outcome::Accepted { receipt }) => (receipt, true),
            Some(Outcome::Replayed { receipt }) => (receipt, false),
            _ => continue,
        };
        acknowledged
            .entry(attempt)
            .or_default()
            .push((receipt, step));
        let stored = final_attempt(end, attempt)
            .is_some_and(|a| a.receipts.iter().any(|r| same_receipt(r, receipt)));
        if !stored {
            anomalies.push(anomaly(
                AnomalyKind::LostSubmit,
                task,
                vec![step.id],
                format!(
                    "attempt {attempt}: acknowledged receipt under token {token} is not stored"
                ),
            ));
        }
        if accepted {
            let superseded = steps.grants.iter().find(|grant| {
                grant.attempt == attempt && grant.token > token && grant.step.precedes(step)
            });
            if let Some(grant) = superseded {
                anomalies.push(anomaly(
                    AnomalyKind::StaleSubmitAccepted,
                    task,
                    vec![grant.step.id, step.id],
                    format!(
                        "attempt {attempt}: token {token} accepted after token {} was granted",
                        grant.token
                    ),
                ));
            }
        } else {
            // A replay returns the receipt stored under its key.
            let mismatched = steps.named.iter().find(|other| {
                matches!(other.completion.outcome(),
                    Some(Outcome::Accepted { receipt: original })
                        if original.key == receipt.key && original.attempt == receipt.attempt
                            && !same_receipt(original, receipt))
            });
            if let Some(original) = mismatched {
                anomalies.push(anomaly(
                    AnomalyKind::ReplayMismatch,
                    task,
                    vec![original.id, step.id],
                    format!("attempt {attempt}: replay of key {} differs", receipt.key),
                ));
            }
        }
    }
    for (attempt, receipts) in &acknowledged {
        let (first, first_step) = receipts[0];
        for (receipt, step) in &receipts[1..] {
            if !same_receipt(first, receipt) {
                anomalies.push(anomaly(
                    AnomalyKind::DoubledSubmit,
                    task,
                    vec![first_step.id, step.id],
                    format!(
                        "attempt {attempt}: receipts under tokens {} and {} both acknowledged",
                        first.token, receipt.token
                    ),
                ));
            }
        }
    }
    for attempt in end.map_or(&[][..], |t| &t.attempts[..]) {
        if attempt.receipts.len() > 1 {
            let operations = steps
                .named
                .iter()
                .filter(|step| match &step.operation {
                    Operation::Submit {
                        attempt: number,
                        token,
                        key,
                        ..
                    } => {
                        *number == attempt.number
                            && attempt
                                .receipts
                                .iter()
                                .any(|r| r.token == *token && &r.key == key)
                    }
                    _ => false,
                })
                .map(|step| step.id)
                .collect();
            anomalies.push(anomaly(
                AnomalyKind::DoubledSubmit,
                task,
                operations,
                format!(
                    "attempt {} holds {} receipts",
                    attempt.number,
                    attempt.receipts.len()
                ),
            ));
        }
    }
}

fn enqueues(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    anomalies: &mut Vec<Anomaly>,
) {
    let acknowledged: Vec<OperationId> = steps
        .named
        .iter()
        .filter(|step| step.completion.outcome() == Some(&Outcome::Enqueued))
        .map(|step| step.id)
        .collect();
    let Some(end) = end else {
        // Missing: lost if anything acknowledged the task existed.
        let mut witnesses: Vec<OperationId> = steps.grants.iter().map(|g| g.step.id).collect();
        witnesses.extend(acknowledged);
        witnesses.extend(
            steps
                .named
                .iter()
                .filter(|step| {
                    !matches!(step.operation, Operation::Enqueue { .. })
                        && step.completion.outcome().is_some()
                })
                .map(|step| step.id),
        );
        if !witnesses.is_empty() {
            anomalies.push(anomaly(
                AnomalyKind::LostEnqueue,
                task,
                witnesses,
                "the task is missing at the end".to_owned(),
            ));
        }
        return;
    };
    if acknowledged.is_empty() {
        return;
    }
    for attempt in &end.attempts {
        let possible = |wanted: &dyn Fn(&Operation) -> bool| {
            steps
                .named
                .iter()
                .any(|step| wanted(&step.operation) && step.completion.may_have_happened())
        };
        let unexplained = match attempt.state {
            AttemptState::Done => attempt.receipts.is_empty().then_some("done without a receipt"),
            AttemptState::Failed => (!possible(&|op| {
                matches!(op, Operation::Fail { attempt: a, retry: false, .. } if *a == attempt.number)
            }))
            .then_some("failed though nobody failed it for good"),
            AttemptState::Cancelled => (!possible(&|op| matches!(op, Operation::Cancel { .. })))
                .then_some("cancelled though nobody cancelled it"),
            _ => None,
        };
        if let Some(what) = unexplained {
            anomalies.push(anomaly(
                AnomalyKind::LostEnqueue,
                task,
                acknowledged.clone(),
                format!("attempt {}: {what}", attempt.number),
            ));
        }
    }
}

fn cancels(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    anomalies: &mut Vec<Anomaly>,
) {
    let cancels = steps.named.iter().filter(|step| {
        matches!(step.operation, Operation::Cancel { .. })
            && step.completion.outcome() == Some(&Outcome::Cancelled)
    });
    for cancel in cancels {
        for grant in &steps.grants {
            if cancel.precedes(grant.step) {
                anomalies.push(anomaly(
                    AnomalyKind::RanAfterCancel,
                    task,
                    vec![cancel.id, grant.step.id],
                    format!("token {} granted after the cancel", grant.token),
                ));
            }
        }
        for step in &steps.named {
            let ran = match step.completion.outcome() {
                Some(Outcome::Extended { .. } | Outcome::Accepted { .. } | Outcome::Failed) => {
                    cancel.precedes(step)
                }
                _ => false,
            };
            if ran {
                anomalies.push(anomaly(
                    AnomalyKind::RanAfterCancel,
                    task,
                    vec![cancel.id, step.id],
                    "acknowledged after the cancel".to_owned(),
                ));
            }
        }
        for attempt in end.map_or(&[][..], |t| &t.attempts[..]) {
            if !attempt.state.is_final() {
                anomalies.push(anomaly(
                    AnomalyKind::LostCancel,
                    task,
                    vec![cancel.id],
                    format!("attempt {} ends {:?}", attempt.number, attempt.state),
                ));
            }
        }
    }
}

/// Every effect the end shows for `task` needs an operation that may have
/// made it: the task an enqueue, each receipt a submission.
fn explained(
    task: &str,
    steps: Option<&TaskSteps<'_>>,
    end: &FinalTask,
    anomalies: &mut Vec<Anomaly>,
) {
    let named = steps.map_or(&[][..], |s| &s.named[..]);
    let enqueued = named.iter().any(|step| {
        matches!(step.operation, Operation::Enqueue { .. }) && step.completion.may_have_happened()
    });
    if !enqueued {
        anomalies.push(anomaly(
            AnomalyKind::Unexplained,
            task,
            Vec::new(),
            "the task exists but no enqueue may have made it".to_owned(),
        ));
    }
    let submitters: HashMap<(u32, i64, &str, &str), OperationId> = named
        .iter()
        .filter(|step| step.completion.may_have_happened())
        .filter_map(|step| match &step.operation {
            Operation::Submit {
                attempt,
                token,
                key,
                digest,
                ..
            } => Some(((*attempt, *token, key.as_str(), digest.as_str()), step.id)),
            _ => None,
        })
        .collect();
    for attempt in &end.attempts {
        for receipt in &attempt.receipts {
            let made_by = (
                attempt.number,
                receipt.token,
                receipt.key.as_str(),
                receipt.digest.as_str(),
            );
            if receipt.attempt != attempt.number || !submitters.contains_key(&made_by) {
                anomalies.push(anomaly(
                    AnomalyKind::Unexplained,
                    task,
                    Vec::new(),
                    format!(
                        "attempt {}: a receipt under token {} key {} no submission may have made",
                        attempt.number, receipt.token, receipt.key
                    ),
                ));
            }
        }
    }
}
