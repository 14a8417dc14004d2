//! The one error type of the crate and the vocabulary it names.

use std::fmt;

use chrono::{DateTime, Utc};

use crate::name::AttemptNumber;
use crate::state::StateName;
use crate::token::FencingToken;

/// Everything that can go wrong in `tessera-lease`.
///
/// Variants are split by cause: input that breaks a rule (`Invalid*`), a
/// transition the task's state does not allow, a stale or foreign fencing
/// token, an idempotency conflict, and caller misuse (`ReceiptMismatch`,
/// `InvalidRecord`). Every error leaves the task exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A name, key, digest or size broke one of its rules. The value itself is
    /// never echoed, only its length in bytes.
    #[error("invalid {field} (length {len}): {rule}")]
    InvalidInput {
        /// Which kind of value was rejected.
        field: Field,
        /// Length of the rejected value in bytes.
        len: usize,
        /// The rule it broke.
        rule: Rule,
    },
    /// A duration argument is zero where that is meaningless, or too long.
    #[error("invalid {field}: {rule}")]
    InvalidDuration {
        /// Which duration was rejected.
        field: Field,
        /// The rule it broke.
        rule: DurationRule,
    },
    /// A number that must be positive and bounded (fencing token, attempt
    /// number, brief version, number of alternatives) is out of range.
    #[error("invalid {field}: {value} is outside 1..={max}")]
    OutOfRange {
        /// Which number was rejected.
        field: Field,
        /// The rejected value.
        value: i64,
        /// The largest allowed value.
        max: i64,
    },
    /// No attempt will be claimable again: each is done, failed or
    /// discarded, or leased on its last try.
    #[error("task is finished: no attempt is left to claim")]
    TaskFinished,
    /// No attempt can be claimed now. `next_at` is the earliest time one may
    /// become claimable without another call changing the task (a backoff
    /// ending or a lease lapsing).
    #[error("no attempt is ready to claim")]
    NoAttemptReady {
        /// When an attempt next becomes claimable.
        next_at: DateTime<Utc>,
    },
    /// The token was never granted for this task.
    #[error("fencing token {token} was never granted for this task")]
    UnknownToken {
        /// The token presented.
        token: FencingToken,
    },
    /// The token was granted once, but its attempt has been granted again
    /// since: a newer lease supersedes it.
    #[error("fencing token {token} is stale: its attempt was granted again")]
    StaleToken {
        /// The token presented.
        token: FencingToken,
    },
    /// The token belongs to a lease held by another principal.
    #[error("lease {token} is held by another principal")]
    WrongHolder {
        /// The token presented.
        token: FencingToken,
    },
    /// The lease lapsed. An expired lease grants nothing, even if nobody has
    /// claimed the attempt since.
    #[error("lease {token} expired at {expired_at}")]
    LeaseExpired {
        /// The token presented.
        token: FencingToken,
        /// When the lease lapsed.
        expired_at: DateTime<Utc>,
    },
    /// The lease ended (by a submission, a failure report, or a lapse that
    /// [`Task::expire`](crate::Task::expire) recorded); its attempt is in
    /// `state`, so the lease can no longer be heartbeat, submitted or failed.
    #[error("lease {token} has ended: attempt {attempt} is {state}")]
    LeaseEnded {
        /// The token presented.
        token: FencingToken,
        /// The attempt the token was granted for.
        attempt: AttemptNumber,
        /// The attempt's state now.
        state: StateName,
    },
    /// The idempotency key was already used for this task with a different
    /// payload digest.
    #[error("idempotency key was already used with a different payload")]
    IdempotencyConflict,
    /// An operator asked to retry a task none of whose attempts is failed,
    /// discarded or cancelled.
    #[error("nothing to retry: no attempt is failed, discarded or cancelled")]
    NothingToRetry,
    /// The lease `token` ended because an operator cancelled its task: the
    /// holder should stop work; nothing it submits is accepted.
    #[error("lease {token} has ended: the task was cancelled")]
    TaskCancelled {
        /// The token presented.
        token: FencingToken,
        /// The attempt the token was granted for.
        attempt: AttemptNumber,
    },
    /// An operator asked to cancel a task whose attempts are all final.
    #[error("nothing to cancel: every attempt is final")]
    NothingToCancel,
    /// Every fencing token a task can hold has been granted.
    #[error("fencing tokens for this task are exhausted")]
    TokensExhausted,
    /// Adding a duration to a time left the representable range.
    #[error("time arithmetic out of range")]
    TimeOutOfRange,
    /// Caller misuse: the stored receipt passed to a submission belongs to
    /// another task, principal or idempotency key.
    #[error("stored receipt does not match the submission's task, principal or key")]
    ReceiptMismatch,
    /// Caller misuse or corrupt storage: a record breaks an invariant the
    /// rules rely on.
    #[error("invalid task record: {reason}")]
    InvalidRecord {
        /// Which invariant is broken.
        reason: &'static str,
    },
}

impl LeaseError {
    /// Which error this is, for a caller that maps every kind.
    #[must_use]
    pub fn kind(&self) -> LeaseErrorKind {
        match self {
            Self::InvalidInput { .. } => LeaseErrorKind::InvalidInput,
            Self::InvalidDuration { .. } => LeaseErrorKind::InvalidDuration,
            Self::OutOfRange { .. } => LeaseErrorKind::OutOfRange,
            Self::TaskFinished => LeaseErrorKind::TaskFinished,
            Self::NoAttemptReady { .. } => LeaseErrorKind::NoAttemptReady,
            Self::UnknownToken { .. } => LeaseErrorKind::UnknownToken,
            Self::StaleToken { .. } => LeaseErrorKind::StaleToken,
            Self::WrongHolder { .. } => LeaseErrorKind::WrongHolder,
            Self::LeaseExpired { .. } => LeaseErrorKind::LeaseExpired,
            Self::LeaseEnded { .. } => LeaseErrorKind::LeaseEnded,
            Self::IdempotencyConflict => LeaseErrorKind::IdempotencyConflict,
            Self::NothingToRetry => LeaseErrorKind::NothingToRetry,
            Self::TaskCancelled { .. } => LeaseErrorKind::TaskCancelled,
            Self::NothingToCancel => LeaseErrorKind::NothingToCancel,
            Self::TokensExhausted => LeaseErrorKind::TokensExhausted,
            Self::TimeOutOfRange => LeaseErrorKind::TimeOutOfRange,
            Self::ReceiptMismatch => LeaseErrorKind::ReceiptMismatch,
            Self::InvalidRecord { .. } => LeaseErrorKind::InvalidRecord,
        }
    }
}

/// Which [`LeaseError`] an error is, without its data: one kind per
/// variant, as [`LeaseError::kind`] gives it.
///
/// Unlike [`LeaseError`], this enum is exhaustive on purpose: a new error
/// is a new kind, and every `match` on kinds (the store's mapping to HTTP
/// among them) fails to compile until it says what the new kind means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseErrorKind {
    /// A name, key, digest or size broke one of its rules. See [`LeaseError::InvalidInput`].
    InvalidInput,
    /// A duration argument is zero where that is meaningless, or too long. See [`LeaseError::InvalidDuration`].
    InvalidDuration,
    /// A bounded number is out of range. See [`LeaseError::OutOfRange`].
    OutOfRange,
    /// No attempt will be claimable again. See [`LeaseError::TaskFinished`].
    TaskFinished,
    /// No attempt can be claimed now. See [`LeaseError::NoAttemptReady`].
    NoAttemptReady,
    /// The token was never granted for this task. See [`LeaseError::UnknownToken`].
    UnknownToken,
    /// A newer lease supersedes the token. See [`LeaseError::StaleToken`].
    StaleToken,
    /// The token belongs to a lease held by another principal. See [`LeaseError::WrongHolder`].
    WrongHolder,
    /// The lease lapsed. See [`LeaseError::LeaseExpired`].
    LeaseExpired,
    /// The lease ended. See [`LeaseError::LeaseEnded`].
    LeaseEnded,
    /// The idempotency key was used with a different payload. See [`LeaseError::IdempotencyConflict`].
    IdempotencyConflict,
    /// An operator's retry found nothing to retry. See [`LeaseError::NothingToRetry`].
    NothingToRetry,
    /// An operator cancelled the task. See [`LeaseError::TaskCancelled`].
    TaskCancelled,
    /// An operator's cancel found every attempt final. See [`LeaseError::NothingToCancel`].
    NothingToCancel,
    /// Every fencing token a task can hold has been granted. See [`LeaseError::TokensExhausted`].
    TokensExhausted,
    /// A time left the representable range. See [`LeaseError::TimeOutOfRange`].
    TimeOutOfRange,
    /// Caller misuse: a stored receipt of another submission. See [`LeaseError::ReceiptMismatch`].
    ReceiptMismatch,
    /// A record breaks an invariant the rules rely on. See [`LeaseError::InvalidRecord`].
    InvalidRecord,
}

/// The kind of value an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A [`Namespace`](crate::Namespace).
    Namespace,
    /// A [`QueueName`](crate::QueueName).
    Queue,
    /// A [`TaskId`](crate::TaskId).
    Task,
    /// An [`ArtifactKey`](crate::ArtifactKey).
    Artifact,
    /// An [`IdempotencyKey`](crate::IdempotencyKey).
    IdempotencyKey,
    /// A [`Principal`](crate::Principal).
    Principal,
    /// A [`Digest`](crate::Digest).
    Digest,
    /// A brief (task payload), checked by [`check_brief_size`](crate::check_brief_size).
    Brief,
    /// A stored [`StateName`].
    State,
    /// A [`FencingToken`].
    Token,
    /// An [`AttemptNumber`].
    Attempt,
    /// A [`BriefVersion`](crate::BriefVersion).
    Version,
    /// The number of competing attempts of a task.
    Alternatives,
    /// The duration of a new lease.
    LeaseDuration,
    /// A heartbeat's extension.
    Extension,
    /// A retry backoff.
    Backoff,
    /// A task's maximum number of tries.
    MaxTries,
    /// A failure report's error text.
    Error,
    /// A task's priority.
    Priority,
    /// A submission's output.
    Output,
    /// A [`UniqueKey`](crate::UniqueKey).
    UniqueKey,
    /// A [`PartitionKey`](crate::PartitionKey).
    PartitionKey,
    /// A [`ScheduleName`](crate::ScheduleName).
    Schedule,
    /// A periodic schedule's cron expression.
    Cron,
    /// A periodic schedule's time zone.
    TimeZone,
    /// A heartbeat's progress value, checked by [`check_progress_size`](crate::check_progress_size).
    Progress,
    /// A [`Uniqueness`](crate::Uniqueness) window.
    UniqueWindow,
    /// A debounce delay of [`UniqueMode::Debounce`](crate::UniqueMode::Debounce).
    Debounce,
    /// A keep time of a [`Retention`](crate::Retention), in seconds.
    Retention,
}

impl Field {
    /// A short lowercase name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Queue => "queue name",
            Self::Task => "task id",
            Self::Artifact => "artifact key",
            Self::IdempotencyKey => "idempotency key",
            Self::Principal => "principal",
            Self::Digest => "digest",
            Self::Brief => "brief",
            Self::State => "task state",
            Self::Token => "fencing token",
            Self::Attempt => "attempt number",
            Self::Version => "brief version",
            Self::Alternatives => "number of alternatives",
            Self::LeaseDuration => "lease duration",
            Self::Extension => "heartbeat extension",
            Self::Backoff => "retry backoff",
            Self::MaxTries => "maximum tries",
            Self::Error => "error text",
            Self::Priority => "priority",
            Self::Output => "output",
            Self::UniqueKey => "unique key",
            Self::PartitionKey => "partition key",
            Self::Schedule => "schedule name",
            Self::Cron => "cron expression",
            Self::TimeZone => "time zone",
            Self::Progress => "progress",
            Self::UniqueWindow => "uniqueness window",
            Self::Debounce => "debounce delay",
            Self::Retention => "retention keep time",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rule a rejected value broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// The value is empty.
    Empty,
    /// The value is longer than `max` bytes.
    TooLong {
        /// The largest allowed length in bytes.
        max: usize,
    },
    /// The byte at `index` is not an ASCII letter, digit, `-`, `_` or `.`.
    Character {
        /// Byte offset of the first disallowed character.
        index: usize,
    },
    /// The value starts or ends with `.`.
    EdgeDot,
    /// The value contains `..`.
    DoubleDot,
    /// The byte at `index` is not a hexadecimal digit.
    NotHex {
        /// Byte offset of the first non-hex character.
        index: usize,
    },
    /// The value must be exactly `expected` bytes long.
    Length {
        /// The required length in bytes.
        expected: usize,
    },
    /// The payload is larger than `max` bytes.
    TooLarge {
        /// The largest allowed size in bytes.
        max: usize,
    },
    /// The value is not one of the known names.
    Unknown,
    /// The value does not parse: it is not valid syntax for its kind.
    Syntax,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("must not be empty"),
            Self::TooLong { max } => write!(f, "longer than {max} bytes"),
            Self::Character { index } => write!(
                f,
                "byte {index} is not an ascii letter, digit, '-', '_' or '.'"
            ),
            Self::EdgeDot => f.write_str("must not start or end with '.'"),
            Self::DoubleDot => f.write_str("must not contain '..'"),
            Self::NotHex { index } => write!(f, "byte {index} is not a hex digit"),
            Self::Length { expected } => write!(f, "must be exactly {expected} bytes"),
            Self::TooLarge { max } => write!(f, "larger than {max} bytes"),
            Self::Unknown => f.write_str("not a known name"),
            Self::Syntax => f.write_str("not valid syntax"),
        }
    }
}

/// The rule a rejected duration broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DurationRule {
    /// The duration is zero, which would grant or extend nothing.
    Zero,
    /// The duration is longer than `max_secs` seconds.
    TooLong {
        /// The longest allowed duration in seconds.
        max_secs: u64,
    },
    /// A debounce's delay is longer than its own maximum delay.
    AboveMaxDelay,
}

impl fmt::Display for DurationRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero => f.write_str("must not be zero"),
            Self::TooLong { max_secs } => write!(f, "longer than {max_secs} seconds"),
            Self::AboveMaxDelay => f.write_str("delay longer than its max_delay"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_own_kind() {
        let errors = [
            LeaseError::TaskFinished,
            LeaseError::IdempotencyConflict,
            LeaseError::UnknownToken {
                token: FencingToken::new(3).unwrap(),
            },
            LeaseError::InvalidRecord { reason: "broken" },
        ];
        let kinds: Vec<LeaseErrorKind> = errors.iter().map(LeaseError::kind).collect();
        assert_eq!(
            kinds,
            [
                LeaseErrorKind::TaskFinished,
                LeaseErrorKind::IdempotencyConflict,
                LeaseErrorKind::UnknownToken,
                LeaseErrorKind::InvalidRecord,
            ]
        );
    }

    #[test]
    fn messages_are_lowercase_and_name_field_length_and_rule() {
        let err = LeaseError::InvalidInput {
            field: Field::Namespace,
            len: 70,
            rule: Rule::TooLong { max: 64 },
        };
        assert_eq!(
            err.to_string(),
            "invalid namespace (length 70): longer than 64 bytes"
        );
        let err = LeaseError::InvalidDuration {
            field: Field::LeaseDuration,
            rule: DurationRule::Zero,
        };
        assert_eq!(err.to_string(), "invalid lease duration: must not be zero");
        assert!(
            LeaseError::IdempotencyConflict
                .to_string()
                .starts_with(char::is_lowercase)
        );
    }
}
