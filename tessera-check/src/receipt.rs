//! Receipts: every acknowledged submission stored as acknowledged, once,
//! and every stored row made by some submission.
//!
//! The stored rows are gathered once into a map from (task, attempt) to
//! rows, so each task's checks read only its own.

use std::collections::{BTreeMap, HashSet};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Operation, OperationId, Outcome, Receipt, Step};
use crate::index::TaskSteps;
use crate::state::FinalState;

/// Every receipt row of the end, by task and the attempt it is listed
/// under.
#[derive(Debug, Default)]
pub(crate) struct StoredReceipts<'e> {
    rows: BTreeMap<&'e str, BTreeMap<u32, Vec<&'e Receipt>>>,
}

impl<'e> StoredReceipts<'e> {
    /// Rows listed under an attempt count for that attempt (a row naming
    /// another one is unexplained); loose rows for the attempt they name.
    pub(crate) fn new(end: &'e FinalState) -> Self {
        let mut rows: BTreeMap<&str, BTreeMap<u32, Vec<&Receipt>>> = BTreeMap::new();
        for (task, stored) in &end.tasks {
            for attempt in stored.attempts.iter().filter(|a| !a.receipts.is_empty()) {
                rows.entry(task)
                    .or_default()
                    .entry(attempt.number)
                    .or_default()
                    .extend(&attempt.receipts);
            }
        }
        for row in &end.receipts {
            rows.entry(&row.task)
                .or_default()
                .entry(row.receipt.attempt)
                .or_default()
                .push(&row.receipt);
        }
        Self { rows }
    }

    /// The rows of one attempt.
    pub(crate) fn of(&self, task: &str, attempt: u32) -> &[&'e Receipt] {
        self.rows
            .get(task)
            .and_then(|attempts| attempts.get(&attempt))
            .map_or(&[], Vec::as_slice)
    }

    /// The rows of one task, by attempt.
    pub(crate) fn of_task(&self, task: &str) -> impl Iterator<Item = (u32, &[&'e Receipt])> {
        self.rows
            .get(task)
            .into_iter()
            .flatten()
            .map(|(attempt, rows)| (*attempt, rows.as_slice()))
    }

    /// Every task that holds a row.
    pub(crate) fn tasks(&self) -> impl Iterator<Item = &'e str> + '_ {
        self.rows.keys().copied()
    }
}

pub(crate) fn submits(
    task: &str,
    steps: &TaskSteps<'_>,
    stored: &StoredReceipts<'_>,
    purged: bool,
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
        // A purged task's receipts went with it.
        if !purged && !stored.of(task, attempt).contains(&receipt) {
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
                            && original != receipt)
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
            if first != *receipt {
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
}

/// The submissions of `steps` that may have stored one of `rows`.
fn submitters_of(steps: &TaskSteps<'_>, attempt: u32, rows: &[&Receipt]) -> Vec<OperationId> {
    steps
        .named
        .iter()
        .filter(|step| match &step.operation {
            Operation::Submit {
                attempt: number,
                token,
                key,
                ..
            } => *number == attempt && rows.iter().any(|r| r.token == *token && &r.key == key),
            _ => false,
        })
        .map(|step| step.id)
        .collect()
}

/// What the rows of one task show: no attempt holds two rows, no more
/// attempts hold one than the task allows alternatives, and a submission
/// that may have happened made each row (for the attempt it is listed
/// under, one the task has).
pub(crate) fn stored(
    task: &str,
    steps: Option<&TaskSteps<'_>>,
    stored: &StoredReceipts<'_>,
    end: &FinalState,
    anomalies: &mut Vec<Anomaly>,
) {
    let empty = TaskSteps::default();
    let steps = steps.unwrap_or(&empty);
    let attempts: Option<HashSet<u32>> = end
        .tasks
        .get(task)
        .map(|t| t.attempts.iter().map(|a| a.number).collect());
    let submitters: HashSet<(u32, i64, &str, &str)> = steps
        .named
        .iter()
        .filter(|step| step.completion.may_have_happened())
        .filter_map(|step| match &step.operation {
            Operation::Submit {
                attempt,
                token,
                key,
                digest,
                ..
            } => Some((*attempt, *token, key.as_str(), digest.as_str())),
            _ => None,
        })
        .collect();
    let mut finished = Vec::new();
    for (attempt, rows) in stored.of_task(task) {
        finished.push(attempt);
        if rows.len() > 1 {
            anomalies.push(anomaly(
                AnomalyKind::DoubledSubmit,
                task,
                submitters_of(steps, attempt, rows),
                format!("attempt {attempt} holds {} receipts", rows.len()),
            ));
        }
        let listed = attempts.as_ref().is_some_and(|a| a.contains(&attempt));
        for receipt in rows {
            let made_by = (
                attempt,
                receipt.token,
                receipt.key.as_str(),
                receipt.digest.as_str(),
            );
            if !listed || receipt.attempt != attempt || !submitters.contains(&made_by) {
                anomalies.push(anomaly(
                    AnomalyKind::Unexplained,
                    task,
                    Vec::new(),
                    format!(
                        "attempt {attempt}: a receipt under token {} key {} no submission \
                         may have made",
                        receipt.token, receipt.key
                    ),
                ));
            }
        }
    }
    let allowed = end.alternatives.get(task).copied();
    if let Some(allowed) = allowed.filter(|a| finished.len() > usize::from(*a)) {
        let operations = finished
            .iter()
            .flat_map(|attempt| submitters_of(steps, *attempt, stored.of(task, *attempt)))
            .collect();
        anomalies.push(anomaly(
            AnomalyKind::DoubledSubmit,
            task,
            operations,
            format!(
                "{} attempts hold receipts, the task allows {allowed}",
                finished.len()
            ),
        ));
    }
}
