//! Rejections: `429 rate_limited` with a reason and a `Retry-After`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::seconds;

/// Why a claim was turned away. Only overload conditions reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RejectReason {
    /// The pending queue was full and the arrival held at least its fair
    /// share of it.
    QueueFull,
    /// The claim waited `max_wait` without a grant.
    WaitExpired,
    /// The claim was the newest waiter of the principal holding the most
    /// waiting slots, and gave its slot to a principal holding fewer than
    /// its share.
    FairShare,
    /// The principal spent its legacy `claims_per_minute` allowance.
    ClaimsPerMinute,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::QueueFull => "pending claim queue is full",
            Self::WaitExpired => "maximum claim wait exceeded",
            Self::FairShare => "fair share of waiting slots",
            Self::ClaimsPerMinute => "claims per minute quota exceeded",
        })
    }
}

/// A claim turned away: HTTP `429`, code `rate_limited`, a reason and a
/// `Retry-After`.
///
/// Hosts should tell clients to honour `Retry-After` and add jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub struct Rejection {
    reason: RejectReason,
    retry_after_seconds: u64,
}

impl Rejection {
    /// The HTTP status of every rejection.
    pub const STATUS: u16 = 429;
    /// The error code of every rejection.
    pub const CODE: &'static str = "rate_limited";

    /// `retry_after` is rounded up to whole seconds, at least one.
    pub(crate) fn new(reason: RejectReason, retry_after: Duration) -> Self {
        Self {
            reason,
            retry_after_seconds: seconds::retry_after_seconds(retry_after),
        }
    }

    /// Why the claim was turned away.
    pub fn reason(&self) -> RejectReason {
        self.reason
    }

    /// When to try again: whole seconds, at least one, at most `max_wait`
    /// rounded up (see [`Admission`](crate::Admission) for the estimate).
    pub fn retry_after(&self) -> Duration {
        Duration::from_secs(self.retry_after_seconds)
    }

    /// [`retry_after`](Self::retry_after) in seconds, for the `Retry-After`
    /// header.
    pub fn retry_after_seconds(&self) -> u64 {
        self.retry_after_seconds
    }

    /// Always `429`.
    pub fn status(&self) -> u16 {
        Self::STATUS
    }

    /// Always `"rate_limited"`.
    pub fn code(&self) -> &'static str {
        Self::CODE
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}, retry after {} s",
            Self::CODE,
            self.reason,
            self.retry_after_seconds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_at_least_one() {
        let r = |millis| Rejection::new(RejectReason::QueueFull, Duration::from_millis(millis));
        assert_eq!(r(0).retry_after_seconds(), 1);
        assert_eq!(r(1).retry_after_seconds(), 1);
        assert_eq!(r(1000).retry_after_seconds(), 1);
        assert_eq!(r(1001).retry_after_seconds(), 2);
        assert_eq!(r(9500).retry_after(), Duration::from_secs(10));
        let longest = Rejection::new(RejectReason::QueueFull, Duration::MAX);
        assert_eq!(longest.retry_after_seconds(), u64::MAX);
    }

    #[test]
    fn displays_code_reason_and_hint() {
        let rejection = Rejection::new(RejectReason::FairShare, Duration::from_secs(3));
        assert_eq!(
            rejection.to_string(),
            "rate_limited: fair share of waiting slots, retry after 3 s"
        );
        assert_eq!(rejection.status(), 429);
        assert_eq!(rejection.code(), "rate_limited");
    }
}
