//! How long a remote worker waits, as pure functions: no clock, no sleep
//! and no randomness of their own (the caller passes the time and a
//! random number), so each rule is tested alone.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Error;

/// The longest wait the client takes from a server's answer: a
/// `Retry-After` or `reset_at` further off is taken as this.
pub const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest wait after an empty claim, whatever `Retry-After` says
/// (the server's own is at least this).
pub const EMPTY_FLOOR: Duration = Duration::from_secs(1);

/// The most jitter added to a wait the server asked for.
pub const MAX_JITTER: Duration = Duration::from_secs(30);
/// The first wait after a lost connection.
pub const BACKOFF_FLOOR: Duration = Duration::from_millis(100);
/// The longest wait after lost connections in a row.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// `fraction` of `span`, for a `random` number drawn uniformly from all
/// of `u64`.
fn part_of(span: Duration, random: u64) -> Duration {
    let nanos = span.as_nanos().min(u128::from(u64::MAX));
    let part = nanos * u128::from(random) / (u128::from(u64::MAX) + 1);
    Duration::from_nanos(u64::try_from(part).unwrap_or(u64::MAX))
}

/// A wait the server asked for (`Retry-After`), plus up to a fifth more
/// (at most [`MAX_JITTER`]), so workers told the same thing do not come
/// back together.
pub fn jittered(wait: Duration, random: u64) -> Duration {
    let wait = wait.min(LONGEST_WAIT);
    wait + part_of((wait / 5).min(MAX_JITTER), random)
}

/// The wait after `failures` lost connections in a row (1 for the
/// first): from [`BACKOFF_FLOOR`], doubling, at most [`BACKOFF_CAP`],
/// each between half and all of that ("equal jitter").
pub fn backoff(failures: u32, random: u64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let full = (BACKOFF_FLOOR * 2u32.pow(doublings)).min(BACKOFF_CAP);
    full / 2 + part_of(full / 2, random)
}

/// How often a held lease is extended: a third of the length it was
/// granted with, so two beats can be lost before it lapses.
pub fn heartbeat_every(lease_length: Duration) -> Duration {
    (lease_length / 3).max(Duration::from_millis(10))
}

/// The wait before trying again after `error`, at `now`, the
/// `failures`-th in a row: until a spent storage allowance's `reset_at`,
/// else the `Retry-After` the server gave, each jittered and at least
/// [`backoff`] (a `Retry-After: 0` is no reason to spin), else
/// [`backoff`]; at most [`LONGEST_WAIT`] and its jitter. `None` when the
/// error is not one a wait answers.
pub fn after_error(
    error: &Error,
    now: DateTime<Utc>,
    failures: u32,
    random: u64,
) -> Option<Duration> {
    if !error.is_transient() {
        return None;
    }
    if let Some(reset_at) = error.reset_at() {
        // The server's Retry-After too, in case this clock runs ahead of
        // the server's.
        let until = (reset_at - now).to_std().unwrap_or_default();
        let asked = error.retry_after().unwrap_or_default();
        return Some(jittered(until.max(asked).max(backoff(failures, 0)), random));
    }
    Some(match error.retry_after() {
        Some(wait) => jittered(wait.max(backoff(failures, 0)), random),
        None => backoff(failures, random),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessera_store::error::ErrorDetail;

    use super::*;

    fn refused(status: u16, retry_after: Option<u64>, reset_at: Option<DateTime<Utc>>) -> Error {
        Error::Refused {
            status,
            detail: ErrorDetail {
                code: "x".into(),
                message: "x".into(),
                retry_after,
                reset_at,
            },
        }
    }

    proptest! {
        #[test]
        fn jitter_adds_at_most_a_fifth_and_thirty_seconds(millis in 0u64..10_000_000, random: u64) {
            let wait = Duration::from_millis(millis);
            let jittered = jittered(wait, random);
            prop_assert!(jittered >= wait);
            prop_assert!(jittered <= wait + (wait / 5).min(MAX_JITTER));
        }

        #[test]
        fn no_answer_makes_a_wait_overflow(seconds: u64, failures: u32, random: u64) {
            let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).unwrap();
            for error in [refused(429, Some(seconds), None), refused(503, Some(seconds), Some(now + chrono::Duration::days(400)))] {
                let wait = after_error(&error, now, failures, random).unwrap();
                prop_assert!(wait <= LONGEST_WAIT + MAX_JITTER);
                let _ = std::time::Instant::now() + wait;
            }
        }

        #[test]
        fn backoff_stays_between_half_and_all_of_its_step(failures in 1u32..100, random: u64) {
            let wait = backoff(failures, random);
            let full = (BACKOFF_FLOOR * 2u32.pow(failures.saturating_sub(1).min(16))).min(BACKOFF_CAP);
            prop_assert!(wait >= full / 2 && wait <= full);
        }
    }

    #[test]
    fn random_spreads_a_wait_across_its_jitter() {
        let wait = Duration::from_secs(10);
        assert_eq!(jittered(wait, 0), wait);
        assert!(jittered(wait, u64::MAX) > Duration::from_millis(11_999));
        assert!(jittered(wait, u64::MAX / 2) < Duration::from_millis(11_001));
    }

    #[test]
    fn a_spent_allowance_is_waited_out_until_it_resets() {
        let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).unwrap();
        let reset = now + chrono::Duration::seconds(90);
        let error = refused(503, Some(5), Some(reset));
        assert_eq!(
            after_error(&error, now, 1, 0),
            Some(Duration::from_secs(90))
        );
        let ahead = now + chrono::Duration::seconds(120);
        assert_eq!(
            after_error(&error, ahead, 1, 0),
            Some(Duration::from_secs(5)),
            "a clock past reset_at still waits the server's Retry-After"
        );
        let overloaded = refused(429, Some(2), None);
        assert_eq!(
            after_error(&overloaded, now, 1, 0),
            Some(Duration::from_secs(2))
        );
        let lost = Error::Transport {
            message: "reset".into(),
        };
        assert_eq!(
            after_error(&lost, now, 3, u64::MAX),
            Some(Duration::from_millis(400) - Duration::from_nanos(1))
        );
        assert_eq!(after_error(&refused(403, None, None), now, 1, 0), None);
    }

    #[test]
    fn a_lease_is_extended_three_times_per_length() {
        assert_eq!(
            heartbeat_every(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
    }
}
