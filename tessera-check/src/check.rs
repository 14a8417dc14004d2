//! The checker: a pure function from a history and the final state to the
//! anomalies in them, and the checks of enqueues and cancels.
//!
//! Operations are grouped once ([`Index`]: a map from task id to its
//! steps, and maps for queues and schedules), so every check looks only at
//! one task's, one queue's or one schedule's steps. The checks of each
//! concept live in a module of their own.

use std::fmt;

use chrono::TimeDelta;
use serde::{Deserialize, Serialize};

use crate::history::{History, Operation, OperationId, Outcome};
use crate::index::{Index, TaskSteps};
use crate::purge::Purges;
use crate::receipt::StoredReceipts;
use crate::state::{AttemptState, FinalState, FinalTask};
use crate::{dependency, grant, lease, limit, receipt, schedule, unique};

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
    /// Two tasks held one unique key of a queue at once: the later was
    /// acknowledged as stored while the earlier certainly held the key
    /// (enqueued before, and nothing that could finish it was invoked
    /// before the later enqueue completed, or it still holds it at the
    /// end).
    DuplicateUniqueKey,
    /// A grant was acknowledged while more leases of its queue (or of its
    /// task's partition) were certainly held than the limit set before its
    /// claim allowed.
    OverLimit,
    /// A grant was acknowledged whose claim started after its queue's
    /// pause was acknowledged, with no resume invoked before it completed.
    GrantWhilePaused,
    /// A grant was made after the deadline its task was enqueued with.
    GrantAfterDeadline,
    /// A one-attempt task's tries at the end differ from its grants less
    /// its snoozes: a snooze spent a try, or a grant was not counted.
    TriesMiscounted,
    /// One run-at of a schedule was fired twice: two fires acknowledged,
    /// or two fire rows stored.
    DoubledFire,
    /// An acknowledged fire has no fire row at the end, or a run-at the
    /// run says fell due, with no pause of its schedule possible around
    /// it, was never fired.
    LostFire,
    /// A task enqueued after parents, to run once each is done, was
    /// granted before a submission of one of its parents had even been
    /// asked for.
    RanBeforeParent,
}

impl AnomalyKind {
    /// Whether the anomaly is work lost: an acknowledged enqueue, fire or
    /// submission missing from the end.
    pub fn is_loss(self) -> bool {
        matches!(
            self,
            Self::LostEnqueue | Self::LostSubmit | Self::GrantLost | Self::LostFire
        )
    }
}

/// One thing the history and the final state show went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// What went wrong.
    pub kind: AnomalyKind,
    /// The task it happened to; for a run-at never fired, which has no
    /// task, `schedule <name> run-at <time>`.
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
    /// The tasks the history made that are missing at the end and that
    /// the store's retention may have purged ([`FinalState::retention`]),
    /// in id order.
    #[serde(default)]
    pub purged: Vec<String>,
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

    /// Anomalies that are work applied twice: a submission or a fire.
    pub fn doubled(&self) -> usize {
        self.count(|kind| matches!(kind, AnomalyKind::DoubledSubmit | AnomalyKind::DoubledFire))
    }

    fn count(&self, which: impl Fn(AnomalyKind) -> bool) -> usize {
        self.anomalies.iter().filter(|a| which(a.kind)).count()
    }
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
    /// anomaly. The same allowance is made wherever a store time meets
    /// another clock's: a lease's expiry at another grant, a deadline, a
    /// schedule's run-at and its pauses. Fencing tokens, not clocks, keep
    /// results correct: the stale-token check allows nothing for skew.
    pub clock_skew: TimeDelta,
}

/// [`check`], allowing for what `options` says.
pub fn check_with(history: &History, end: &FinalState, options: &CheckOptions) -> Report {
    let index = Index::new(history);
    let stored = StoredReceipts::new(end);
    let skew = options.clock_skew;
    let mut report = Report {
        anomalies: Vec::new(),
        operations: history.len(),
        unknown: 0,
        enqueued: 0,
        granted: 0,
        submitted: 0,
        purged: Vec::new(),
    };
    for step in history.steps() {
        if !step.completion.may_have_happened() {
            continue;
        }
        match step.completion.outcome() {
            None => report.unknown += 1,
            Some(Outcome::Enqueued) => report.enqueued += 1,
            Some(Outcome::Granted { .. }) => report.granted += 1,
            Some(Outcome::Accepted { .. } | Outcome::Replayed { .. }) => report.submitted += 1,
            Some(_) => {}
        }
    }
    let anomalies = &mut report.anomalies;
    let purges = Purges::new(&index, end, skew, anomalies);
    report.purged = purges.excused().map(str::to_owned).collect();
    let fired = schedule::schedules(&index, end, &purges, skew, anomalies);
    let mut unexplained_grants = 0;
    for (task, steps) in &index.tasks {
        let end_task = end.tasks.get(*task);
        let purged = purges.excuses(task);
        lease::leases(task, steps, skew, anomalies);
        lease::tokens(task, steps, end_task, purged, anomalies);
        receipt::submits(task, steps, &stored, purged, anomalies);
        let by_parent = dependency::may_be_cancelled_by_parent(steps, end);
        enqueues(
            task, steps, end_task, &stored, &purges, by_parent, anomalies,
        );
        cancels(task, steps, end_task, anomalies);
        duplicates(steps, end, &purges, anomalies);
        grant::deadline(task, steps, skew, anomalies);
        grant::tries(task, steps, end_task, anomalies);
        dependency::parents(task, steps, &index, anomalies);
        if let Some(last) = end_task.and_then(|t| t.last_token) {
            let acknowledged = i64::try_from(steps.grants.len()).unwrap_or(i64::MAX);
            unexplained_grants += (last - acknowledged).max(0);
        }
    }
    for (task, end_task) in &end.tasks {
        let steps = index.tasks.get(task.as_str());
        explained(task, steps, fired.contains(task.as_str()), anomalies);
        if steps.is_none() {
            unexplained_grants += end_task.last_token.unwrap_or(0).max(0);
        }
    }
    for task in stored.tasks() {
        receipt::stored(task, index.tasks.get(task), &stored, end, anomalies);
    }
    grant::paused(&index, anomalies);
    limit::limits(&index, skew, anomalies);
    unique::unique_keys(&index, end, anomalies);
    // Tokens count grants, so every grant the end shows beyond the
    // acknowledged ones needs a claim whose outcome is unknown.
    let unknown = i64::try_from(index.unknown_claims.len()).unwrap_or(i64::MAX);
    if unexplained_grants > unknown {
        anomalies.push(Anomaly {
            kind: AnomalyKind::Unexplained,
            task: "*".to_owned(),
            operations: index.unknown_claims.clone(),
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

pub(crate) fn anomaly(
    kind: AnomalyKind,
    task: &str,
    operations: Vec<OperationId>,
    detail: String,
) -> Anomaly {
    Anomaly {
        kind,
        task: task.to_owned(),
        operations,
        detail,
    }
}

fn enqueues(
    task: &str,
    steps: &TaskSteps<'_>,
    end: Option<&FinalTask>,
    stored: &StoredReceipts<'_>,
    purges: &Purges<'_>,
    cancelled_by_parent: bool,
    anomalies: &mut Vec<Anomaly>,
) {
    let acknowledged: Vec<OperationId> = steps
        .named
        .iter()
        .filter(|step| step.completion.outcome() == Some(&Outcome::Enqueued))
        .map(|step| step.id)
        .collect();
    let Some(end) = end else {
        if purges.excuses(task) {
            return;
        }
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
            let detail = match purges.refusal(task) {
                Some(why) => {
                    format!("the task is missing at the end, and cannot have been purged: {why}")
                }
                None => "the task is missing at the end".to_owned(),
            };
            anomalies.push(anomaly(AnomalyKind::LostEnqueue, task, witnesses, detail));
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
            AttemptState::Done => stored
                .of(task, attempt.number)
                .is_empty()
                .then_some("done without a receipt"),
            AttemptState::Failed => (!possible(&|op| {
                matches!(op, Operation::Fail { attempt: a, retry: false, .. } if *a == attempt.number)
            }))
            .then_some("failed though nobody failed it for good"),
            AttemptState::Cancelled => (!cancelled_by_parent
                && !possible(&|op| matches!(op, Operation::Cancel { .. })))
            .then_some("cancelled though nobody cancelled it, nor a parent it needed done"),
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

/// An enqueue answered as a duplicate handed its work to the holder it
/// named, which must be there at the end, or may have been purged.
fn duplicates(
    steps: &TaskSteps<'_>,
    end: &FinalState,
    purges: &Purges<'_>,
    anomalies: &mut Vec<Anomaly>,
) {
    for step in &steps.named {
        if let Some(Outcome::Duplicate { of }) = step.completion.outcome() {
            if !end.tasks.contains_key(of) && !purges.excuses(of) {
                anomalies.push(anomaly(
                    AnomalyKind::LostEnqueue,
                    of,
                    vec![step.id],
                    "an enqueue was answered as its duplicate, and it is missing at the end"
                        .to_owned(),
                ));
            }
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
                Some(
                    Outcome::Extended { .. }
                    | Outcome::Accepted { .. }
                    | Outcome::Failed
                    | Outcome::Snoozed { .. },
                ) => cancel.precedes(step),
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

/// A task at the end needs an operation that may have made it: an
/// enqueue not answered as a duplicate, or a schedule's fire (`fired`).
fn explained(task: &str, steps: Option<&TaskSteps<'_>>, fired: bool, anomalies: &mut Vec<Anomaly>) {
    let enqueued = steps.is_some_and(|s| s.creating_enqueues().next().is_some());
    if !enqueued && !fired {
        anomalies.push(anomaly(
            AnomalyKind::Unexplained,
            task,
            Vec::new(),
            "the task exists but no enqueue or fire may have made it".to_owned(),
        ));
    }
}
