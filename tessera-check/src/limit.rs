//! Concurrency limits: no grant is acknowledged while its queue (or its
//! task's partition) already holds as many leases as the limit in force.
//!
//! A lease counts at a grant only when it is certainly held there, as the
//! overlap check reads leases: acknowledged before the grant's claim was
//! invoked, unexpired at the grant's store time by its expiry as its
//! acknowledged heartbeats extended it (beyond the clock skew), and not
//! possibly ended (by its holder, a cancel, or a grant of its attempt
//! under a newer token, which found it lapsed) before the grant
//! completed. A grant's store time is read when its claim begins, and
//! the claim may count the leases much later (a stalled network), so a
//! lease taken over meanwhile is not counted.
//! Only heartbeats acknowledged before the claim was invoked count here:
//! one made later, by a clock behind the granting one, may have extended
//! a lease the grant rightly found lapsed.
//! Counting more than the store held is thus impossible; counting fewer
//! only misses an anomaly.
//!
//! Each queue's grants are swept in order of invocation with the leases
//! acknowledged so far, dropping those certainly ended, so a grant is
//! compared with the leases around it only (O(n log n) to sort, then the
//! leases live at once per grant).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Operation, Outcome, Step};
use crate::index::{Grant, Index, TaskSteps, acknowledged};
use crate::lease::{lease_of, may_end_from};

/// A grant with what decides whether its lease is held at another.
#[derive(Debug)]
struct Lease<'h> {
    grant: Grant<'h>,
    partition: Option<&'h str>,
    /// Its acknowledged heartbeats: when each completed (monotonic) and
    /// the expiry it set.
    extensions: Vec<(u64, DateTime<Utc>)>,
    /// Its expiry as extended by every acknowledged heartbeat.
    end: DateTime<Utc>,
    /// From when (monotonic) an operation may have ended it.
    ended_from: u64,
}

impl Lease<'_> {
    /// Its expiry as the heartbeats acknowledged before `claim` was
    /// invoked left it.
    fn end_before(&self, claim: &Step) -> DateTime<Utc> {
        self.extensions
            .iter()
            .filter(|(completed, _)| *completed < claim.invoked)
            .map(|(_, expires_at)| *expires_at)
            .fold(self.grant.expires_at, DateTime::max)
    }
}

/// The limits one acknowledged setting put in force.
#[derive(Debug, Clone, Copy)]
struct Limits<'h> {
    set_by: &'h Step,
    queue: Option<u32>,
    partition: Option<u32>,
}

pub(crate) fn limits(index: &Index<'_>, skew: TimeDelta, anomalies: &mut Vec<Anomaly>) {
    let mut by_queue: BTreeMap<&str, Vec<Lease<'_>>> = BTreeMap::new();
    for steps in index.tasks.values() {
        let partition = partition_of(steps);
        for grant in &steps.grants {
            let extensions: Vec<(u64, DateTime<Utc>)> = steps
                .named
                .iter()
                .filter(|step| lease_of(step) == Some((grant.attempt, grant.token)))
                .filter_map(|step| match step.completion.outcome() {
                    Some(Outcome::Extended { expires_at }) => Some((step.completed?, *expires_at)),
                    _ => None,
                })
                .collect();
            let end = extensions
                .iter()
                .map(|(_, expires_at)| *expires_at)
                .fold(grant.expires_at, DateTime::max);
            // A grant of the same attempt under a newer token found this
            // lease lapsed: it ended no later than that grant, and may
            // have from its invocation on.
            let taken_over = steps
                .grants
                .iter()
                .filter(|other| other.attempt == grant.attempt && other.token > grant.token)
                .map(|other| other.step.invoked)
                .min()
                .unwrap_or(u64::MAX);
            by_queue.entry(grant.queue).or_default().push(Lease {
                grant: *grant,
                partition,
                extensions,
                end,
                ended_from: may_end_from(grant, steps)
                    .unwrap_or(u64::MAX)
                    .min(taken_over),
            });
        }
    }
    for (queue, leases) in &by_queue {
        let Some(settings) = index.queues.get(queue) else {
            continue;
        };
        if !settings
            .iter()
            .any(|step| matches!(step.operation, Operation::SetLimits { .. }))
        {
            continue;
        }
        sweep(settings, leases, skew, anomalies);
    }
}

/// The partition the enqueues that may have made the task gave it, if
/// they agree.
fn partition_of<'h>(steps: &TaskSteps<'h>) -> Option<&'h str> {
    let mut partitions = steps.creating_enqueues().map(|step| match &step.operation {
        Operation::Enqueue { partition, .. } => partition.as_deref(),
        _ => None,
    });
    let first = partitions.next()??;
    partitions.all(|p| p == Some(first)).then_some(first)
}

fn sweep(settings: &[&Step], leases: &[Lease<'_>], skew: TimeDelta, anomalies: &mut Vec<Anomaly>) {
    let mut by_completion: Vec<&Lease<'_>> = leases.iter().collect();
    by_completion.sort_by_key(|lease| lease.grant.step.completed);
    let mut by_invocation: Vec<&Lease<'_>> = leases.iter().collect();
    by_invocation.sort_by_key(|lease| lease.grant.step.invoked);
    let mut held: Vec<&Lease<'_>> = Vec::new();
    let mut next = 0;
    for lease in by_invocation {
        let claim = lease.grant.step;
        while let Some(earlier) = by_completion.get(next) {
            if earlier.grant.step.completed >= Some(claim.invoked) {
                break;
            }
            held.push(earlier);
            next += 1;
        }
        // Ended before this claim began, or expired by its invoking
        // clock: no later claim counts it either (a later claim's grant
        // time is at least this invocation's wall time less the skew, and
        // a lease counts only when it expires after that plus the skew).
        held.retain(|earlier| {
            earlier.ended_from >= claim.invoked && earlier.end > claim.invoked_wall
        });
        let Some(limits) = in_force(settings, claim) else {
            continue;
        };
        let certainly_held: Vec<&Lease<'_>> = held
            .iter()
            .copied()
            .filter(|earlier| {
                let other = (earlier.grant.task, earlier.grant.attempt);
                other != (lease.grant.task, lease.grant.attempt)
                    && earlier.end_before(claim) > lease.grant.granted_at + skew
                    && Some(earlier.ended_from) >= claim.completed
            })
            .collect();
        let in_partition: Vec<&Lease<'_>> = certainly_held
            .iter()
            .copied()
            .filter(|earlier| lease.partition.is_some() && earlier.partition == lease.partition)
            .collect();
        let over = |limit: Option<u32>, counted: &[&Lease<'_>]| {
            let attempts: BTreeSet<_> = counted
                .iter()
                .map(|l| (l.grant.task, l.grant.attempt))
                .collect();
            limit.filter(|limit| attempts.len() + 1 > *limit as usize)
        };
        let found = match (
            over(limits.queue, &certainly_held),
            over(limits.partition, &in_partition),
        ) {
            (Some(limit), _) => Some((
                limit,
                &certainly_held,
                format!("queue {}", lease.grant.queue),
            )),
            (None, Some(limit)) => Some((
                limit,
                &in_partition,
                format!("partition {}", lease.partition.unwrap_or_default()),
            )),
            (None, None) => None,
        };
        if let Some((limit, counted, what)) = found {
            let mut operations = vec![limits.set_by.id, claim.id];
            operations.extend(counted.iter().map(|l| l.grant.step.id));
            anomalies.push(anomaly(
                AnomalyKind::OverLimit,
                lease.grant.task,
                operations,
                format!(
                    "token {} granted with {} other leases of {what} held, limit {limit}",
                    lease.grant.token,
                    counted.len()
                ),
            ));
        }
    }
}

/// The limits certainly in force for the whole of `claim`: set by an
/// acknowledged setting completed before it was invoked, and changed by
/// no other setting that may have happened unless it was acknowledged
/// before that one was invoked, or invoked after the claim completed.
fn in_force<'h>(settings: &[&'h Step], claim: &Step) -> Option<Limits<'h>> {
    let changes = || {
        settings
            .iter()
            .copied()
            .filter(|step| matches!(step.operation, Operation::SetLimits { .. }))
    };
    changes()
        .filter(|set| acknowledged(set) && set.precedes(claim))
        .find(|set| {
            changes().all(|other| {
                other.id == set.id
                    || !other.completion.may_have_happened()
                    || other.precedes(set)
                    || claim.completed <= Some(other.invoked)
            })
        })
        .and_then(|set| match set.operation {
            Operation::SetLimits {
                queue_limit,
                partition_limit,
                ..
            } => Some(Limits {
                set_by: set,
                queue: queue_limit,
                partition: partition_limit,
            }),
            _ => None,
        })
}
