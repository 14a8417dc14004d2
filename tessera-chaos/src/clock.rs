//! The clocks of a chaos run: the machine's monotonic clock, which every
//! process shares and which orders the history, and a store clock skewed
//! by a fixed offset per process.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use rustix::time::{ClockId, clock_gettime};
use tessera_store::Clock;

/// The machine's monotonic clock in nanoseconds (`CLOCK_MONOTONIC`): one
/// clock for every process of the machine, unlike [`Instant`], whose
/// readings mean nothing outside their process.
pub fn monotonic_nanos() -> u64 {
    let now = clock_gettime(ClockId::Monotonic);
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds * 1_000_000_000 + nanos
}

/// The system's wall clock moved by a fixed offset: one process's view of
/// time when clocks between processes disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkewedClock {
    offset: TimeDelta,
}

impl SkewedClock {
    /// A clock `offset_millis` ahead of the system's (behind if negative).
    pub fn new(offset_millis: i64) -> Self {
        Self {
            offset: TimeDelta::milliseconds(offset_millis),
        }
    }

    /// How far it is ahead of the system's clock.
    pub fn offset(&self) -> TimeDelta {
        self.offset
    }
}

impl Clock for SkewedClock {
    fn now_utc(&self) -> DateTime<Utc> {
        Utc::now() + self.offset
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Sleeps `millis` milliseconds: for worker pacing, never for a test's
/// verdict.
pub fn pause(millis: u64) {
    std::thread::sleep(Duration::from_millis(millis));
}
