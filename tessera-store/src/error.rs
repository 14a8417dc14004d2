//! The store's one error type and its HTTP and tool-protocol forms.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use tessera_admission::{next_utc_midnight, retry_after_seconds};

/// Everything a store operation can refuse or fail with.
///
/// Each variant maps to one HTTP status and one stable `code` in one place
/// ([`status`](Self::status), [`code`](Self::code)); hosts return
/// [`body`](Self::body) as JSON or [`tool_error`](Self::tool_error) from a
/// tool protocol. No message ever contains a key secret: secrets are only
/// bound as statement parameters and never formatted.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The presented key is missing, malformed, unknown, expired or revoked
    /// (`401 unauthorized`). Which of these it was is deliberately not said.
    #[error("missing, unknown, expired or revoked key")]
    Unauthorized,
    /// The key is valid but does not grant what was asked (`403 forbidden`).
    #[error("forbidden: {reason}")]
    Forbidden {
        /// What the key lacks, e.g. a namespace grant.
        reason: String,
    },
    /// The named thing does not exist or is not visible to the caller
    /// (`404 not_found`).
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A call under a fencing token (a heartbeat, submission, failure
    /// report or snooze) names a task that is not there: finished and
    /// purged after its retention, since a token names a task that once
    /// was (`410 task_purged`). Nothing was done; a replayed submission
    /// is never run again.
    #[error("gone: {what} is not there: purged after its retention, or never made")]
    TaskPurged {
        /// The task named.
        what: String,
    },
    /// The request contradicts the current state (`409`), e.g. an
    /// idempotency key replayed with a different payload. Each
    /// [`ConflictKind`] has its own code.
    #[error("conflict: {reason}")]
    Conflict {
        /// Which kind of conflict: the error's code.
        kind: ConflictKind,
        /// Which state it contradicts.
        reason: String,
    },
    /// The request is malformed (`400 invalid_input`).
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// What is wrong with it.
        reason: String,
    },
    /// The caller withdrew a waiting claim before its turn came
    /// (`499 cancelled`, the status servers log for a client that closed
    /// its request). No lease was granted.
    #[error("claim cancelled while waiting")]
    Cancelled,
    /// Admission refused the request for now (`429 rate_limited`).
    #[error("rate limited: {reason}")]
    RateLimited {
        /// How long the client should wait (plus its own jitter).
        retry_after: Duration,
        /// Why, e.g. `fair share of waiting slots`.
        reason: String,
    },
    /// The storage provider refused a write because an allowance is spent
    /// (`503 storage_quota_exhausted`). Neither the operation nor its audit
    /// row happened.
    #[error("storage quota exhausted; retry after {reset_at}")]
    StorageQuotaExhausted {
        /// Time until `reset_at`, at least one second.
        retry_after: Duration,
        /// The next 00:00 UTC after the refusal, when daily allowances reset.
        reset_at: DateTime<Utc>,
    },
    /// Any other storage fault (`500 storage_error`), classified by
    /// [`kind`](StorageError::kind): a [retryable](StorageErrorKind::Retryable)
    /// one (a lock wait that timed out, a server that went away) may
    /// succeed if tried again. The backend's own message is the
    /// [`source`](std::error::Error::source); it is not repeated in the
    /// message a client sees.
    #[error("storage error")]
    Storage(#[from] StorageError),
    /// The database was written by a newer schema version than this build
    /// knows (`500 schema_too_new`). The file was left untouched.
    #[error("database schema version {found} is newer than the supported version {supported}")]
    SchemaTooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build supports.
        supported: i64,
    },
    /// The file is not a SQLite database, or is damaged
    /// (`500 corrupt_database`).
    #[error("database is corrupt or not a database: {reason}")]
    CorruptDatabase {
        /// What SQLite reported.
        reason: String,
    },
    /// The operating system could not supply randomness for a new key
    /// (`500 internal_error`).
    #[error("no operating system randomness")]
    RandomnessUnavailable,
}

/// What a `409` contradicts, each with its own stable
/// [`code`](ConflictKind::as_str), so a client need not read the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConflictKind {
    /// The idempotency key was used before with a different payload.
    IdempotencyConflict,
    /// The token was granted, then superseded by a later grant of its
    /// attempt.
    StaleToken,
    /// No such token was ever granted for the task.
    UnknownToken,
    /// The lease is held by another principal.
    WrongHolder,
    /// The lease expired.
    LeaseExpired,
    /// The lease ended: its attempt is done, failed, discarded or waiting
    /// after a failure report.
    LeaseEnded,
    /// An operator cancelled the task; the holder should stop.
    TaskCancelled,
    /// A task with this id and version exists in the namespace.
    TaskExists,
    /// No attempt of the task is left to claim.
    TaskFinished,
    /// No attempt of the task is claimable yet.
    NotReady,
    /// An operator's retry found no failed, discarded or cancelled attempt.
    NothingToRetry,
    /// An operator's cancel found every attempt final.
    NothingToCancel,
    /// Every fencing token the task can hold has been granted.
    TokensExhausted,
    /// Any other conflict.
    Other,
}

impl ConflictKind {
    /// The stable code a host returns.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdempotencyConflict => "idempotency_conflict",
            Self::StaleToken => "stale_token",
            Self::UnknownToken => "unknown_token",
            Self::WrongHolder => "wrong_holder",
            Self::LeaseExpired => "lease_expired",
            Self::LeaseEnded => "lease_ended",
            Self::TaskCancelled => "task_cancelled",
            Self::TaskExists => "task_exists",
            Self::TaskFinished => "task_finished",
            Self::NotReady => "not_ready",
            Self::NothingToRetry => "nothing_to_retry",
            Self::NothingToCancel => "nothing_to_cancel",
            Self::TokensExhausted => "tokens_exhausted",
            Self::Other => "conflict",
        }
    }
}

impl ConflictKind {
    /// The outcome a counter records for it: the same code the caller saw.
    pub fn outcome(self) -> tessera_audit::Outcome {
        use tessera_audit::Outcome;
        match self {
            Self::IdempotencyConflict => Outcome::IdempotencyConflict,
            Self::StaleToken => Outcome::StaleToken,
            Self::UnknownToken => Outcome::UnknownToken,
            Self::WrongHolder => Outcome::WrongHolder,
            Self::LeaseExpired => Outcome::LeaseExpired,
            Self::LeaseEnded => Outcome::LeaseEnded,
            Self::TaskCancelled => Outcome::TaskCancelled,
            Self::TaskExists => Outcome::TaskExists,
            Self::TaskFinished => Outcome::TaskFinished,
            Self::NotReady => Outcome::NotReady,
            Self::NothingToRetry => Outcome::NothingToRetry,
            Self::NothingToCancel => Outcome::NothingToCancel,
            Self::TokensExhausted => Outcome::TokensExhausted,
            Self::Other => Outcome::Conflict,
        }
    }
}

impl Error {
    /// A `409` of `kind`, for `reason`.
    pub fn conflict(kind: ConflictKind, reason: impl Into<String>) -> Self {
        Self::Conflict {
            kind,
            reason: reason.into(),
        }
    }

    /// A `503 storage_quota_exhausted` refusal observed at `now`: the reset
    /// is the next 00:00 UTC strictly after `now`.
    pub fn storage_quota_exhausted(now: DateTime<Utc>) -> Self {
        let reset_at = next_utc_midnight(now);
        let retry_after = (reset_at - now)
            .to_std()
            .unwrap_or_default()
            .max(Duration::from_secs(1));
        Self::StorageQuotaExhausted {
            retry_after,
            reset_at,
        }
    }

    /// The HTTP status a host answers with.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthorized => 401,
            Self::Forbidden { .. } => 403,
            Self::NotFound { .. } => 404,
            Self::TaskPurged { .. } => 410,
            Self::Conflict { .. } => 409,
            Self::InvalidInput { .. } => 400,
            Self::RateLimited { .. } => 429,
            Self::Cancelled => 499,
            Self::StorageQuotaExhausted { .. } => 503,
            Self::Storage(_)
            | Self::SchemaTooNew { .. }
            | Self::CorruptDatabase { .. }
            | Self::RandomnessUnavailable => 500,
        }
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::Forbidden { .. } => "forbidden",
            Self::NotFound { .. } => "not_found",
            Self::TaskPurged { .. } => "task_purged",
            Self::Conflict { kind, .. } => kind.as_str(),
            Self::InvalidInput { .. } => "invalid_input",
            Self::RateLimited { .. } => "rate_limited",
            Self::Cancelled => "cancelled",
            Self::StorageQuotaExhausted { .. } => "storage_quota_exhausted",
            Self::Storage(_) => "storage_error",
            Self::SchemaTooNew { .. } => "schema_too_new",
            Self::CorruptDatabase { .. } => "corrupt_database",
            Self::RandomnessUnavailable => "internal_error",
        }
    }

    /// How long the client should wait before retrying, for `429` and `503`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. }
            | Self::StorageQuotaExhausted { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up and at
    /// least one: the value of a `Retry-After` header.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after().map(retry_after_seconds)
    }

    /// When a provider allowance resets, for `503 storage_quota_exhausted`.
    pub fn reset_at(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::StorageQuotaExhausted { reset_at, .. } => Some(*reset_at),
            _ => None,
        }
    }

    /// How a request that failed with this error is counted.
    pub fn outcome(&self) -> tessera_audit::Outcome {
        use tessera_audit::Outcome;
        match self {
            Self::Unauthorized => Outcome::Unauthorized,
            Self::Forbidden { .. } => Outcome::Forbidden,
            Self::NotFound { .. } => Outcome::NotFound,
            Self::TaskPurged { .. } => Outcome::TaskPurged,
            Self::Conflict { kind, .. } => kind.outcome(),
            Self::InvalidInput { .. } => Outcome::InvalidInput,
            Self::RateLimited { .. } => Outcome::RateLimited,
            // No lease was handed out, as for an empty queue.
            Self::Cancelled => Outcome::Empty,
            Self::StorageQuotaExhausted { .. } => Outcome::StorageQuotaExhausted,
            Self::Storage(_)
            | Self::SchemaTooNew { .. }
            | Self::CorruptDatabase { .. }
            | Self::RandomnessUnavailable => Outcome::StorageError,
        }
    }

    /// Whether trying the same request again may succeed without anything
    /// else changing: a retryable storage fault.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Storage(error) if error.kind() == StorageErrorKind::Retryable)
    }

    /// What a backend's fault means beyond its kind: a damaged database is
    /// [`Error::CorruptDatabase`]; other errors (a quota refusal included,
    /// which the store dates) pass as they are.
    pub(crate) fn classified(self) -> Self {
        let Self::Storage(storage) = self else {
            return self;
        };
        match storage.kind() {
            StorageErrorKind::Corrupt => Self::CorruptDatabase {
                reason: storage.message().to_owned(),
            },
            _ => Self::Storage(storage),
        }
    }

    /// A write the storage provider refused for a quota, as a backend
    /// reports it; the store dates it ([`refusal_dated`](Self::refusal_dated)).
    pub(crate) fn quota_refused() -> Self {
        Self::Storage(StorageError::new(
            StorageErrorKind::QuotaRefused,
            None,
            "the storage provider refused the write",
        ))
    }

    /// Whether this is a quota refusal, as a backend reports it or as the
    /// store dated it.
    pub(crate) fn is_quota_refusal(&self) -> bool {
        match self {
            Self::Storage(storage) => storage.kind() == StorageErrorKind::QuotaRefused,
            other => other.is_quota_exhausted(),
        }
    }

    /// What a backend's error is to the caller at `now`, the store's own
    /// time: a quota refusal is `503 storage_quota_exhausted` until the
    /// next UTC midnight. The one place a refusal is dated.
    pub(crate) fn refusal_dated(self, now: DateTime<Utc>) -> Self {
        match self {
            Self::Storage(storage) if storage.kind() == StorageErrorKind::QuotaRefused => {
                Self::storage_quota_exhausted(now)
            }
            other => other,
        }
    }

    /// Whether this is a storage-provider quota refusal.
    pub fn is_quota_exhausted(&self) -> bool {
        matches!(self, Self::StorageQuotaExhausted { .. })
    }

    /// The JSON body a host returns: `{"error": {"code", "message",
    /// "retry_after", "reset_at"}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.detail(),
        }
    }

    /// The handled-error result of a tool protocol call: `isError: true`, the
    /// message as text content, and the status, code, `retry_after` and
    /// `reset_at` as structured content.
    pub fn tool_error(&self) -> ToolError {
        let detail = self.detail();
        ToolError {
            is_error: true,
            content: vec![ToolContent {
                kind: "text".to_owned(),
                text: detail.message.clone(),
            }],
            structured_content: ToolErrorDetail {
                status: self.status(),
                code: detail.code,
                message: detail.message,
                retry_after: detail.retry_after,
                reset_at: detail.reset_at,
            },
        }
    }

    fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code().to_owned(),
            message: self.to_string(),
            retry_after: self.retry_after_seconds(),
            reset_at: self.reset_at(),
        }
    }
}

/// What kind of fault a storage backend reported, as the store acts on it.
///
/// Backends classify their own codes into these, so nothing above them
/// matches a driver's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The storage provider refused a write because an allowance is spent
    /// (a full disk, a page cap, a provider quota).
    QuotaRefused,
    /// A constraint the write broke (a unique key taken).
    Conflict,
    /// A fault that may pass if the same work runs again: a lock wait
    /// that timed out, a lost connection, a serialization failure.
    Retryable,
    /// The database is damaged or not a database of this kind.
    Corrupt,
    /// The database was written by a newer schema version.
    SchemaTooNew,
    /// Anything else.
    Other,
}

/// A storage backend's fault: its kind, the backend's own code for it and
/// its message, never a driver type.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StorageError {
    kind: StorageErrorKind,
    code: Option<String>,
    message: String,
}

impl StorageError {
    /// A fault of `kind` with the backend's `code` (e.g. `SQLITE_BUSY`, or
    /// a SQLSTATE) and message.
    pub fn new(kind: StorageErrorKind, code: Option<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            code,
            message: message.into(),
        }
    }

    /// How the store treats it.
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }

    /// The backend's code for it, if it has one: SQLite's result code name
    /// (`SQLITE_FULL`), or PostgreSQL's SQLSTATE.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The backend's message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl PartialEq for StorageError {
    fn eq(&self, other: &Self) -> bool {
        (self.kind, &self.code, &self.message) == (other.kind, &other.code, &other.message)
    }
}

/// A stored value this build cannot read back: `500 corrupt_database`
/// naming `what`.
pub(crate) fn corrupt(what: &str) -> Error {
    Error::CorruptDatabase {
        reason: format!("unreadable {what}"),
    }
}

impl From<tessera_lease::LeaseError> for Error {
    /// A refused lease rule: bad input is `400`, a transition the task's
    /// state or a fencing token does not allow is `409` with its own code,
    /// and a stored record that breaks the rules' invariants is a corrupt
    /// database. The match names every kind, so a new lease error cannot
    /// reach a caller as a generic conflict unnoticed.
    fn from(error: tessera_lease::LeaseError) -> Self {
        use tessera_lease::LeaseErrorKind as Kind;
        let conflict = match error.kind() {
            Kind::InvalidInput
            | Kind::InvalidDuration
            | Kind::OutOfRange
            | Kind::TimeOutOfRange => {
                return Self::InvalidInput {
                    reason: error.to_string(),
                };
            }
            Kind::ReceiptMismatch | Kind::InvalidRecord => {
                return Self::CorruptDatabase {
                    reason: error.to_string(),
                };
            }
            Kind::IdempotencyConflict => ConflictKind::IdempotencyConflict,
            Kind::StaleToken => ConflictKind::StaleToken,
            Kind::UnknownToken => ConflictKind::UnknownToken,
            Kind::WrongHolder => ConflictKind::WrongHolder,
            Kind::LeaseExpired => ConflictKind::LeaseExpired,
            Kind::LeaseEnded => ConflictKind::LeaseEnded,
            Kind::TaskCancelled => ConflictKind::TaskCancelled,
            Kind::TaskFinished => ConflictKind::TaskFinished,
            Kind::NoAttemptReady => ConflictKind::NotReady,
            Kind::NothingToRetry => ConflictKind::NothingToRetry,
            Kind::NothingToCancel => ConflictKind::NothingToCancel,
            Kind::TokensExhausted => ConflictKind::TokensExhausted,
        };
        Self::conflict(conflict, error.to_string())
    }
}

/// The JSON error body: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The stable code, e.g. `storage_quota_exhausted`.
    pub code: String,
    /// A lowercase human-readable message.
    pub message: String,
    /// Seconds to wait before retrying, for `429` and `503`.
    pub retry_after: Option<u64>,
    /// When a provider allowance resets (RFC 3339, UTC), for `503`.
    pub reset_at: Option<DateTime<Utc>>,
}

/// A tool protocol's handled-error result (`isError: true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolError {
    /// Always `true`.
    pub is_error: bool,
    /// The message as text content.
    pub content: Vec<ToolContent>,
    /// The status, code, retry and reset as structured content.
    pub structured_content: ToolErrorDetail,
}

/// One content item of a [`ToolError`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolContent {
    /// Always `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error message.
    pub text: String,
}

/// The structured content of a [`ToolError`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolErrorDetail {
    /// The HTTP status the same error has.
    pub status: u16,
    /// The stable code.
    pub code: String,
    /// The message.
    pub message: String,
    /// Seconds to wait before retrying, for `429` and `503`.
    pub retry_after: Option<u64>,
    /// When a provider allowance resets, for `503`.
    pub reset_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_is_counted_under_the_code_its_caller_saw() {
        let kinds = [
            ConflictKind::IdempotencyConflict,
            ConflictKind::StaleToken,
            ConflictKind::UnknownToken,
            ConflictKind::WrongHolder,
            ConflictKind::LeaseExpired,
            ConflictKind::LeaseEnded,
            ConflictKind::TaskCancelled,
            ConflictKind::TaskExists,
            ConflictKind::TaskFinished,
            ConflictKind::NotReady,
            ConflictKind::NothingToRetry,
            ConflictKind::NothingToCancel,
            ConflictKind::TokensExhausted,
            ConflictKind::Other,
        ];
        for kind in kinds {
            let error = Error::conflict(kind, "refused");
            assert_eq!(error.outcome().as_str(), error.code(), "{kind:?}");
        }
    }
    use chrono::TimeZone;

    #[test]
    fn quota_refusal_resets_at_the_next_utc_midnight() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 23, 59, 30).unwrap();
        let error = Error::storage_quota_exhausted(now);
        assert_eq!(error.status(), 503);
        assert_eq!(error.code(), "storage_quota_exhausted");
        assert_eq!(
            error.reset_at(),
            Some(Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap())
        );
        assert_eq!(error.retry_after_seconds(), Some(30));
    }

    #[test]
    fn retry_after_rounds_up_to_reach_the_reset() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 23, 59, 29).unwrap()
            + chrono::TimeDelta::milliseconds(500);
        let error = Error::storage_quota_exhausted(now);
        assert_eq!(error.retry_after(), Some(Duration::from_millis(30_500)));
        assert_eq!(error.retry_after_seconds(), Some(31));
    }

    #[test]
    fn quota_refusal_at_midnight_waits_a_whole_day() {
        let now = Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap();
        let error = Error::storage_quota_exhausted(now);
        assert_eq!(
            error.reset_at(),
            Some(Utc.with_ymd_and_hms(2026, 10, 31, 0, 0, 0).unwrap())
        );
        assert_eq!(error.retry_after_seconds(), Some(86_400));
    }

    #[test]
    fn body_has_the_documented_shape() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let body = serde_json::to_value(Error::storage_quota_exhausted(now).body()).unwrap();
        assert_eq!(body["error"]["code"], "storage_quota_exhausted");
        assert_eq!(body["error"]["retry_after"], 43_200);
        assert_eq!(body["error"]["reset_at"], "2026-10-30T00:00:00Z");
        let body = serde_json::to_value(Error::Unauthorized.body()).unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        assert!(body["error"]["retry_after"].is_null());
        assert!(body["error"]["reset_at"].is_null());
    }

    #[test]
    fn tool_error_carries_status_retry_and_reset() {
        let error = Error::RateLimited {
            retry_after: Duration::from_millis(1_500),
            reason: "queue full".to_owned(),
        };
        let tool = serde_json::to_value(error.tool_error()).unwrap();
        assert_eq!(tool["isError"], true);
        assert_eq!(tool["structuredContent"]["status"], 429);
        assert_eq!(tool["structuredContent"]["retry_after"], 2);
        assert!(tool["structuredContent"]["reset_at"].is_null());
        assert_eq!(tool["content"][0]["type"], "text");
    }

    #[test]
    fn storage_errors_do_not_repeat_sqlite_text() {
        let error = Error::Storage(StorageError::new(
            StorageErrorKind::Other,
            Some("SQLITE_IOERR".to_owned()),
            "disk I/O error near secret",
        ));
        assert_eq!(error.status(), 500);
        assert_eq!(error.code(), "storage_error");
        assert_eq!(error.body().error.message, "storage error");
    }
}
