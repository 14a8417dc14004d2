//! The error of this crate: a setting that cannot be used.

/// A setting that cannot be used, naming the setting and the value given.
///
/// `name` is the environment variable when the value came from
/// [`AdmissionConfig::from_env`](crate::AdmissionConfig::from_env) or
/// [`AdmissionConfig::from_lookup`](crate::AdmissionConfig::from_lookup), and
/// the field name when a config built in code fails
/// [`AdmissionConfig::validate`](crate::AdmissionConfig::validate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value does not parse as the setting's type.
    #[error("{name}: cannot read {value:?} as {expected}")]
    Unparsable {
        /// The environment variable or field.
        name: &'static str,
        /// The value as given.
        value: String,
        /// What the setting accepts.
        expected: &'static str,
    },
    /// The value parses but lies outside what the setting accepts
    /// (zero, negative, not finite, too large).
    #[error("{name}: {value} is out of range, expected {expected}")]
    OutOfRange {
        /// The environment variable or field.
        name: &'static str,
        /// The value as given.
        value: String,
        /// What the setting accepts.
        expected: &'static str,
    },
    /// The value is larger than another setting allows, such as an initial
    /// concurrency above the maximum.
    #[error("{name}: {value} exceeds {other}={other_value}")]
    Exceeds {
        /// The environment variable or field that is too large.
        name: &'static str,
        /// Its value.
        value: String,
        /// The environment variable or field it must not exceed.
        other: &'static str,
        /// That setting's value.
        other_value: String,
    },
}

impl ConfigError {
    /// The environment variable or field at fault.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unparsable { name, .. }
            | Self::OutOfRange { name, .. }
            | Self::Exceeds { name, .. } => name,
        }
    }

    /// The value at fault, as given.
    pub fn value(&self) -> &str {
        match self {
            Self::Unparsable { value, .. }
            | Self::OutOfRange { value, .. }
            | Self::Exceeds { value, .. } => value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_setting_and_value_in_lowercase() {
        let error = ConfigError::Exceeds {
            name: "TESSERA_CLAIM_INITIAL_CONCURRENCY",
            value: "64".into(),
            other: "TESSERA_CLAIM_MAX_CONCURRENCY",
            other_value: "16".into(),
        };
        assert_eq!(error.name(), "TESSERA_CLAIM_INITIAL_CONCURRENCY");
        assert_eq!(error.value(), "64");
        assert_eq!(
            error.to_string(),
            "TESSERA_CLAIM_INITIAL_CONCURRENCY: 64 exceeds TESSERA_CLAIM_MAX_CONCURRENCY=16"
        );
    }
}
