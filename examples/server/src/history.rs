//! The last hour, minute by minute, in memory: what the board's charts
//! draw. Nothing here reads or writes storage.
//!
//! Three inputs feed it, each with the time it happened: a claim's wait
//! for admission and the concurrency limit it met ([`History::claim`]),
//! a namespace's health snapshot whenever the server holds one
//! ([`History::snapshot`]: served to a page, or found in the store's
//! cache by the server's sampler), and the limit alone
//! ([`History::limit`]). Each minute keeps a histogram of claim waits
//! (fixed buckets, so a claim costs O(1)), the last limit seen, and the
//! last attempts-per-state of each namespace seen. Done and failed per
//! minute are the differences of those counts between two minutes in a
//! row. At most [`MINUTES`] minutes and [`MAX_NAMESPACES`] namespaces a
//! minute are kept, so its memory is bounded.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tessera_store::{HealthSnapshot, Namespace, StateCounts};

/// The minutes kept: the last hour.
pub(crate) const MINUTES: usize = 60;

/// The most namespaces one minute keeps counts of.
pub(crate) const MAX_NAMESPACES: usize = 64;

/// The upper bounds of the claim-wait buckets, in milliseconds; a wait
/// past the last falls in one more bucket.
const WAIT_BOUNDS_MS: [u64; 16] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000,
];

/// One minute's record.
#[derive(Debug, Clone)]
struct Minute {
    start: DateTime<Utc>,
    waits: [u64; WAIT_BOUNDS_MS.len() + 1],
    limit: Option<u32>,
    counts: BTreeMap<Namespace, StateCounts>,
}

impl Minute {
    fn new(start: DateTime<Utc>) -> Self {
        Self {
            start,
            waits: [0; WAIT_BOUNDS_MS.len() + 1],
            limit: None,
            counts: BTreeMap::new(),
        }
    }

    /// The wait at quantile `q` (0 to 1), as its bucket's upper bound in
    /// milliseconds; `None` when no claim was recorded.
    fn wait_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.waits.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in self.waits.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let last = WAIT_BOUNDS_MS[WAIT_BOUNDS_MS.len() - 1];
                return Some(WAIT_BOUNDS_MS.get(bucket).copied().unwrap_or(last));
            }
        }
        None
    }
}

/// The last hour of claims, limits and each namespace's counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    minutes: VecDeque<Minute>,
}

/// What the charts draw for one namespace: one entry per minute of the
/// last hour, oldest first, `None` where nothing was recorded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    /// Each minute's start.
    pub(crate) minutes: Vec<DateTime<Utc>>,
    /// Attempts that reached done in the minute.
    pub(crate) done: Vec<Option<u64>>,
    /// Attempts that reached failed or discarded in the minute.
    pub(crate) failed: Vec<Option<u64>>,
    /// Attempts per state at the minute's last snapshot.
    pub(crate) counts: Vec<Option<StateCounts>>,
    /// The median claim wait, in milliseconds (a bucket's bound).
    pub(crate) wait_p50: Vec<Option<u64>>,
    /// The 99th percentile claim wait, in milliseconds (a bucket's bound).
    pub(crate) wait_p99: Vec<Option<u64>>,
    /// The concurrency limit last seen in the minute.
    pub(crate) limit: Vec<Option<u32>>,
}

/// The minute `at` falls in.
fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

impl History {
    /// The record of the minute of `now`, made if new; minutes older than
    /// the hour are dropped. A time before the newest minute (another
    /// clock's) counts in the newest.
    fn minute(&mut self, now: DateTime<Utc>) -> &mut Minute {
        let start = minute_of(now);
        let newest = self.minutes.back().map(|minute| minute.start);
        if newest.is_none_or(|newest| start > newest) {
            self.minutes.push_back(Minute::new(start));
            let oldest = start - TimeDelta::minutes(MINUTES as i64 - 1);
            while self
                .minutes
                .front()
                .is_some_and(|minute| minute.start < oldest)
            {
                self.minutes.pop_front();
            }
        }
        self.minutes.back_mut().expect("a minute was just made")
    }

    /// A claim that waited `waited` for admission under a concurrency
    /// limit of `limit`, answered at `now`.
    pub(crate) fn claim(&mut self, now: DateTime<Utc>, waited: Duration, limit: u32) {
        let minute = self.minute(now);
        let waited = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        let bucket = WAIT_BOUNDS_MS
            .iter()
            .position(|bound| waited <= *bound)
            .unwrap_or(WAIT_BOUNDS_MS.len());
        minute.waits[bucket] += 1;
        minute.limit = Some(limit);
    }

    /// The concurrency limit as it stands at `now`.
    pub(crate) fn limit(&mut self, now: DateTime<Utc>, limit: u32) {
        self.minute(now).limit = Some(limit);
    }

    /// A namespace's health snapshot, held at `now`.
    pub(crate) fn snapshot(&mut self, now: DateTime<Utc>, snapshot: &HealthSnapshot) {
        let minute = self.minute(now);
        if minute.counts.len() < MAX_NAMESPACES || minute.counts.contains_key(&snapshot.namespace) {
            minute
                .counts
                .insert(snapshot.namespace.clone(), snapshot.attempts);
        }
    }

    /// The last hour before `now` for `namespace`.
    pub(crate) fn series(&self, namespace: &Namespace, now: DateTime<Utc>) -> Series {
        let last = minute_of(now);
        let minutes: Vec<DateTime<Utc>> = (0..MINUTES)
            .rev()
            .map(|back| last - TimeDelta::minutes(back as i64))
            .collect();
        let record = |start: DateTime<Utc>| self.minutes.iter().find(|m| m.start == start);
        let counts: Vec<Option<StateCounts>> = minutes
            .iter()
            .map(|start| record(*start).and_then(|m| m.counts.get(namespace).copied()))
            .collect();
        // The minute before the first shown, for the first difference.
        let before = record(minutes[0] - TimeDelta::minutes(1))
            .and_then(|m| m.counts.get(namespace).copied());
        let change = |field: fn(&StateCounts) -> u64| -> Vec<Option<u64>> {
            let mut previous = before;
            counts
                .iter()
                .map(|now| {
                    let changed = match (previous, now) {
                        // A purge can lower a count: no figure then.
                        (Some(then), Some(now)) => field(now).checked_sub(field(&then)),
                        _ => None,
                    };
                    previous = *now;
                    changed
                })
                .collect()
        };
        Series {
            done: change(|counts| counts.done),
            failed: change(|counts| counts.failed + counts.discarded),
            wait_p50: minutes
                .iter()
                .map(|start| record(*start).and_then(|m| m.wait_quantile(0.5)))
                .collect(),
            wait_p99: minutes
                .iter()
                .map(|start| record(*start).and_then(|m| m.wait_quantile(0.99)))
                .collect(),
            limit: minutes
                .iter()
                .map(|start| record(*start).and_then(|m| m.limit))
                .collect(),
            counts,
            minutes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn snapshot(namespace: &str, done: u64, failed: u64, ready: u64) -> HealthSnapshot {
        HealthSnapshot {
            namespace: Namespace::parse(namespace).unwrap(),
            taken_at: at("2026-12-07T12:00:00Z"),
            attempts: StateCounts {
                done,
                failed,
                ready,
                ..StateCounts::default()
            },
            expired_leases: 0,
            queues: Vec::new(),
            depths: Vec::new(),
        }
    }

    #[test]
    fn done_and_failed_per_minute_are_differences_of_minutes_in_a_row() {
        let mut history = History::default();
        history.snapshot(at("2026-12-07T12:00:10Z"), &snapshot("renders", 10, 1, 5));
        // The minute's last snapshot is the one kept.
        history.snapshot(at("2026-12-07T12:00:50Z"), &snapshot("renders", 12, 1, 4));
        history.snapshot(at("2026-12-07T12:01:30Z"), &snapshot("renders", 20, 3, 2));
        // A minute nobody watched, then two more.
        history.snapshot(at("2026-12-07T12:03:00Z"), &snapshot("renders", 30, 3, 0));
        history.snapshot(at("2026-12-07T12:04:00Z"), &snapshot("renders", 31, 3, 0));
        history.snapshot(at("2026-12-07T12:04:00Z"), &snapshot("other", 99, 9, 9));
        let series = history.series(
            &Namespace::parse("renders").unwrap(),
            at("2026-12-07T12:04:59Z"),
        );
        assert_eq!(series.minutes.len(), MINUTES);
        assert_eq!(series.minutes[MINUTES - 1], at("2026-12-07T12:04:00Z"));
        let last = |values: &[Option<u64>]| values[MINUTES - 5..].to_vec();
        assert_eq!(last(&series.done), [None, Some(8), None, None, Some(1)]);
        assert_eq!(last(&series.failed), [None, Some(2), None, None, Some(0)]);
        let ready: Vec<Option<u64>> = series.counts[MINUTES - 5..]
            .iter()
            .map(|counts| counts.map(|counts| counts.ready))
            .collect();
        assert_eq!(ready, [Some(4), Some(2), None, Some(0), Some(0)]);
    }

    #[test]
    fn claim_waits_give_their_percentiles_and_the_limit_its_last_value() {
        let mut history = History::default();
        let minute = at("2026-12-07T12:00:00Z");
        for n in 0..98 {
            history.claim(minute, Duration::from_millis(n % 3), 32);
        }
        history.claim(minute, Duration::from_millis(150), 32);
        history.claim(minute, Duration::from_secs(90), 16);
        let series = history.series(&Namespace::parse("renders").unwrap(), minute);
        let last = MINUTES - 1;
        assert_eq!(series.wait_p50[last], Some(1));
        assert_eq!(series.wait_p99[last], Some(200));
        assert_eq!(series.limit[last], Some(16));
        assert_eq!(series.wait_p50[last - 1], None);
        history.limit(at("2026-12-07T12:01:00Z"), 8);
        let series = history.series(
            &Namespace::parse("renders").unwrap(),
            at("2026-12-07T12:01:00Z"),
        );
        assert_eq!(series.limit[MINUTES - 1], Some(8));
        assert_eq!(series.wait_p99[MINUTES - 1], None);
    }

    #[test]
    fn it_keeps_an_hour_and_a_bounded_number_of_namespaces() {
        let mut history = History::default();
        let start = at("2026-12-07T12:00:00Z");
        for minute in 0..200 {
            history.limit(start + TimeDelta::minutes(minute), 1);
        }
        assert_eq!(history.minutes.len(), MINUTES);
        for n in 0..(MAX_NAMESPACES + 10) {
            history.snapshot(
                start + TimeDelta::minutes(199),
                &snapshot(&format!("ns{n}"), 0, 0, 0),
            );
        }
        assert_eq!(history.minutes.back().unwrap().counts.len(), MAX_NAMESPACES);
        // A time behind the newest minute counts in the newest.
        history.limit(start, 5);
        assert_eq!(history.minutes.back().unwrap().limit, Some(5));
        assert_eq!(history.minutes.len(), MINUTES);
    }
}
