//! What a health read answers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_lease::{Namespace, QueueName};

use crate::model::queue::QueueSettings;

/// How long a health snapshot is served before it is taken again.
pub const HEALTH_SNAPSHOT_TTL: Duration = Duration::from_secs(15);

/// Attempts per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateCounts {
    /// Waiting to be claimed.
    pub ready: u64,
    /// Under a lease (lapsed ones included until they are claimed or
    /// expired; see [`HealthSnapshot::expired_leases`]).
    pub leased: u64,
    /// Submitted.
    pub done: u64,
    /// Given up.
    pub failed: u64,
    /// Waiting out a retry or lapse backoff.
    pub backoff: u64,
    /// Out of tries: the last one lapsed or failed asking for a retry.
    #[serde(default)]
    pub discarded: u64,
    /// Waiting for their not-before time.
    #[serde(default)]
    pub scheduled: u64,
    /// Cancelled by an operator, or because a parent the task needed done
    /// ended otherwise.
    #[serde(default)]
    pub cancelled: u64,
    /// Waiting for their parents to end.
    #[serde(default)]
    pub waiting: u64,
}

impl StateCounts {
    /// Every attempt.
    pub fn total(&self) -> u64 {
        self.ready
            + self.leased
            + self.done
            + self.failed
            + self.backoff
            + self.discarded
            + self.scheduled
            + self.cancelled
            + self.waiting
    }
}

/// One queue's depth: its unfinished tasks, by whether a claim could take
/// them now.
///
/// Read from the claim order and the lease index alone, so taking it costs
/// one index entry per unfinished task and none per finished one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueDepth {
    /// The queue.
    pub queue: QueueName,
    /// Tasks a claim could take now: ready, or past their backoff or
    /// not-before time (a paused or full queue's included).
    pub ready: u64,
    /// Tasks waiting out a retry backoff or a not-before time.
    pub delayed: u64,
    /// Tasks under a lease, lapsed ones included.
    pub leased: u64,
    /// When the first-enqueued of the tasks a claim could take now was
    /// enqueued: its age is how long the queue's oldest work has waited
    /// (a retried task counts from its enqueue). `None` when none could be
    /// taken. One task row read per queue, besides the index entries.
    #[serde(default)]
    pub oldest_ready_at: Option<DateTime<Utc>>,
}

impl QueueDepth {
    /// A queue with nothing unfinished.
    pub fn empty(queue: QueueName) -> Self {
        Self {
            queue,
            ready: 0,
            delayed: 0,
            leased: 0,
            oldest_ready_at: None,
        }
    }
}

/// A namespace's health at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// The namespace.
    pub namespace: Namespace,
    /// When the snapshot was taken; it is served unchanged for up to
    /// [`HEALTH_SNAPSHOT_TTL`] unless the namespace changes.
    pub taken_at: DateTime<Utc>,
    /// Attempts per state.
    pub attempts: StateCounts,
    /// Leases that lapsed and have not yet been taken over or expired.
    pub expired_leases: u64,
    /// The namespace's configured queues, by name: those paused or with a
    /// concurrency limit (a queue never configured is not listed).
    #[serde(default)]
    pub queues: Vec<QueueSettings>,
    /// Every queue with unfinished tasks, by name: how many are ready,
    /// delayed and leased.
    #[serde(default)]
    pub depths: Vec<QueueDepth>,
}
