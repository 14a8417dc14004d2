//! Duration limits and the one place durations meet wall-clock times.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::error::{DurationRule, Field, LeaseError};

/// The longest lease a claim may grant or a heartbeat may extend by: one day.
/// Longer work heartbeats.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest retry backoff: seven days.
pub const MAX_BACKOFF: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Checks a lease duration or extension: positive and at most
/// [`MAX_LEASE_DURATION`].
pub(crate) fn check_lease_duration(duration: Duration, field: Field) -> Result<(), LeaseError> {
    if duration.is_zero() {
        return Err(LeaseError::InvalidDuration {
            field,
            rule: DurationRule::Zero,
        });
    }
    check_at_most(duration, field, MAX_LEASE_DURATION)
}

/// Checks a backoff: zero (no wait) up to [`MAX_BACKOFF`].
pub(crate) fn check_backoff(duration: Duration) -> Result<(), LeaseError> {
    check_at_most(duration, Field::Backoff, MAX_BACKOFF)
}

fn check_at_most(duration: Duration, field: Field, max: Duration) -> Result<(), LeaseError> {
    if duration > max {
        return Err(LeaseError::InvalidDuration {
            field,
            rule: DurationRule::TooLong {
                max_secs: max.as_secs(),
            },
        });
    }
    Ok(())
}

/// `time + duration`, or an error past the range of `DateTime`.
pub(crate) fn add(time: DateTime<Utc>, duration: Duration) -> Result<DateTime<Utc>, LeaseError> {
    TimeDelta::from_std(duration)
        .ok()
        .and_then(|delta| time.checked_add_signed(delta))
        .ok_or(LeaseError::TimeOutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_durations_are_positive_and_bounded() {
        assert!(check_lease_duration(Duration::from_secs(1), Field::LeaseDuration).is_ok());
        assert!(check_lease_duration(MAX_LEASE_DURATION, Field::Extension).is_ok());
        assert_eq!(
            check_lease_duration(Duration::ZERO, Field::Extension),
            Err(LeaseError::InvalidDuration {
                field: Field::Extension,
                rule: DurationRule::Zero
            })
        );
        assert!(
            check_lease_duration(
                MAX_LEASE_DURATION + Duration::from_nanos(1),
                Field::Extension
            )
            .is_err()
        );
    }

    #[test]
    fn backoff_may_be_zero() {
        assert!(check_backoff(Duration::ZERO).is_ok());
        assert!(check_backoff(MAX_BACKOFF).is_ok());
        assert!(check_backoff(MAX_BACKOFF * 2).is_err());
    }

    #[test]
    fn adding_past_the_end_of_time_is_an_error() {
        assert_eq!(
            add(DateTime::<Utc>::MAX_UTC, Duration::from_secs(1)),
            Err(LeaseError::TimeOutOfRange)
        );
        let t: DateTime<Utc> = "2026-10-29T12:00:00Z".parse().unwrap();
        assert_eq!(
            add(t, Duration::from_millis(1500)).unwrap(),
            "2026-10-29T12:00:01.500Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}
