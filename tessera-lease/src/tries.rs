//! Attempt limits and the retry backoff a worker does not name.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many tries (grants whose lease lapsed or failed, plus the last one)
/// an attempt gets unless its task says otherwise.
///
/// Twenty, as Oban's default: with the default backoff the tries of a task
/// that always fails spread over four to eight hours, long enough to
/// outlast a dependency's outage and short enough that a poison task ends
/// the same day.
pub const DEFAULT_MAX_TRIES: u32 = 20;

/// The most tries a task may allow.
pub const MAX_TRIES: u32 = 10_000;

/// The longest error text a failure report may carry, in bytes.
pub const MAX_ERROR_BYTES: usize = 2048;

/// The first default backoff: one second.
pub const RETRY_BACKOFF_BASE: Duration = Duration::from_secs(1);

/// The longest default backoff: one hour.
pub const RETRY_BACKOFF_CAP: Duration = Duration::from_secs(60 * 60);

/// A seeded source of jitter for [`retry_backoff`]: SplitMix64, so the same
/// seed gives the same backoffs, and tests stay deterministic.
///
/// ```
/// use tessera_lease::Jitter;
///
/// let mut a = Jitter::seeded(7);
/// let mut b = Jitter::seeded(7);
/// assert_eq!(a.next_unit(), b.next_unit());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A source that starts from `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next draw, uniform in `[0, 1)`.
    pub fn next_unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits, as f64's mantissa holds them exactly.
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The backoff before try `tries + 1` of an attempt whose try `tries`
/// failed without naming one: exponential from [`RETRY_BACKOFF_BASE`],
/// doubling per try and capped at [`RETRY_BACKOFF_CAP`], of which a random
/// half is taken off ("equal jitter"). It is never below half the
/// exponential step, so retries of many tasks spread out without one
/// collapsing to no wait, and never above the cap. Whole milliseconds.
pub fn retry_backoff(tries: u32, jitter: &mut Jitter) -> Duration {
    let doublings = tries.saturating_sub(1).min(31);
    let step = RETRY_BACKOFF_BASE
        .saturating_mul(1u32 << doublings)
        .min(RETRY_BACKOFF_CAP);
    let step_ms = step.as_millis() as f64;
    let ms = step_ms / 2.0 + jitter.next_unit() * step_ms / 2.0;
    Duration::from_millis(ms as u64)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut jitter = Jitter::seeded(1);
        let first = retry_backoff(1, &mut jitter);
        assert!(first >= Duration::from_millis(500) && first < RETRY_BACKOFF_BASE);
        let tenth = retry_backoff(10, &mut jitter);
        assert!(tenth >= Duration::from_secs(256) && tenth < Duration::from_secs(512));
        for tries in [13, 40, u32::MAX] {
            let late = retry_backoff(tries, &mut jitter);
            assert!(late >= RETRY_BACKOFF_CAP / 2 && late <= RETRY_BACKOFF_CAP);
        }
    }

    proptest! {
        #[test]
        fn jitter_is_deterministic_and_in_range(seed: u64, tries in 0u32..100) {
            let (mut a, mut b) = (Jitter::seeded(seed), Jitter::seeded(seed));
            let unit = a.next_unit();
            prop_assert!((0.0..1.0).contains(&unit));
            prop_assert_eq!(unit, b.next_unit());
            let backoff = retry_backoff(tries, &mut a);
            prop_assert_eq!(backoff, retry_backoff(tries, &mut b));
            let step = RETRY_BACKOFF_BASE
                .saturating_mul(1 << tries.saturating_sub(1).min(31))
                .min(RETRY_BACKOFF_CAP);
            prop_assert!(backoff >= step / 2 - Duration::from_millis(1));
            prop_assert!(backoff <= step);
        }
    }
}
