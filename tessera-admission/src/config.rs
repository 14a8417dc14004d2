//! Settings of the admission controller, their defaults and the environment.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Settings of an [`Admission`](crate::Admission) controller.
///
/// These are resource settings, not throughput guarantees: the concurrency
/// window and the pending bound limit retained work; they are not per-principal
/// quotas. Tune them from deployment measurements.
///
/// | field | environment variable | default |
/// | --- | --- | --- |
/// | `initial_concurrency` | `TESSERA_CLAIM_INITIAL_CONCURRENCY` | 32 |
/// | `max_concurrency` | `TESSERA_CLAIM_MAX_CONCURRENCY` | 1024 |
/// | `min_concurrency` | `TESSERA_CLAIM_MIN_CONCURRENCY` | 1 |
/// | `max_pending` | `TESSERA_CLAIM_MAX_PENDING` | 2048 |
/// | `max_wait` | `TESSERA_CLAIM_MAX_WAIT_SECONDS` | 10 s |
/// | `target` | `TESSERA_CLAIM_TARGET_SECONDS` | 0.5 s |
/// | `claims_per_minute` | `TESSERA_CLAIMS_PER_MINUTE` | 0 (off) |
/// | `ewma_weight` | `TESSERA_CLAIM_EWMA_WEIGHT` | 0.2 |
///
/// Serialized, durations are seconds as a number (`"max_wait": 10.0`); missing
/// fields take their defaults and unknown fields are refused. Deserializing
/// does not validate; [`Admission::new`](crate::Admission::new) does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// The concurrency limit at start, between `min_concurrency` and
    /// `max_concurrency`.
    pub initial_concurrency: u32,
    /// The limit never rises above this.
    pub max_concurrency: u32,
    /// The limit never falls below this; at least 1.
    pub min_concurrency: u32,
    /// The most claims that may wait at once, across all principals; at least 1
    /// and at most 2³¹.
    pub max_pending: usize,
    /// How long a claim may wait before it is rejected with
    /// [`RejectReason::WaitExpired`](crate::RejectReason::WaitExpired); also
    /// the longest `Retry-After` handed out.
    #[serde(with = "crate::seconds::number")]
    pub max_wait: Duration,
    /// The service time the average should stay under, and the interval
    /// between two limit adjustments.
    #[serde(with = "crate::seconds::number")]
    pub target: Duration,
    /// Legacy per-principal quota of claims a minute; 0 turns it off.
    ///
    /// A principal may spend a minute's allowance at once and then one claim
    /// every `60 s / claims_per_minute` (a generic cell rate). Claims rejected
    /// for any reason do not count.
    pub claims_per_minute: u32,
    /// Weight of the newest service-time sample in the exponentially weighted
    /// average: `average += ewma_weight * (sample - average)`. In `(0, 1]`;
    /// 1 keeps only the newest sample, 0.2 spreads the memory over about the
    /// last five releases. The average starts at the first sample.
    pub ewma_weight: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            initial_concurrency: 32,
            max_concurrency: 1024,
            min_concurrency: 1,
            max_pending: 2048,
            max_wait: Duration::from_secs(10),
            target: Duration::from_millis(500),
            claims_per_minute: 0,
            ewma_weight: 0.2,
        }
    }
}

impl AdmissionConfig {
    /// Reads the settings from the process environment (see the table on
    /// [`AdmissionConfig`]); unset variables keep their defaults.
    ///
    /// A set variable that does not parse or is out of range is an error
    /// naming the variable and its value, never a silent default.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            // Kept so that it fails to parse and is reported, not ignored.
            Err(std::env::VarError::NotUnicode(value)) => {
                Some(value.to_string_lossy().into_owned())
            }
        })
    }

    /// Like [`from_env`](Self::from_env), reading each variable through
    /// `lookup` (`None`: unset), so settings can come from any source and
    /// tests need not touch the process environment.
    ///
    /// ```
    /// use tessera_admission::AdmissionConfig;
    ///
    /// let config = AdmissionConfig::from_lookup(|name| match name {
    ///     "TESSERA_CLAIM_MAX_PENDING" => Some("64".to_owned()),
    ///     _ => None,
    /// })?;
    /// assert_eq!(config.max_pending, 64);
    ///
    /// let error = AdmissionConfig::from_lookup(|name| {
    ///     (name == "TESSERA_CLAIM_TARGET_SECONDS").then(|| "NaN".to_owned())
    /// })
    /// .unwrap_err();
    /// assert_eq!(error.name(), "TESSERA_CLAIM_TARGET_SECONDS");
    /// assert_eq!(error.value(), "NaN");
    /// # Ok::<(), tessera_admission::ConfigError>(())
    /// ```
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let names = &ENVIRONMENT;
        let mut config = Self::default();
        if let Some(raw) = lookup(names.initial_concurrency) {
            config.initial_concurrency = parse_whole(names.initial_concurrency, &raw, 1)?;
        }
        if let Some(raw) = lookup(names.max_concurrency) {
            config.max_concurrency = parse_whole(names.max_concurrency, &raw, 1)?;
        }
        if let Some(raw) = lookup(names.min_concurrency) {
            config.min_concurrency = parse_whole(names.min_concurrency, &raw, 1)?;
        }
        if let Some(raw) = lookup(names.max_pending) {
            config.max_pending = parse_whole(names.max_pending, &raw, 1)?;
        }
        if let Some(raw) = lookup(names.max_wait) {
            config.max_wait = parse_seconds(names.max_wait, &raw)?;
        }
        if let Some(raw) = lookup(names.target) {
            config.target = parse_seconds(names.target, &raw)?;
        }
        if let Some(raw) = lookup(names.claims_per_minute) {
            config.claims_per_minute = parse_whole(names.claims_per_minute, &raw, 0)?;
        }
        if let Some(raw) = lookup(names.ewma_weight) {
            config.ewma_weight = parse_weight(names.ewma_weight, &raw)?;
        }
        config.check(names)?;
        Ok(config)
    }

    /// Checks every setting: counts at least 1 (except `claims_per_minute`),
    /// durations above zero, `min_concurrency <= initial_concurrency <=
    /// max_concurrency`, `max_pending` at most 2³¹, `ewma_weight` in `(0, 1]`.
    /// Errors name the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check(&FIELDS)
    }

    fn check(&self, names: &Names) -> Result<(), ConfigError> {
        let counts = [
            (
                names.initial_concurrency,
                u64::from(self.initial_concurrency),
            ),
            (names.max_concurrency, u64::from(self.max_concurrency)),
            (names.min_concurrency, u64::from(self.min_concurrency)),
            (names.max_pending, self.max_pending as u64),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(ConfigError::out_of_range(name, 0, "at least 1"));
            }
        }
        if self.max_pending > MAX_PENDING_CAP {
            return Err(ConfigError::out_of_range(
                names.max_pending,
                self.max_pending,
                "at most 2147483648",
            ));
        }
        for (name, duration) in [(names.max_wait, self.max_wait), (names.target, self.target)] {
            if duration.is_zero() {
                return Err(ConfigError::out_of_range(name, 0, "seconds above zero"));
            }
        }
        if !is_weight(self.ewma_weight) {
            return Err(ConfigError::out_of_range(
                names.ewma_weight,
                self.ewma_weight,
                WEIGHT,
            ));
        }
        let bounds = [
            (
                names.initial_concurrency,
                self.initial_concurrency,
                names.max_concurrency,
                self.max_concurrency,
            ),
            (
                names.min_concurrency,
                self.min_concurrency,
                names.initial_concurrency,
                self.initial_concurrency,
            ),
        ];
        for (name, value, other, other_value) in bounds {
            if value > other_value {
                return Err(ConfigError::Exceeds {
                    name,
                    value: value.to_string(),
                    other,
                    other_value: other_value.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// Slot indices in the wait queue are `u32`.
const MAX_PENDING_CAP: usize = 1 << 31;

/// What each setting is called in an error.
struct Names {
    initial_concurrency: &'static str,
    max_concurrency: &'static str,
    min_concurrency: &'static str,
    max_pending: &'static str,
    max_wait: &'static str,
    target: &'static str,
    claims_per_minute: &'static str,
    ewma_weight: &'static str,
}

const FIELDS: Names = Names {
    initial_concurrency: "initial_concurrency",
    max_concurrency: "max_concurrency",
    min_concurrency: "min_concurrency",
    max_pending: "max_pending",
    max_wait: "max_wait",
    target: "target",
    claims_per_minute: "claims_per_minute",
    ewma_weight: "ewma_weight",
};

const ENVIRONMENT: Names = Names {
    initial_concurrency: "TESSERA_CLAIM_INITIAL_CONCURRENCY",
    max_concurrency: "TESSERA_CLAIM_MAX_CONCURRENCY",
    min_concurrency: "TESSERA_CLAIM_MIN_CONCURRENCY",
    max_pending: "TESSERA_CLAIM_MAX_PENDING",
    max_wait: "TESSERA_CLAIM_MAX_WAIT_SECONDS",
    target: "TESSERA_CLAIM_TARGET_SECONDS",
    claims_per_minute: "TESSERA_CLAIMS_PER_MINUTE",
    ewma_weight: "TESSERA_CLAIM_EWMA_WEIGHT",
};

/// What `ewma_weight` accepts, in words.
const WEIGHT: &str = "a weight above 0 and at most 1";

/// Whether `weight` lies in `(0, 1]`; false for NaN.
fn is_weight(weight: f64) -> bool {
    weight > 0.0 && weight <= 1.0
}

/// Parses `raw` (surrounding spaces ignored) as a `T`, or names the setting
/// and what it accepts.
fn parse<T: FromStr>(
    name: &'static str,
    raw: &str,
    expected: &'static str,
) -> Result<T, ConfigError> {
    raw.trim().parse().map_err(|_| ConfigError::Unparsable {
        name,
        value: raw.to_owned(),
        expected,
    })
}

fn parse_whole<T: TryFrom<i128>>(
    name: &'static str,
    raw: &str,
    minimum: i128,
) -> Result<T, ConfigError> {
    let value: i128 = parse(name, raw, "a whole number")?;
    let out_of_range = || {
        let expected = if minimum == 0 {
            "a whole number, 0 or more"
        } else {
            "a whole number, 1 or more"
        };
        ConfigError::out_of_range(name, raw, expected)
    };
    if value < minimum {
        return Err(out_of_range());
    }
    T::try_from(value).map_err(|_| out_of_range())
}

fn parse_seconds(name: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let seconds: f64 = parse(name, raw, "a number of seconds")?;
    // Refuses NaN, infinities, negatives and anything that rounds to zero.
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|duration| !duration.is_zero())
        .ok_or_else(|| ConfigError::out_of_range(name, raw, "seconds above zero"))
}

fn parse_weight(name: &'static str, raw: &str) -> Result<f64, ConfigError> {
    let weight: f64 = parse(name, raw, "a number")?;
    if !is_weight(weight) {
        return Err(ConfigError::out_of_range(name, raw, WEIGHT));
    }
    Ok(weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_valid_and_matches_the_table() {
        let config = AdmissionConfig::default();
        config.validate().unwrap();
        assert_eq!(config.initial_concurrency, 32);
        assert_eq!(config.max_concurrency, 1024);
        assert_eq!(config.max_pending, 2048);
        assert_eq!(config.max_wait, Duration::from_secs(10));
        assert_eq!(config.target, Duration::from_millis(500));
        assert_eq!(config.claims_per_minute, 0);
    }

    #[test]
    fn whole_numbers_refuse_negatives_and_overflow() {
        assert_eq!(parse_whole::<u32>("X", " 7 ", 1), Ok(7));
        assert!(matches!(
            parse_whole::<u32>("X", "-1", 1),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_whole::<u32>("X", "4294967296", 1),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_whole::<u32>("X", "1.5", 1),
            Err(ConfigError::Unparsable { .. })
        ));
        assert_eq!(parse_whole::<u32>("X", "0", 0), Ok(0));
    }

    #[test]
    fn seconds_refuse_zero_negative_nan_and_infinity() {
        assert_eq!(parse_seconds("X", "0.25"), Ok(Duration::from_millis(250)));
        for raw in ["0", "-1", "NaN", "inf", "1e-12", "1e300"] {
            assert!(
                matches!(parse_seconds("X", raw), Err(ConfigError::OutOfRange { .. })),
                "{raw}"
            );
        }
        assert!(matches!(
            parse_seconds("X", "ten"),
            Err(ConfigError::Unparsable { .. })
        ));
    }

    #[test]
    fn weights_lie_in_the_half_open_unit_interval() {
        assert_eq!(parse_weight("X", "1"), Ok(1.0));
        for raw in ["0", "1.01", "NaN", "-0.5"] {
            assert!(parse_weight("X", raw).is_err(), "{raw}");
        }
    }
}
