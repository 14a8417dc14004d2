//! A server secret that never prints.

use std::fmt;

use crate::Error;

/// A server-side secret, such as the key the address hash is derived from.
///
/// `Debug` and `Display` print `[redacted]`, it is not `Serialize`, and nothing
/// in this crate hands its bytes back out: the only way to use it is to give it
/// to a type that needs it, such as [`AddressHasher`](crate::AddressHasher).
/// The bytes are overwritten with zeros when it is dropped (best effort: copies
/// the allocator or the compiler made are out of reach).
///
/// ```
/// use tessera_audit::Secret;
///
/// let secret = Secret::new(*b"0123456789abcdef0123456789abcdef")?;
/// assert_eq!(format!("{secret:?} {secret}"), "[redacted] [redacted]");
/// # Ok::<(), tessera_audit::Error>(())
/// ```
///
/// ```compile_fail
/// let secret = tessera_audit::Secret::new(*b"0123456789abcdef0123456789abcdef").unwrap();
/// serde_json::to_string(&secret).unwrap(); // Secret is not Serialize
/// ```
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// The shortest secret accepted, in bytes.
    ///
    /// A short secret would let anyone who sees the hashes try every IPv4
    /// address against every guess of the secret.
    pub const MIN_LEN: usize = 16;

    /// Wraps secret bytes; fails if there are fewer than [`Self::MIN_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, Error> {
        let bytes = bytes.into();
        if bytes.len() < Self::MIN_LEN {
            return Err(Error::SecretTooShort {
                len: bytes.len(),
                min: Self::MIN_LEN,
            });
        }
        Ok(Self(bytes.into_boxed_slice()))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.fill(0);
        // Keeps the zeroing from being optimised away as a dead store.
        std::hint::black_box(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secret_is_refused_without_echoing_it() {
        let error = Secret::new(*b"fifteen-bytes!!").unwrap_err();
        assert_eq!(error, Error::SecretTooShort { len: 15, min: 16 });
        assert!(!error.to_string().contains("fifteen"));
        assert!(Secret::new(*b"sixteen-bytes!!!").is_ok());
    }

    #[test]
    fn debug_and_display_are_redacted() {
        let secret = Secret::new(*b"canary-canary-canary").unwrap();
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{secret:#?}"), "[redacted]");
        assert_eq!(secret.to_string(), "[redacted]");
        assert_eq!(secret.clone().bytes(), b"canary-canary-canary");
    }
}
