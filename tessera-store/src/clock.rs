//! The clock the store reads time from.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

/// Where the store reads time.
///
/// Every time a rule reads comes from the store's clock. Hosts use
/// [`SystemClock`]; tests and simulations use [`ManualClock`] and move time
/// by hand. Four things read the operating system's clocks directly, none
/// of them a rule: the completer's short wait for more acknowledgements to
/// commit together (its `max_wait`), the seed of the retry jitter when the
/// configuration names none, opening a PostgreSQL store (the listener's
/// connect timeout, and the mark its notifications carry), and the
/// `tracing`/`metrics` features' timings of commits and operations.
pub trait Clock: Send + Sync + 'static {
    /// The wall-clock time, used for minutes, days, expiry and UTC midnight.
    fn now_utc(&self) -> DateTime<Utc>;

    /// The monotonic time, used for waiting and service time.
    fn now(&self) -> Instant;

    /// The longest a thread blocked in the store (a waiting claim, a
    /// long-poll) sleeps in real time before reading this clock again.
    ///
    /// `None` (the default) says the clock follows real time, so a blocked
    /// thread sleeps until its deadline or until it is woken. A clock that
    /// jumps when told to, like [`ManualClock`], returns a short slice so
    /// blocked threads notice a jump soon after it happens.
    fn max_park(&self) -> Option<Duration> {
        None
    }
}

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_utc(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
///
/// Clones share one time, so a test keeps a clone and advances the clock the
/// store reads. [`advance`](Self::advance) moves both the wall clock and the
/// monotonic clock; [`set_utc`](Self::set_utc) moves only the wall clock.
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualTime>>,
}

#[derive(Debug, Clone, Copy)]
struct ManualTime {
    utc: DateTime<Utc>,
    monotonic: Instant,
}

impl ManualClock {
    /// A clock that reads `start` until it is moved.
    ///
    /// The monotonic reading starts at an arbitrary instant; only differences
    /// between its readings mean anything.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(ManualTime {
                utc: start,
                // The one real clock read: an arbitrary origin for the
                // monotonic readings, never consulted again.
                monotonic: Instant::now(),
            })),
        }
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut time = self.inner.lock();
        time.monotonic += by;
        time.utc += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }

    /// Sets the wall clock to `utc` (forwards or backwards); the monotonic
    /// clock does not move.
    pub fn set_utc(&self, utc: DateTime<Utc>) {
        self.inner.lock().utc = utc;
    }
}

impl Clock for ManualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        self.inner.lock().utc
    }

    fn now(&self) -> Instant {
        self.inner.lock().monotonic
    }

    fn max_park(&self) -> Option<Duration> {
        Some(MANUAL_PARK)
    }
}

/// How often a thread blocked on a [`ManualClock`] looks at it again.
const MANUAL_PARK: Duration = Duration::from_millis(2);

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let time = *self.inner.lock();
        f.debug_struct("ManualClock")
            .field("utc", &time.utc)
            .finish_non_exhaustive()
    }
}

/// `time` as the store keeps it: truncated to whole milliseconds, the
/// precision every backend stores times at, so a time handed out reads
/// back equal.
pub(crate) fn storable(time: DateTime<Utc>) -> DateTime<Utc> {
    let millis = time.timestamp_millis();
    DateTime::from_timestamp_millis(millis).unwrap_or(time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn clones_share_time_and_advance_moves_both_clocks() {
        let start = Utc.with_ymd_and_hms(2026, 10, 29, 23, 59, 0).unwrap();
        let clock = ManualClock::new(start);
        let other = clock.clone();
        let before = other.now();
        clock.advance(Duration::from_secs(90));
        assert_eq!(other.now_utc(), start + chrono::Duration::seconds(90));
        assert_eq!(other.now() - before, Duration::from_secs(90));
    }

    #[test]
    fn set_utc_leaves_the_monotonic_clock() {
        let start = Utc.with_ymd_and_hms(2026, 10, 29, 0, 0, 0).unwrap();
        let clock = ManualClock::new(start);
        let before = clock.now();
        let later = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
        clock.set_utc(later);
        assert_eq!(clock.now_utc(), later);
        assert_eq!(clock.now(), before);
    }
}
