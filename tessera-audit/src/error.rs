//! The one error type of this crate.

use chrono::{DateTime, Utc};

/// Why a value could not be built or read back.
///
/// Every variant is bad input; nothing in this crate fails at run time once its
/// values exist. Messages never repeat an identifier, a secret or an address
/// hash, since the value that failed may be one pasted in the wrong place; only
/// an unknown action or outcome name, which is neither, is quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A principal, namespace or resource identifier is empty, too long or holds
    /// a control character.
    #[error("invalid {kind}: {reason}")]
    InvalidIdentifier {
        /// Which identifier: `principal`, `namespace` or `resource`.
        kind: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A stored action name is not one this version knows.
    #[error("unknown action name {0:?}")]
    UnknownAction(String),
    /// A stored outcome name is not one this version knows.
    #[error("unknown outcome name {0:?}")]
    UnknownOutcome(String),
    /// A stored address hash is not 64 lowercase hexadecimal digits.
    #[error("invalid address hash: expected 64 lowercase hexadecimal digits")]
    InvalidIpHash,
    /// A secret is shorter than [`Secret::MIN_LEN`](crate::Secret::MIN_LEN) bytes.
    #[error("secret too short: {len} bytes, at least {min} required")]
    SecretTooShort {
        /// The length given.
        len: usize,
        /// The minimum length.
        min: usize,
    },
    /// A counter minute read back does not start on a whole minute.
    #[error("counter minute {0} does not start on a whole minute")]
    UnalignedMinute(DateTime<Utc>),
}
