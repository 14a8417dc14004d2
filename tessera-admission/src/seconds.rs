//! Durations as seconds: the rounding every `Retry-After` uses (public, so a
//! store rounds its own waits the same way), and the serde form of settings
//! and stats.

use std::time::Duration;

/// `wait` in whole seconds, rounded up and at least one, saturating at
/// `u64::MAX`: the value of every `Retry-After` header. A `Retry-After` never
/// invites a retry before the wait is over, nor an immediate one.
///
/// ```
/// use std::time::Duration;
/// use tessera_admission::retry_after_seconds;
///
/// assert_eq!(retry_after_seconds(Duration::ZERO), 1);
/// assert_eq!(retry_after_seconds(Duration::from_millis(30_500)), 31);
/// assert_eq!(retry_after_seconds(Duration::from_secs(60)), 60);
/// ```
#[must_use]
pub fn retry_after_seconds(wait: Duration) -> u64 {
    let rounded_up = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    rounded_up.max(1)
}

/// Serde for a [`Duration`] as a number of seconds.
pub(crate) mod number {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(
        duration: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(seconds).map_err(D::Error::custom)
    }
}

/// Serde for an optional [`Duration`] as a number of seconds or null.
pub(crate) mod optional_number {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(
        duration: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => serializer.serialize_some(&duration.as_secs_f64()),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<f64>::deserialize(deserializer)?
            .map(|seconds| Duration::try_from_secs_f64(seconds).map_err(D::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let seconds = |nanos| retry_after_seconds(Duration::from_nanos(nanos));
        assert_eq!(seconds(0), 1);
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(1_000_000_000), 1);
        assert_eq!(seconds(1_000_000_001), 2);
    }

    #[test]
    fn retry_after_saturates_at_the_longest_duration() {
        // Rounding `Duration::MAX` up must not wrap to a one-second hint.
        assert_eq!(retry_after_seconds(Duration::MAX), u64::MAX);
    }
}
