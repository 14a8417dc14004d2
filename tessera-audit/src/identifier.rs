//! Plain identifiers an audit row names: principal, namespace, resource.

use std::{fmt, str::FromStr, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::Error;

/// Checks the rules every identifier shares; never echoes the value.
fn check(kind: &'static str, value: &str, max_len: usize) -> Result<(), Error> {
    let reason = if value.is_empty() {
        "empty"
    } else if value.len() > max_len {
        "too long"
    } else if value.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(Error::InvalidIdentifier { kind, reason })
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:literal) => {
        $(#[$doc])*
        ///
        /// Never empty, at most
        #[doc = concat!(stringify!($max), " bytes,")]
        /// no control characters. Cloning is cheap (a shared string).
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            /// The longest identifier accepted, in bytes.
            pub const MAX_LEN: usize = $max;

            /// Checks and wraps an identifier.
            pub fn new(value: &str) -> Result<Self, Error> {
                check($kind, value, Self::MAX_LEN)?;
                Ok(Self(Arc::from(value)))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(value: &str) -> Result<Self, Error> {
                Self::new(value)
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;

            fn try_from(value: String) -> Result<Self, Error> {
                check($kind, &value, Self::MAX_LEN)?;
                Ok(Self(Arc::from(value)))
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }
    };
}

identifier!(
    /// Who acted: the identifier of a principal (never its key).
    Principal,
    "principal",
    128
);

identifier!(
    /// Where it happened: the namespace a request named.
    Namespace,
    "namespace",
    128
);

identifier!(
    /// What was acted on, such as a task or the run an execution record names.
    Resource,
    "resource",
    512
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_at_their_edges() {
        assert!(Principal::new("").is_err());
        assert!(Principal::new(&"p".repeat(128)).is_ok());
        assert!(Principal::new(&"p".repeat(129)).is_err());
        assert!(Resource::new(&"r".repeat(512)).is_ok());
        assert!(Resource::new(&"r".repeat(513)).is_err());
        assert!(Namespace::new("main\n").is_err());
        assert!(Namespace::new("main").is_ok());
        assert_eq!(
            Namespace::new("").unwrap_err(),
            Error::InvalidIdentifier {
                kind: "namespace",
                reason: "empty"
            }
        );
    }

    #[test]
    fn serde_reads_back_and_refuses_invalid() {
        let principal = Principal::new("worker-7").unwrap();
        let json = serde_json::to_string(&principal).unwrap();
        assert_eq!(json, r#""worker-7""#);
        assert_eq!(serde_json::from_str::<Principal>(&json).unwrap(), principal);
        assert!(serde_json::from_str::<Principal>(r#""""#).is_err());
        assert_eq!(
            format!("{principal:?} {principal}"),
            r#""worker-7" worker-7"#
        );
    }
}
