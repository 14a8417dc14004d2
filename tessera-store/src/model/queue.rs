//! A queue's stored settings: paused or not, and its concurrency limits.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_lease::{ConcurrencyLimit, QueueName, Retention};

/// A queue's settings, as stored in `queue_settings`.
///
/// A queue without a stored row has the default: not paused, no limit. A
/// row exists only while a setting differs from the default, so a queue
/// nobody configured costs its claims nothing more than before.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueSettings {
    /// The queue.
    pub queue: QueueName,
    /// When it was paused; `None` while it runs. A paused queue accepts
    /// enqueues, its live leases finish, and a claim on it is empty with
    /// the reason `paused`.
    #[serde(default)]
    pub paused_at: Option<DateTime<Utc>>,
    /// Its concurrency limits: at most so many leased attempts at once in
    /// the queue, and in each partition key of it.
    #[serde(default)]
    pub limit: ConcurrencyLimit,
}

impl QueueSettings {
    /// The settings of a queue nobody configured: running, no limit.
    pub fn unset(queue: QueueName) -> Self {
        Self {
            queue,
            paused_at: None,
            limit: ConcurrencyLimit::NONE,
        }
    }

    /// Whether the queue is paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }

    /// Whether every setting is the default, so no row is kept.
    pub fn is_unset(&self) -> bool {
        self.paused_at.is_none() && !self.limit.is_limited()
    }
}

/// How long a queue's finished tasks are kept: its own keep times, or the
/// store's ([`StoreConfig::with_retention`](crate::StoreConfig::with_retention)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueRetention {
    /// The queue.
    pub queue: QueueName,
    /// The keep times in force for it.
    pub retention: Retention,
    /// Whether they are the queue's own (`true`) or the store's.
    pub own: bool,
}
