//! The lease wing, one concept per file: how a claim is admitted
//! (`admission`, and `claim_async` for async hosts), how its lease is
//! granted (`grant`), the one-statement fast path (`fast`), how a holder
//! acknowledges (`ack`) through the completer's batch transaction
//! (`complete`), heartbeats (`heartbeat`), and the worker loop (`worker`).

mod ack;
mod admission;
pub(crate) mod claim_async;
pub(crate) mod complete;
mod fast;
mod grant;
mod heartbeat;
pub(crate) mod worker;

use std::time::Duration;

use crate::backend::TaskHandle;
use crate::error::Error;
use crate::model::claim::{ClaimOutcome, Claimed, EmptyReason};
use crate::model::task::{Brief, TaskRef};
use tessera_lease::Lease;

/// What an admitted claim's lease transaction came to.
pub(super) struct Leased {
    /// The leases granted, in claim order; empty for an empty queue.
    granted: Vec<Claimed>,
    /// The idle-pacing hint of an empty claim.
    retry_after: Option<Duration>,
    waited: Duration,
    limit: u32,
    /// Why nothing was granted.
    reason: EmptyReason,
}

impl Leased {
    /// A claim of one task's outcome: its lease, or why there was none.
    pub(super) fn outcome(self) -> ClaimOutcome {
        match self.granted.into_iter().next() {
            Some(claimed) => ClaimOutcome::Granted(claimed),
            None => ClaimOutcome::Empty {
                retry_after: self.retry_after.unwrap_or_default(),
                waited: self.waited,
                concurrency_limit: self.limit,
                reason: self.reason,
            },
        }
    }
}

/// One lease a claim granted: the task, the lease and the brief.
pub(super) type LeaseGrant = (TaskRef, Lease, Brief);
/// What a lease transaction came to: its grants and, with none, why.
pub(super) type LeaseResult = Result<(Vec<LeaseGrant>, EmptyReason), Error>;

/// A grant inside the lease transaction, with the task's place.
pub(super) type Placed = (TaskHandle, TaskRef, Lease, Brief);

/// How often the lease transaction skips a task whose stored claim times
/// turned out stale before it reports the queue empty (a lease that lapsed
/// on its last try is discarded and not counted).
pub(super) const MAX_PICKS: usize = 4;

/// The `Retry-After` of a claim that found its queue at its concurrency
/// limit: a slot frees when a lease ends, so it is not paced like an idle
/// queue.
pub const LIMITED_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most lapsed leases a claim of a full queue records before it counts
/// again.
pub(super) const MAX_LAPSES_RECORDED: usize = 100;
