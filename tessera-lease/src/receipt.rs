//! Submissions, receipts and the idempotency rule.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::name::AttemptNumber;
use crate::name::{ArtifactKey, BriefVersion, IdempotencyKey, Principal, TaskId};
use crate::token::FencingToken;

/// What a worker submits for the attempt it leased.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Submission {
    /// The submitting principal; must hold the lease.
    pub principal: Principal,
    /// The fencing token of the lease.
    pub token: FencingToken,
    /// Makes the submission safe to retry; scoped per principal and task.
    pub key: IdempotencyKey,
    /// Digest of the submitted payload.
    pub digest: Digest,
}

/// Proof that a submission was accepted. The store keeps it under
/// (principal, task, idempotency key) and returns it unchanged on every
/// replay, so its serialized bytes never change.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Receipt {
    /// The task.
    pub task: TaskId,
    /// The brief version the attempt solved.
    pub version: BriefVersion,
    /// The attempt that finished.
    pub attempt: AttemptNumber,
    /// The fencing token of the lease it was accepted under.
    pub token: FencingToken,
    /// The principal that submitted (the lease holder).
    pub principal: Principal,
    /// The idempotency key it was submitted with.
    pub idempotency_key: IdempotencyKey,
    /// Where the attempt's output lives (owned by this grant).
    pub artifact: ArtifactKey,
    /// Digest of the accepted payload.
    pub digest: Digest,
    /// When it was accepted; never earlier than the lease grant.
    pub accepted_at: DateTime<Utc>,
}

/// The outcome of an accepted or replayed submission.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "receipt", rename_all = "lowercase")]
pub enum Submitted {
    /// Applied now: the attempt is done. The store writes the task and keeps
    /// the receipt.
    Accepted(Receipt),
    /// The same key and digest were accepted before: this is that receipt,
    /// unchanged, and nothing is written.
    Replayed(Receipt),
}

impl Submitted {
    /// The receipt, whether fresh or replayed.
    pub fn receipt(&self) -> &Receipt {
        match self {
            Self::Accepted(receipt) | Self::Replayed(receipt) => receipt,
        }
    }
}

/// What the idempotency rule says about a submission.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idempotency {
    /// No receipt under this key: apply the submission.
    Fresh,
    /// The same key and digest were accepted: return this receipt as is.
    Replay(Receipt),
    /// The same key was used with a different digest.
    Conflict,
}

/// Applies the idempotency rule.
///
/// `stored` is the receipt the store found under the submission's
/// (principal, task, idempotency key), if any. The same digest replays it; a
/// different digest is a conflict. Only the digest decides: the token and
/// time of the retry do not matter, so a retry after the lease ended still
/// gets its receipt.
pub fn decide_idempotency(stored: Option<&Receipt>, submission: &Submission) -> Idempotency {
    match stored {
        None => Idempotency::Fresh,
        Some(receipt) if receipt.digest == submission.digest => {
            Idempotency::Replay(receipt.clone())
        }
        Some(_) => Idempotency::Conflict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(digest: Digest) -> Receipt {
        Receipt {
            task: TaskId::parse("t").unwrap(),
            version: BriefVersion::FIRST,
            attempt: AttemptNumber::FIRST,
            token: FencingToken::FIRST,
            principal: Principal::parse("p").unwrap(),
            idempotency_key: IdempotencyKey::parse("k").unwrap(),
            artifact: ArtifactKey::parse("t.a1.t1").unwrap(),
            digest,
            accepted_at: "2026-10-29T12:00:00Z".parse().unwrap(),
        }
    }

    fn submission(digest: Digest) -> Submission {
        Submission {
            principal: Principal::parse("p").unwrap(),
            token: FencingToken::FIRST,
            key: IdempotencyKey::parse("k").unwrap(),
            digest,
        }
    }

    #[test]
    fn no_receipt_is_fresh() {
        let new = submission(Digest::from_bytes([1; 32]));
        assert_eq!(decide_idempotency(None, &new), Idempotency::Fresh);
    }

    #[test]
    fn same_digest_replays_the_stored_receipt() {
        let stored = receipt(Digest::from_bytes([1; 32]));
        let new = submission(Digest::from_bytes([1; 32]));
        assert_eq!(
            decide_idempotency(Some(&stored), &new),
            Idempotency::Replay(stored.clone())
        );
    }

    #[test]
    fn different_digest_conflicts() {
        let stored = receipt(Digest::from_bytes([1; 32]));
        let new = submission(Digest::from_bytes([2; 32]));
        assert_eq!(
            decide_idempotency(Some(&stored), &new),
            Idempotency::Conflict
        );
    }

    #[test]
    fn receipt_serde_round_trips() {
        let stored = receipt(Digest::from_bytes([9; 32]));
        let json = serde_json::to_vec(&Submitted::Accepted(stored.clone())).unwrap();
        let back: Submitted = serde_json::from_slice(&json).unwrap();
        assert_eq!(back.receipt(), &stored);
    }
}
