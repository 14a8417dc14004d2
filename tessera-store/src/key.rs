//! Key secrets: generation, the presented form, hashing and comparison.
//!
//! A key is shown once as `tsk_<key id>_<secret>`: a 16-hex-digit public key
//! id (64 random bits) and a 64-hex-digit secret (256 random bits). The store
//! keeps the key id and the SHA-256 of the whole presented string, never the
//! string itself.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

const PREFIX: &str = "tsk_";
const KEY_ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// The public identifier of a key: 16 lowercase hex digits, the part of the
/// presented key that is looked up. Safe to log and show.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyId(String);

impl KeyId {
    /// Parses a key id.
    pub fn parse(value: &str) -> Result<Self, Error> {
        if is_lower_hex(value, KEY_ID_BYTES * 2) {
            Ok(Self(value.to_owned()))
        } else {
            Err(Error::InvalidInput {
                reason: "a key id is 16 lowercase hex digits".to_owned(),
            })
        }
    }

    /// The key id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyId {
    type Error = Error;

    fn try_from(value: String) -> Result<Self, Error> {
        Self::parse(&value)
    }
}

impl From<KeyId> for String {
    fn from(value: KeyId) -> Self {
        value.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A newly created key, as its holder presents it: shown once, never stored.
///
/// `Debug` and `Display` print only the key id; [`expose`](Self::expose)
/// returns the whole key to hand to its holder.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret(String);

impl KeySecret {
    /// The whole key, `tsk_<key id>_<secret>`.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySecret({self})")
    }
}

impl fmt::Display for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key_id = &self.0[PREFIX.len()..PREFIX.len() + KEY_ID_BYTES * 2];
        write!(f, "{PREFIX}{key_id}_<redacted>")
    }
}

/// A generated key and what the store keeps of it.
pub(crate) struct IssuedSecret {
    pub(crate) key_id: KeyId,
    pub(crate) secret: KeySecret,
    pub(crate) hash: [u8; 32],
}

/// Draws a new key from the operating system's randomness.
pub(crate) fn generate() -> Result<IssuedSecret, Error> {
    let mut id = [0_u8; KEY_ID_BYTES];
    let mut secret = [0_u8; SECRET_BYTES];
    getrandom::fill(&mut id).map_err(|_| Error::RandomnessUnavailable)?;
    getrandom::fill(&mut secret).map_err(|_| Error::RandomnessUnavailable)?;
    let key_id = KeyId(hex(&id));
    let presented = format!("{PREFIX}{key_id}_{}", hex(&secret));
    Ok(IssuedSecret {
        hash: hash(&presented),
        key_id,
        secret: KeySecret(presented),
    })
}

/// A presented key that has the right form: its key id and hash.
#[derive(Debug)]
pub(crate) struct Presented<'a> {
    pub(crate) key_id: &'a str,
    pub(crate) hash: [u8; 32],
}

/// Splits a presented key; `None` unless it has exactly the issued form.
pub(crate) fn parse_presented(presented: &str) -> Option<Presented<'_>> {
    let rest = presented.strip_prefix(PREFIX)?;
    let (key_id, secret) = rest.split_once('_')?;
    if !is_lower_hex(key_id, KEY_ID_BYTES * 2) || !is_lower_hex(secret, SECRET_BYTES * 2) {
        return None;
    }
    Some(Presented {
        key_id,
        hash: hash(presented),
    })
}

pub(crate) fn hash(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// Compares two byte strings in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from turning the fold into an early exit.
    std::hint::black_box(difference) == 0
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

fn is_lower_hex(value: &str, len: usize) -> bool {
    value.len() == len
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_generated_key_parses_back_to_its_id_and_hash() {
        let generated = generate().unwrap();
        let presented = parse_presented(generated.secret.expose()).unwrap();
        assert_eq!(presented.key_id, generated.key_id.as_str());
        assert!(constant_time_eq(&presented.hash, &generated.hash));
        assert_eq!(generated.secret.expose().len(), 4 + 16 + 1 + 64);
    }

    #[test]
    fn debug_and_display_hide_the_secret() {
        let generated = generate().unwrap();
        let secret_part = &generated.secret.expose()[21..];
        assert!(!format!("{:?}", generated.secret).contains(secret_part));
        assert!(!generated.secret.to_string().contains(secret_part));
        assert!(
            generated
                .secret
                .to_string()
                .contains(generated.key_id.as_str())
        );
    }

    #[test]
    fn malformed_keys_are_rejected() {
        let good = generate().unwrap().secret.expose().to_owned();
        assert!(parse_presented(&good).is_some());
        for bad in [
            "",
            "tsk_",
            &good[..good.len() - 1],
            &good.replace("tsk_", "tsx_"),
            &good.to_uppercase(),
            &format!("{good}0"),
        ] {
            assert!(parse_presented(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(input in ".{0,120}") {
            let _ = parse_presented(&input);
        }

        #[test]
        fn hex_is_two_lowercase_digits_per_byte(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let text = hex(&bytes);
            prop_assert!(is_lower_hex(&text, bytes.len() * 2));
        }
    }
}
