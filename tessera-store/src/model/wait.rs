//! How a long-poll ends.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest one [`Store::wait_for_work`](crate::Store::wait_for_work) call waits.
pub const MAX_LONG_POLL: Duration = Duration::from_secs(300);

/// How a long-poll ended.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    /// The queue had a claimable task, or received an enqueue: claim now.
    WorkAvailable,
    /// The timeout passed without an enqueue.
    TimedOut,
}
