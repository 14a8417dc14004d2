//! Fencing tokens.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError};

/// A fencing token: a positive number that strictly increases with every
/// lease granted for a task, across all of its attempts, lapses and re-claims.
///
/// It is an `i64` because SQLite integers are signed; zero and negative values
/// are never tokens, so a stored `0` can mean "never granted".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct FencingToken(i64);

impl FencingToken {
    /// The first token a task grants.
    pub const FIRST: Self = Self(1);

    /// Accepts a token a worker presents or the store reads back.
    pub fn new(value: i64) -> Result<Self, LeaseError> {
        if value < 1 {
            return Err(LeaseError::OutOfRange {
                field: Field::Token,
                value,
                max: i64::MAX,
            });
        }
        Ok(Self(value))
    }

    /// The token as stored.
    pub fn as_i64(self) -> i64 {
        self.0
    }

    /// The token after this one, or `None` past `i64::MAX`.
    pub(crate) fn next(self) -> Option<Self> {
        self.0.checked_add(1).map(Self)
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = LeaseError;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<FencingToken> for i64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_values_are_tokens() {
        assert!(FencingToken::new(0).is_err());
        assert!(FencingToken::new(-5).is_err());
        assert_eq!(FencingToken::new(1).unwrap(), FencingToken::FIRST);
        assert!(serde_json::from_str::<FencingToken>("0").is_err());
        assert_eq!(
            serde_json::from_str::<FencingToken>("9").unwrap().as_i64(),
            9
        );
    }

    #[test]
    fn next_increases_and_stops_at_the_top() {
        assert_eq!(FencingToken::FIRST.next().unwrap().as_i64(), 2);
        assert_eq!(FencingToken::new(i64::MAX).unwrap().next(), None);
    }
}
