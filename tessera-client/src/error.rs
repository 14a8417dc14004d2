//! What a call can come to besides its answer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::error::ErrorDetail;

/// A call that did not get its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused, with its JSON error body.
    #[error("{status} {}: {}", detail.code, detail.message)]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The body's error: its stable code, message, and for `429` and
        /// `503` when to try again.
        detail: ErrorDetail,
    },
    /// An answer that is not the server's: a proxy's `502`, or a body
    /// that does not read as the route's answer.
    #[error("unexpected answer {status}: {message}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        message: String,
        /// The `Retry-After` it came with, if any.
        retry_after: Option<Duration>,
    },
    /// No answer: the connection failed, was cut, or timed out. A write
    /// may or may not have landed; a submission retried under the same
    /// idempotency key finds out.
    #[error("transport: {message}")]
    Transport {
        /// What happened.
        message: String,
    },
    /// Input the client refuses before calling: a base URL it cannot use,
    /// or a value that does not encode as JSON.
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// Why.
        reason: String,
    },
}

impl Error {
    /// The HTTP status, for an answer that had one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Refused { status, .. } | Self::Unexpected { status, .. } => Some(*status),
            Self::Transport { .. } | Self::InvalidInput { .. } => None,
        }
    }

    /// The server's stable error code (`stale_token`,
    /// `storage_quota_exhausted`, …).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Refused { detail, .. } => Some(&detail.code),
            _ => None,
        }
    }

    /// How long the server asked to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { detail, .. } => (detail.retry_after)
                .map(|seconds| Duration::from_secs(seconds).min(crate::pacing::LONGEST_WAIT)),
            Self::Unexpected { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// When a spent storage allowance resets (`503
    /// storage_quota_exhausted`).
    pub fn reset_at(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::Refused { detail, .. } => detail.reset_at,
            _ => None,
        }
    }

    /// Whether the same call may succeed later: no answer, `408`, `429`,
    /// `502`, `503`, `504`, or a `500 storage_error` (a storage fault
    /// such as a lock wait that timed out or a database failing over).
    pub fn is_transient(&self) -> bool {
        match self.status() {
            None => matches!(self, Self::Transport { .. }),
            Some(500) => self.code() == Some("storage_error"),
            Some(status) => matches!(status, 408 | 429 | 502 | 503 | 504),
        }
    }

    /// Whether the refusal is of the request itself (`400`, `413`,
    /// `422`, or refused by the client before sending): made again, it is
    /// refused again.
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, Self::InvalidInput { .. }) || matches!(self.status(), Some(400 | 413 | 422))
    }

    /// Whether the server refused as a conflict (`409`): a lease lost or
    /// superseded, a key reused with other output.
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// Whether the lease is gone for good (`409` or `410`): the task is
    /// someone else's, finished, or cancelled.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self.status(), Some(409 | 410))
    }
}
