//! Payload digests.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError, Rule};

/// A 32-byte payload digest (SHA-256 in Tessera hosts), written as 64 hex
/// digits. This crate never hashes; it compares digests it is given.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest([u8; 32]);

impl Digest {
    /// Length of the hex form.
    pub const HEX_LEN: usize = 64;

    /// Wraps raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Parses 64 hex digits, either case.
    pub fn parse(hex: &str) -> Result<Self, LeaseError> {
        let len = hex.len();
        let fail = |rule| LeaseError::InvalidInput {
            field: Field::Digest,
            len,
            rule,
        };
        if len != Self::HEX_LEN {
            return Err(fail(Rule::Length {
                expected: Self::HEX_LEN,
            }));
        }
        let mut bytes = [0u8; 32];
        let raw = hex.as_bytes();
        for (i, byte) in bytes.iter_mut().enumerate() {
            let high = nibble(raw[2 * i]).ok_or(fail(Rule::NotHex { index: 2 * i }))?;
            let low = nibble(raw[2 * i + 1]).ok_or(fail(Rule::NotHex { index: 2 * i + 1 }))?;
            *byte = (high << 4) | low;
        }
        Ok(Self(bytes))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl FromStr for Digest {
    type Err = LeaseError;

    fn from_str(hex: &str) -> Result<Self, Self::Err> {
        Self::parse(hex)
    }
}

impl TryFrom<String> for Digest {
    type Error = LeaseError;

    fn try_from(hex: String) -> Result<Self, Self::Error> {
        Self::parse(&hex)
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> Self {
        digest.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_in_lowercase() {
        let mut bytes = [0u8; 32];
        bytes[0] = 0xAB;
        bytes[31] = 0x01;
        let digest = Digest::from_bytes(bytes);
        let hex = digest.to_string();
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("ab") && hex.ends_with("01"));
        assert_eq!(Digest::parse(&hex).unwrap(), digest);
        assert_eq!(Digest::parse(&hex.to_uppercase()).unwrap(), digest);
        let json = serde_json::to_string(&digest).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), digest);
    }

    #[test]
    fn rejects_wrong_length_and_non_hex() {
        assert_eq!(
            Digest::parse("abc"),
            Err(LeaseError::InvalidInput {
                field: Field::Digest,
                len: 3,
                rule: Rule::Length { expected: 64 },
            })
        );
        let mut bad = "0".repeat(64);
        bad.replace_range(5..6, "g");
        assert_eq!(
            Digest::parse(&bad),
            Err(LeaseError::InvalidInput {
                field: Field::Digest,
                len: 64,
                rule: Rule::NotHex { index: 5 },
            })
        );
        assert!(serde_json::from_str::<Digest>("\"zz\"").is_err());
    }
}
