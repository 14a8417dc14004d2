//! The daily-rotated keyed hash that stands in for a caller's address.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::{Error, Secret};

type HmacSha256 = Hmac<Sha256>;

/// Hashes address groups under a key that changes at every UTC midnight.
///
/// The day key is `HMAC-SHA-256(secret, "tessera ip-hash day YYYY-MM-DD")` and
/// the hash is `HMAC-SHA-256(day key, group bytes)`, written as lowercase hex.
/// The same group on the same UTC day gives the same hash, so one day's rows can
/// be correlated; the next day gives an unrelated hash, and without the secret
/// a hash cannot be tested against candidate addresses.
///
/// The caller passes the address group's stable bytes (an IPv6 /64 prefix, or an
/// IPv4 address), never the full address of an IPv6 caller.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use tessera_audit::{AddressHasher, Secret};
///
/// let hasher = AddressHasher::new(Secret::new(*b"0123456789abcdef0123456789abcdef")?);
/// let morning = Utc.with_ymd_and_hms(2026, 10, 29, 8, 0, 0).unwrap();
/// let evening = Utc.with_ymd_and_hms(2026, 10, 29, 23, 59, 59).unwrap();
/// let group = [192, 0, 2, 1];
/// assert_eq!(hasher.hash(&group, morning), hasher.hash(&group, evening));
/// assert_eq!(hasher.hash(&group, morning).as_str().len(), 64);
/// # Ok::<(), tessera_audit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AddressHasher {
    secret: Secret,
}

impl AddressHasher {
    /// A hasher keyed by `secret`.
    pub fn new(secret: Secret) -> Self {
        Self { secret }
    }

    /// The hash of an address group's bytes on the UTC day of `now`.
    #[must_use]
    pub fn hash(&self, group: &[u8], now: DateTime<Utc>) -> IpHash {
        // Two HMACs per call (a few hundred nanoseconds); caching the day key
        // would need `&mut self` or interior mutability for no visible gain.
        let label = format!("tessera ip-hash day {}", now.format("%Y-%m-%d"));
        let day_key = hmac(self.secret.bytes(), label.as_bytes());
        let digest = hmac(&day_key, group);
        IpHash(hex(&digest))
    }
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn hex(bytes: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(64);
    for &byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// A daily-rotated hash of an address group: 64 lowercase hex digits.
///
/// Made by [`AddressHasher::hash`], or read back from storage with [`FromStr`]
/// or serde, which accept nothing but 64 lowercase hex digits, so an address
/// cannot be stored in its place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpHash(String);

impl IpHash {
    /// The hash as hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IpHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for IpHash {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Self::try_from(text.to_owned())
    }
}

impl TryFrom<String> for IpHash {
    type Error = Error;

    fn try_from(text: String) -> Result<Self, Error> {
        let valid =
            text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if valid {
            Ok(Self(text))
        } else {
            Err(Error::InvalidIpHash)
        }
    }
}

impl From<IpHash> for String {
    fn from(hash: IpHash) -> Self {
        hash.0
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeDelta, TimeZone};

    use super::*;

    fn hasher() -> AddressHasher {
        AddressHasher::new(Secret::new(*b"tessera test secret, 32 bytes!!!").unwrap())
    }

    #[test]
    fn known_value() {
        // Computed independently with Python's hmac module; pins the format.
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        assert_eq!(
            hasher().hash(&[192, 0, 2, 1], now).as_str(),
            "4b7ce8f27e416634bc7354fab42299f703330344637a1e39238fcfe6a78053bb"
        );
    }

    #[test]
    fn rotates_exactly_at_utc_midnight() {
        let hasher = hasher();
        let group = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1];
        let midnight = Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap();
        let just_before = midnight - TimeDelta::nanoseconds(1);
        let start_of_day = Utc.with_ymd_and_hms(2026, 10, 29, 0, 0, 0).unwrap();
        assert_eq!(
            hasher.hash(&group, start_of_day),
            hasher.hash(&group, just_before)
        );
        assert_ne!(
            hasher.hash(&group, just_before),
            hasher.hash(&group, midnight)
        );
        assert_eq!(
            hasher.hash(&group, midnight),
            hasher.hash(&group, midnight + TimeDelta::hours(23))
        );
    }

    #[test]
    fn depends_on_group_and_secret() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let other = AddressHasher::new(Secret::new(*b"another secret, also 32 bytes!!!").unwrap());
        assert_ne!(
            hasher().hash(&[10, 0, 0, 1], now),
            hasher().hash(&[10, 0, 0, 2], now)
        );
        assert_ne!(
            hasher().hash(&[10, 0, 0, 1], now),
            other.hash(&[10, 0, 0, 1], now)
        );
    }

    #[test]
    fn reading_back_accepts_only_hashes() {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let hash = hasher().hash(&[10, 0, 0, 1], now);
        assert_eq!(hash.as_str().parse::<IpHash>().unwrap(), hash);
        let json = serde_json::to_string(&hash).unwrap();
        assert_eq!(serde_json::from_str::<IpHash>(&json).unwrap(), hash);
        for bad in [
            "10.0.0.1",
            "2001:db8::1",
            &hash.as_str().to_uppercase(),
            &hash.as_str()[1..],
        ] {
            assert_eq!(bad.parse::<IpHash>(), Err(Error::InvalidIpHash), "{bad}");
        }
        assert!(serde_json::from_str::<IpHash>(r#""10.0.0.1""#).is_err());
    }
}
