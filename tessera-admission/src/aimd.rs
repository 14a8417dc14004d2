//! The concurrency limit: additive increase, multiplicative decrease, driven
//! by an exponentially weighted average of service time.
//!
//! Time is the controller's: nanoseconds since it was made (see
//! [`Admission`](crate::Admission)), so a tick is one integer comparison.

use std::time::Duration;

use crate::AdmissionConfig;
use crate::admission::nanos;

/// Adjusts the limit at most once per target interval.
#[derive(Debug, Clone)]
pub(crate) struct Aimd {
    limit: u32,
    min: u32,
    max: u32,
    /// The service time to stay under, in seconds.
    target: f64,
    /// The length of an interval: the target, in nanoseconds.
    interval: u64,
    weight: f64,
    /// Seconds; `None` until the first sample.
    average: Option<f64>,
    /// Nanoseconds on the controller's clock.
    interval_start: u64,
    /// A claim was released since the last adjustment: the average carries
    /// evidence about this interval.
    released: bool,
    /// Demand reached the limit since the last adjustment.
    saturated: bool,
}

impl Aimd {
    /// Starts its first interval at `now`, nanoseconds on the controller's
    /// clock.
    pub(crate) fn new(config: &AdmissionConfig, now: u64) -> Self {
        Self {
            limit: config.initial_concurrency,
            min: config.min_concurrency,
            max: config.max_concurrency,
            target: config.target.as_secs_f64(),
            interval: nanos(config.target),
            weight: config.ewma_weight,
            average: None,
            interval_start: now,
            released: false,
            saturated: false,
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    pub(crate) fn average(&self) -> Option<Duration> {
        // Saturates: an average past `Duration::MAX` still reads as slow.
        self.average
            .map(|seconds| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
    }

    /// Seconds; the target until the first sample.
    pub(crate) fn service_estimate(&self) -> f64 {
        self.average.unwrap_or(self.target)
    }

    /// Feeds one service time, in seconds, into the average.
    pub(crate) fn record(&mut self, sample: f64) {
        self.average = Some(match self.average {
            None => sample,
            Some(average) => average + self.weight * (sample - average),
        });
        self.released = true;
    }

    /// Notes that in-flight reached the limit or a claim had to wait.
    pub(crate) fn saturate(&mut self) {
        self.saturated = true;
    }

    /// Adjusts the limit if a whole interval has passed since the last
    /// adjustment. `busy`: demand is at the limit right now, so the next
    /// interval starts saturated. `now` is nanoseconds on the controller's
    /// clock.
    pub(crate) fn tick(&mut self, now: u64, busy: bool) {
        if now.saturating_sub(self.interval_start) < self.interval {
            return;
        }
        // An interval in which nothing finished carries no evidence either way.
        if let Some(average) = self.average.filter(|_| self.released) {
            if average > self.target {
                let reduced = (u64::from(self.limit) * 7 / 10) as u32;
                self.limit = reduced.max(self.min);
            } else if self.saturated {
                self.limit = self.limit.saturating_add(1).min(self.max);
            }
        }
        self.interval_start = now;
        self.released = false;
        self.saturated = busy;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A controller and the start of its clock, which need not be zero.
    fn aimd(initial: u32) -> (Aimd, u64) {
        let now = 1_000;
        let config = AdmissionConfig {
            initial_concurrency: initial,
            max_concurrency: 40,
            min_concurrency: 2,
            ewma_weight: 0.5,
            ..AdmissionConfig::default()
        };
        (Aimd::new(&config, now), now)
    }

    /// Half a second, in nanoseconds: the default target.
    const HALF: u64 = 500_000_000;

    #[test]
    fn the_average_starts_at_the_first_sample_and_moves_by_the_weight() {
        let (mut aimd, _) = aimd(32);
        assert_eq!(aimd.average(), None);
        aimd.record(2.0);
        assert_eq!(aimd.average(), Some(Duration::from_secs(2)));
        aimd.record(1.0);
        assert_eq!(aimd.average(), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn an_average_past_the_longest_duration_saturates() {
        // Instants may span more than `Duration::MAX` seconds once rounded to
        // a float; reading the average back must not panic.
        let (mut aimd, _) = aimd(32);
        aimd.record(Duration::MAX.as_secs_f64());
        assert_eq!(aimd.average(), Some(Duration::MAX));
    }

    #[test]
    fn decreases_by_thirty_percent_floored_and_never_below_the_minimum() {
        let (mut aimd, start) = aimd(10);
        let mut now = start;
        for expected in [7, 4, 2, 2] {
            aimd.record(1.0);
            now += HALF;
            aimd.tick(now, false);
            assert_eq!(aimd.limit(), expected);
        }
    }

    #[test]
    fn increases_by_one_only_when_saturated_and_never_above_the_maximum() {
        let (mut aimd, start) = aimd(39);
        aimd.record(0.01);
        aimd.tick(start + HALF, false);
        assert_eq!(aimd.limit(), 39, "healthy but unsaturated: unchanged");
        for step in 2..5 {
            aimd.saturate();
            aimd.record(0.01);
            aimd.tick(start + HALF * step, false);
        }
        assert_eq!(aimd.limit(), 40);
    }

    #[test]
    fn an_interval_without_releases_changes_nothing() {
        let (mut aimd, start) = aimd(10);
        aimd.record(1.0);
        aimd.tick(start + HALF, false);
        assert_eq!(aimd.limit(), 7);
        aimd.tick(start + HALF * 2, true);
        assert_eq!(aimd.limit(), 7);
    }

    #[test]
    fn adjusts_at_most_once_per_interval() {
        let (mut aimd, start) = aimd(20);
        aimd.record(1.0);
        aimd.tick(start + HALF, false);
        aimd.record(1.0);
        aimd.tick(start + HALF + HALF / 2, false);
        assert_eq!(aimd.limit(), 14);
    }
}
