//! What a claim comes to.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_lease::{Lease, QueueName};

use crate::model::task::{Brief, TaskRef};

/// Why a claim came back empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmptyReason {
    /// Nothing in the queue was claimable.
    #[default]
    Empty,
    /// The queue is paused ([`Store::pause_queue`](crate::Store::pause_queue)).
    Paused,
    /// Claimable tasks wait, but the queue's concurrency limit is reached,
    /// or every partition key they have is at its limit.
    Limited,
}

impl EmptyReason {
    /// The stable name (`X-Claim-Empty-Reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Paused => "paused",
            Self::Limited => "limited",
        }
    }
}

/// A claim granted a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claimed {
    /// The task.
    pub task: TaskRef,
    /// The queue it came from.
    pub queue: QueueName,
    /// The lease: attempt, fencing token, holder, expiry and the
    /// [`artifact`](Lease::artifact) key the output goes under.
    pub lease: Lease,
    /// The task's input.
    pub brief: Brief,
    /// How long the claim waited for admission (`X-Claim-Wait-Ms`);
    /// `waited_ms` in serde, in whole milliseconds.
    #[serde(rename = "waited_ms", with = "crate::model::millis")]
    pub waited: Duration,
    /// The admission limit when the claim finished (`X-Claim-Concurrency`).
    pub concurrency_limit: u32,
}

/// The most tasks one [`Store::claim_batch`](crate::Store::claim_batch)
/// leases.
pub const MAX_CLAIM_BATCH: usize = 100;

/// What a [`claim_batch`](crate::Store::claim_batch) came to.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedBatch {
    /// The leases granted, in claim order; empty when the queue had
    /// nothing claimable (`204`).
    pub claimed: Vec<Claimed>,
    /// The idle-pacing hint (`Retry-After`) when nothing was claimable;
    /// `retry_after_ms` in serde.
    #[serde(rename = "retry_after_ms", with = "crate::model::millis::optional")]
    pub retry_after: Option<Duration>,
    /// How long the batch waited for admission; `waited_ms` in serde.
    #[serde(rename = "waited_ms", with = "crate::model::millis")]
    pub waited: Duration,
    /// The admission limit when the batch finished.
    pub concurrency_limit: u32,
    /// Why nothing was claimed; `None` when something was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<EmptyReason>,
}

/// What a claim came to.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum ClaimOutcome {
    /// A lease on the oldest claimable task (`200`).
    Granted(Claimed),
    /// The queue had nothing claimable (`204`): counted, not audited, and
    /// nothing written.
    Empty {
        /// The idle-pacing hint (`Retry-After`): 5, 10, 20, 40, then 60 s
        /// while this key keeps finding this queue empty or paused, and
        /// [`LIMITED_RETRY_AFTER`](crate::limits::LIMITED_RETRY_AFTER) for a
        /// queue at its limit; `retry_after_ms` in serde.
        #[serde(rename = "retry_after_ms", with = "crate::model::millis")]
        retry_after: Duration,
        /// How long the claim waited for admission; `waited_ms` in serde.
        #[serde(rename = "waited_ms", with = "crate::model::millis")]
        waited: Duration,
        /// The admission limit when the claim finished.
        concurrency_limit: u32,
        /// Why it was empty: nothing claimable, a paused queue, or a
        /// reached concurrency limit.
        #[serde(default)]
        reason: EmptyReason,
    },
}

impl ClaimOutcome {
    /// The lease, if one was granted.
    pub fn claimed(&self) -> Option<&Claimed> {
        match self {
            Self::Granted(claimed) => Some(claimed),
            Self::Empty { .. } => None,
        }
    }

    /// How long the claim waited for admission.
    pub fn waited(&self) -> Duration {
        match self {
            Self::Granted(claimed) => claimed.waited,
            Self::Empty { waited, .. } => *waited,
        }
    }

    /// The `X-Claim-Wait-Ms` header value.
    pub fn wait_ms(&self) -> u64 {
        u64::try_from(self.waited().as_millis()).unwrap_or(u64::MAX)
    }

    /// The `X-Claim-Concurrency` header value.
    pub fn concurrency_limit(&self) -> u32 {
        match self {
            Self::Granted(claimed) => claimed.concurrency_limit,
            Self::Empty {
                concurrency_limit, ..
            } => *concurrency_limit,
        }
    }

    /// Why an empty claim was empty.
    pub fn empty_reason(&self) -> Option<EmptyReason> {
        match self {
            Self::Granted(_) => None,
            Self::Empty { reason, .. } => Some(*reason),
        }
    }

    /// The `Retry-After` of an empty claim.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Granted(_) => None,
            Self::Empty { retry_after, .. } => Some(*retry_after),
        }
    }
}
