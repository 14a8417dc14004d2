//! The one error of this crate: a setting that cannot be used.

/// A setting that cannot be used, naming the setting and the value given.
///
/// Only building a controller or a policy fails; once built, every decision
/// is a value (a [`Rejection`](crate::Rejection), a hint, a
/// [`MintDecision`](crate::MintDecision)), never an error.
///
/// [`name`](Self::name) says where the value came from:
///
/// - the environment variable, for
///   [`AdmissionConfig::from_env`](crate::AdmissionConfig::from_env) and
///   [`AdmissionConfig::from_lookup`](crate::AdmissionConfig::from_lookup)
///   (`TESSERA_CLAIM_MAX_PENDING`);
/// - the field, for [`AdmissionConfig::validate`](crate::AdmissionConfig::validate)
///   (`max_pending`);
/// - `policy.field`, for [`IdleConfig::validate`](crate::IdleConfig::validate)
///   and [`MintConfig::validate`](crate::MintConfig::validate)
///   (`idle.capacity`, `mint.per_hour`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value does not parse as the setting's type.
    #[error("{name}: cannot read {value:?} as {expected}")]
    Unparsable {
        /// The environment variable, field or `policy.field`.
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
        /// The environment variable, field or `policy.field`.
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
    /// An [`OutOfRange`](Self::OutOfRange) error.
    pub(crate) fn out_of_range(
        name: &'static str,
        value: impl ToString,
        expected: &'static str,
    ) -> Self {
        Self::OutOfRange {
            name,
            value: value.to_string(),
            expected,
        }
    }

    /// The environment variable, field or `policy.field` at fault.
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
