//! Validated names: the one place that says which identifiers Tessera accepts.
//!
//! Every name is 1 to `MAX_LEN` bytes of ASCII letters, digits, `-`, `_` and
//! `.`, neither starting nor ending with `.` and never containing `..`. So a
//! name is always safe as a path segment, an SQL value and a log field, and
//! `/` can never appear. Parsing is the only way to build one, deserializing
//! included. The numbers that name a brief's version and a task's
//! attempts are here too: both are checked once, when built.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError, Rule};
use crate::token::FencingToken;

/// The largest brief (task payload) in bytes: 1 MiB, the request size limit
/// Tessera hosts apply.
pub const MAX_BRIEF_BYTES: usize = 1024 * 1024;

/// Checks that a brief of `len` bytes is within [`MAX_BRIEF_BYTES`].
///
/// ```
/// assert!(tessera_lease::check_brief_size(512).is_ok());
/// assert!(tessera_lease::check_brief_size(tessera_lease::MAX_BRIEF_BYTES + 1).is_err());
/// ```
pub fn check_brief_size(len: usize) -> Result<(), LeaseError> {
    check_payload_size(Field::Brief, len)
}

/// Checks a submission's output size: at most [`MAX_BRIEF_BYTES`], as a
/// brief.
pub fn check_output_size(len: usize) -> Result<(), LeaseError> {
    check_payload_size(Field::Output, len)
}

/// The largest progress value a heartbeat may carry, in bytes: enough for a
/// counter, a stage name and a short message, small enough that reporting it
/// every heartbeat costs little.
pub const MAX_PROGRESS_BYTES: usize = 4096;

/// Checks a heartbeat's progress value size: at most [`MAX_PROGRESS_BYTES`].
///
/// ```
/// assert!(tessera_lease::check_progress_size(64).is_ok());
/// assert!(tessera_lease::check_progress_size(tessera_lease::MAX_PROGRESS_BYTES + 1).is_err());
/// ```
pub fn check_progress_size(len: usize) -> Result<(), LeaseError> {
    check_size(Field::Progress, len, MAX_PROGRESS_BYTES)
}

fn check_payload_size(field: Field, len: usize) -> Result<(), LeaseError> {
    check_size(field, len, MAX_BRIEF_BYTES)
}

fn check_size(field: Field, len: usize, max: usize) -> Result<(), LeaseError> {
    if len > max {
        return Err(LeaseError::InvalidInput {
            field,
            len,
            rule: Rule::TooLarge { max },
        });
    }
    Ok(())
}

fn check_name(value: &str, field: Field, max: usize) -> Result<(), LeaseError> {
    let len = value.len();
    let fail = |rule| LeaseError::InvalidInput { field, len, rule };
    if value.is_empty() {
        return Err(fail(Rule::Empty));
    }
    if len > max {
        return Err(fail(Rule::TooLong { max }));
    }
    if let Some(index) = value
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')))
    {
        return Err(fail(Rule::Character { index }));
    }
    if value.starts_with('.') || value.ends_with('.') {
        return Err(fail(Rule::EdgeDot));
    }
    if value.contains("..") {
        return Err(fail(Rule::DoubleDot));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $field:expr, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The longest value accepted, in bytes.
            pub const MAX_LEN: usize = $max;

            /// Parses a value, checking every rule of the module docs.
            pub fn parse(value: &str) -> Result<Self, LeaseError> {
                check_name(value, $field, Self::MAX_LEN)?;
                Ok(Self(value.to_owned()))
            }

            /// The value as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = LeaseError;

            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::parse(value)
            }
        }

        impl TryFrom<String> for $name {
            type Error = LeaseError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                check_name(&value, $field, Self::MAX_LEN)?;
                Ok(Self(value))
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A namespace tasks are enqueued in; at most 64 bytes.
    Namespace,
    Field::Namespace,
    64
);

name_type!(
    /// A queue within a namespace; at most 64 bytes.
    QueueName,
    Field::Queue,
    64
);

name_type!(
    /// Identifies a task (one versioned brief) within its namespace; at most
    /// 128 bytes.
    TaskId,
    Field::Task,
    128
);

name_type!(
    /// Who holds a lease and submits under it; also the scope of idempotency
    /// keys. At most 128 bytes.
    Principal,
    Field::Principal,
    128
);

name_type!(
    /// A client-chosen key that makes a submission safe to retry; scoped per
    /// principal and task. At most 128 bytes (a UUID fits).
    IdempotencyKey,
    Field::IdempotencyKey,
    128
);

name_type!(
    /// Makes a task unique in its queue: while a task holding the key is in
    /// one of its [`UniqueStates`](crate::UniqueStates), an enqueue with the
    /// same key is a duplicate. At most 128 bytes.
    UniqueKey,
    Field::UniqueKey,
    128
);

name_type!(
    /// Groups a queue's tasks for a per-partition concurrency limit ("one at
    /// a time per customer"). At most 128 bytes.
    PartitionKey,
    Field::PartitionKey,
    128
);

name_type!(
    /// Names a periodic schedule within its queue; at most 64 bytes.
    ScheduleName,
    Field::Schedule,
    64
);

name_type!(
    /// Where an attempt's output is stored; at most 192 bytes, room for any
    /// key built by [`ArtifactKey::for_grant`].
    ArtifactKey,
    Field::Artifact,
    192
);

impl ArtifactKey {
    /// The artifact key owned by one grant: `<task>.a<attempt>.t<token>`.
    ///
    /// Distinct grants always get distinct keys (the two suffixes are read
    /// from the right), so a worker whose lease lapsed can never write over
    /// the artifact of the worker that claimed after it.
    ///
    /// ```
    /// use tessera_lease::{ArtifactKey, AttemptNumber, FencingToken, TaskId};
    /// let key = ArtifactKey::for_grant(
    ///     &TaskId::parse("render-42")?,
    ///     AttemptNumber::FIRST,
    ///     FencingToken::new(7)?,
    /// );
    /// assert_eq!(key.as_str(), "render-42.a1.t7");
    /// # Ok::<(), tessera_lease::LeaseError>(())
    /// ```
    pub fn for_grant(task: &TaskId, attempt: AttemptNumber, token: FencingToken) -> Self {
        // A task id cannot end with '.', attempt and token are positive
        // integers, and 128 + ".a" + 5 + ".t" + 19 bytes fit in MAX_LEN.
        let key = format!("{task}.a{attempt}.t{token}");
        debug_assert!(check_name(&key, Field::Artifact, Self::MAX_LEN).is_ok());
        Self(key)
    }
}

/// The version of a task's brief, from 1. Receipts name it so alternatives
/// of different versions are never compared with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct BriefVersion(u32);

impl BriefVersion {
    /// The first version of a brief.
    pub const FIRST: Self = Self(1);

    /// Accepts a positive version.
    pub fn new(value: u32) -> Result<Self, LeaseError> {
        if value == 0 {
            return Err(LeaseError::OutOfRange {
                field: Field::Version,
                value: 0,
                max: i64::from(u32::MAX),
            });
        }
        Ok(Self(value))
    }

    /// The version number.
    pub fn as_u32(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for BriefVersion {
    type Error = LeaseError;

    fn try_from(value: u32) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<BriefVersion> for u32 {
    fn from(version: BriefVersion) -> Self {
        version.0
    }
}

impl fmt::Display for BriefVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Numbers the attempts of a task from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u16", into = "u16")]
pub struct AttemptNumber(pub(crate) u16);

impl AttemptNumber {
    /// The first attempt, the only one of a task without alternatives.
    pub const FIRST: Self = Self(1);

    /// Accepts a positive attempt number.
    pub fn new(value: u16) -> Result<Self, LeaseError> {
        if value == 0 {
            return Err(LeaseError::OutOfRange {
                field: Field::Attempt,
                value: 0,
                max: i64::from(u16::MAX),
            });
        }
        Ok(Self(value))
    }

    /// The number.
    pub fn as_u16(self) -> u16 {
        self.0
    }

    /// Index into a task's attempts.
    pub(crate) fn index(self) -> usize {
        usize::from(self.0 - 1)
    }
}

impl TryFrom<u16> for AttemptNumber {
    type Error = LeaseError;

    fn try_from(value: u16) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<AttemptNumber> for u16 {
    fn from(number: AttemptNumber) -> Self {
        number.0
    }
}

impl fmt::Display for AttemptNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(result: Result<TaskId, LeaseError>) -> Rule {
        match result {
            Err(LeaseError::InvalidInput {
                field: Field::Task,
                rule,
                ..
            }) => rule,
            other => panic!("expected a task id error, got {other:?}"),
        }
    }

    #[test]
    fn accepts_letters_digits_dash_underscore_inner_dot() {
        for ok in ["a", "Task-1", "a_b.c-d", "0", "x.y.z"] {
            assert_eq!(TaskId::parse(ok).unwrap().as_str(), ok);
        }
        let longest = "n".repeat(Namespace::MAX_LEN);
        assert!(Namespace::parse(&longest).is_ok());
    }

    #[test]
    fn rejects_each_rule_with_its_own_error() {
        assert_eq!(rule_of(TaskId::parse("")), Rule::Empty);
        assert_eq!(rule_of(TaskId::parse("a/b")), Rule::Character { index: 1 });
        assert_eq!(rule_of(TaskId::parse("a b")), Rule::Character { index: 1 });
        assert_eq!(rule_of(TaskId::parse("é")), Rule::Character { index: 0 });
        assert_eq!(rule_of(TaskId::parse(".hidden")), Rule::EdgeDot);
        assert_eq!(rule_of(TaskId::parse("trailing.")), Rule::EdgeDot);
        assert_eq!(rule_of(TaskId::parse("a..b")), Rule::DoubleDot);
        assert_eq!(rule_of(TaskId::parse("..")), Rule::EdgeDot);
        let long = "t".repeat(TaskId::MAX_LEN + 1);
        assert_eq!(
            TaskId::parse(&long),
            Err(LeaseError::InvalidInput {
                field: Field::Task,
                len: 129,
                rule: Rule::TooLong { max: 128 },
            })
        );
    }

    #[test]
    fn each_type_names_its_field() {
        let field = |e: LeaseError| match e {
            LeaseError::InvalidInput { field, .. } => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(Namespace::parse("").unwrap_err()), Field::Namespace);
        assert_eq!(field(QueueName::parse("").unwrap_err()), Field::Queue);
        assert_eq!(field(Principal::parse("").unwrap_err()), Field::Principal);
        assert_eq!(
            field(IdempotencyKey::parse("").unwrap_err()),
            Field::IdempotencyKey
        );
        assert_eq!(field(ArtifactKey::parse("").unwrap_err()), Field::Artifact);
    }

    #[test]
    fn artifact_key_of_longest_task_id_and_largest_numbers_is_valid() {
        let task = TaskId::parse(&"t".repeat(TaskId::MAX_LEN)).unwrap();
        let key = ArtifactKey::for_grant(
            &task,
            AttemptNumber::new(u16::MAX).unwrap(),
            FencingToken::new(i64::MAX).unwrap(),
        );
        assert!(ArtifactKey::parse(key.as_str()).is_ok());
    }

    #[test]
    fn brief_size_limit_is_inclusive() {
        assert!(check_brief_size(0).is_ok());
        assert!(check_brief_size(MAX_BRIEF_BYTES).is_ok());
        assert_eq!(
            check_brief_size(MAX_BRIEF_BYTES + 1),
            Err(LeaseError::InvalidInput {
                field: Field::Brief,
                len: MAX_BRIEF_BYTES + 1,
                rule: Rule::TooLarge {
                    max: MAX_BRIEF_BYTES
                },
            })
        );
    }

    #[test]
    fn deserializing_validates() {
        let ok: QueueName = serde_json::from_str("\"jobs\"").unwrap();
        assert_eq!(ok.as_str(), "jobs");
        assert!(serde_json::from_str::<QueueName>("\"a/../b\"").is_err());
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"jobs\"");
    }
}
