//! Attempts: the unit that is leased.

use serde::{Deserialize, Serialize};

use crate::lease::LeaseRecord;
use crate::name::AttemptNumber;
use crate::state::TaskState;

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
