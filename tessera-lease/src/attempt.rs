//! Attempts: the unit that is leased.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError};
use crate::lease::LeaseRecord;
use crate::state::TaskState;

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

/// One attempt of a task as stored: a row of an `attempts` table keyed by
/// task and number.
///
/// `lease` is the attempt's latest grant. It stays after the lease ends (by
/// submission, failure report or lapse) so a late call with its token gets a
/// precise error; it is live only while `state` is [`TaskState::Leased`] and
/// the lease has not expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Position among the task's attempts, from 1.
    pub number: AttemptNumber,
    /// Where the attempt is in its lifecycle.
    pub state: TaskState,
    /// How many leases this attempt has been granted.
    pub tries: u32,
    /// The latest lease, if the attempt was ever claimed.
    pub lease: Option<LeaseRecord>,
    /// The error text of the latest failure report that carried one, at
    /// most [`MAX_ERROR_BYTES`](crate::MAX_ERROR_BYTES).
    #[serde(default)]
    pub last_error: Option<String>,
}

impl AttemptRecord {
    /// A fresh, never claimed attempt.
    pub(crate) fn new(number: AttemptNumber) -> Self {
        Self {
            number,
            state: TaskState::Ready,
            tries: 0,
            lease: None,
            last_error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_numbers_start_at_one() {
        assert!(AttemptNumber::new(0).is_err());
        assert_eq!(AttemptNumber::new(1).unwrap(), AttemptNumber::FIRST);
        assert_eq!(AttemptNumber::new(3).unwrap().index(), 2);
        assert!(serde_json::from_str::<AttemptNumber>("0").is_err());
    }
}
