//! Per-minute counters for denied, failed and no-op requests, buffered in memory.

use std::{
    collections::{BTreeMap, HashMap, hash_map},
    fmt, mem,
};

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::{Action, Error, Namespace, Outcome, Principal};

/// A whole UTC minute, the time unit of a counter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "DateTime<Utc>", into = "DateTime<Utc>")]
pub struct Minute(i64); // minutes since the Unix epoch

impl Minute {
    /// The minute `time` falls in.
    pub fn containing(time: DateTime<Utc>) -> Self {
        Self(time.timestamp().div_euclid(60))
    }

    /// The minute that starts at `start`, as read back from storage; fails if
    /// `start` is not on a whole minute.
    pub fn from_start(start: DateTime<Utc>) -> Result<Self, Error> {
        let minute = Self::containing(start);
        if minute.start() == start {
            Ok(minute)
        } else {
            Err(Error::UnalignedMinute(start))
        }
    }

    /// The first instant of the minute.
    pub fn start(self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.0 * 60, 0)
            .expect("a minute is only made from a representable time")
    }

    /// The first minute that starts at or after `time`: the one containing
    /// it when `time` is a minute's first instant, else the next. `None`
    /// past the last representable minute. Counters of this minute and
    /// later are inside a window that starts at `time`.
    ///
    /// ```
    /// use chrono::{TimeDelta, TimeZone, Utc};
    /// use tessera_audit::Minute;
    ///
    /// let noon = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
    /// let first = |time| Minute::first_starting_at_or_after(time).unwrap().start();
    /// assert_eq!(first(noon), noon);
    /// assert_eq!(first(noon + TimeDelta::milliseconds(1)), noon + TimeDelta::minutes(1));
    /// ```
    #[must_use]
    pub fn first_starting_at_or_after(time: DateTime<Utc>) -> Option<Self> {
        let containing = Self::containing(time);
        if containing.start() == time {
            return Some(containing);
        }
        let next = Self(containing.0 + 1);
        // Only a representable start makes a minute (see `start`).
        DateTime::from_timestamp(next.0.checked_mul(60)?, 0).map(|_| next)
    }

    /// Whether the minute is over at `now`.
    pub fn has_passed(self, now: DateTime<Utc>) -> bool {
        self < Self::containing(now)
    }

    /// The first instant after the minute, if representable.
    fn end(self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(self.0.checked_add(1)?.checked_mul(60)?, 0)
    }
}

impl fmt::Debug for Minute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Minute({})", self.start().to_rfc3339())
    }
}

impl fmt::Display for Minute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.start().to_rfc3339())
    }
}

impl TryFrom<DateTime<Utc>> for Minute {
    type Error = Error;

    fn try_from(start: DateTime<Utc>) -> Result<Self, Error> {
        Self::from_start(start)
    }
}

impl From<Minute> for DateTime<Utc> {
    fn from(minute: Minute) -> Self {
        minute.start()
    }
}

/// What one counter counts: a (minute, principal, namespace, action, outcome).
///
/// The principal is `None` for a request that never authenticated. Principal
/// identifiers are never empty, so a store may keep `None` as the empty string
/// in a `NOT NULL` column and keep its unique index usable for upserts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CounterKey {
    minute: Minute,
    principal: Option<Principal>,
    namespace: Namespace,
    action: Action,
    outcome: Outcome,
}

impl CounterKey {
    /// The counter for a request at `time`.
    pub fn new(
        time: DateTime<Utc>,
        principal: Option<Principal>,
        namespace: Namespace,
        action: Action,
        outcome: Outcome,
    ) -> Self {
        Self {
            minute: Minute::containing(time),
            principal,
            namespace,
            action,
            outcome,
        }
    }

    /// The minute counted.
    pub fn minute(&self) -> Minute {
        self.minute
    }

    /// Who made the requests, if they authenticated.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }

    /// The namespace the requests named.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// What the requests did.
    pub fn action(&self) -> Action {
        self.action
    }

    /// How they ended.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    fn split(self) -> (Minute, Subject) {
        let Self {
            minute,
            principal,
            namespace,
            action,
            outcome,
        } = self;
        (
            minute,
            Subject {
                principal,
                namespace,
                action,
                outcome,
            },
        )
    }
}

/// A counter key without its minute: the buffer groups counters by minute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Subject {
    principal: Option<Principal>,
    namespace: Namespace,
    action: Action,
    outcome: Outcome,
}

impl Subject {
    fn with_minute(self, minute: Minute) -> CounterKey {
        CounterKey {
            minute,
            principal: self.principal,
            namespace: self.namespace,
            action: self.action,
            outcome: self.outcome,
        }
    }
}

/// A counter and how many requests it counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Counter {
    /// What was counted.
    #[serde(flatten)]
    pub key: CounterKey,
    /// How many times.
    pub count: u64,
}

/// Counters handed out by a [`CounterBuffer`] to be written.
///
/// It is not `Clone`, and reporting it consumes it, so one batch cannot be
/// reported twice. A store adds each count to its row (an upsert that sums),
/// since a later batch may carry the same key again.
#[must_use = "report the batch with `CounterBuffer::written` or `CounterBuffer::failed`; dropping it loses its counts"]
#[derive(Debug)]
pub struct CounterBatch {
    counters: Vec<Counter>,
    total: u64,
}

impl CounterBatch {
    /// The counters to write, each key at most once.
    pub fn counters(&self) -> &[Counter] {
        &self.counters
    }

    /// The sum of the counts.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Counts requests in memory and hands out batches to write.
///
/// A batch is due when a waiting counter's minute has passed, or when
/// [`CounterBuffer::MAX_WAITING`] distinct counters wait; a store also takes
/// everything with [`take_all`](Self::take_all) before an audit read.
///
/// The hand-out protocol:
/// - A count not yet handed out stays in the buffer: nothing drops it.
/// - A handed-out batch is reported exactly once, consuming it:
///   [`written`](Self::written) when it was stored, and it is gone for good;
///   [`failed`](Self::failed) when the write failed, and its counts merge back
///   with whatever arrived meanwhile, to be handed out again later.
/// - After a failure, [`take_due`](Self::take_due) waits
///   [`RETRY_DELAY`](Self::RETRY_DELAY) before handing out again, so a store
///   refusing writes is not asked to write on every request; `take_all` does not
///   wait.
///
/// ```
/// use chrono::{TimeDelta, TimeZone, Utc};
/// use tessera_audit::{Action, CounterBuffer, CounterKey, Namespace, Outcome};
///
/// let mut buffer = CounterBuffer::new();
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 30).unwrap();
/// let key = CounterKey::new(now, None, Namespace::new("main")?, Action::Claim, Outcome::Unauthorized);
/// buffer.increment(key.clone());
/// buffer.increment(key);
/// assert!(!buffer.due(now));
///
/// let later = now + TimeDelta::seconds(30); // 12:01:00, the minute has passed
/// let batch = buffer.take_due(later).expect("due");
/// assert_eq!(batch.total(), 2);
/// buffer.written(batch);
/// assert!(buffer.is_empty());
/// # Ok::<(), tessera_audit::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct CounterBuffer {
    // Ordered by minute so the passed ones split off in O(log m); m, the number
    // of distinct minutes waiting, is normally one or two.
    minutes: BTreeMap<Minute, HashMap<Subject, u64>>,
    waiting: usize,
    total: u64,
    in_flight: usize,
    retry_at: Option<DateTime<Utc>>,
}

impl CounterBuffer {
    /// How many distinct counters may wait before a batch is due.
    pub const MAX_WAITING: usize = 1024;

    /// How long [`take_due`](Self::take_due) waits after a failed write.
    pub const RETRY_DELAY: TimeDelta = TimeDelta::seconds(60);

    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one request.
    pub fn increment(&mut self, key: CounterKey) {
        let (minute, subject) = key.split();
        self.add(minute, subject, 1);
    }

    /// Whether [`take_due`](Self::take_due) would hand out a batch at `now`.
    #[must_use]
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        if self.waiting == 0 || self.retry_at.is_some_and(|retry_at| now < retry_at) {
            return false;
        }
        self.waiting >= Self::MAX_WAITING
            || self
                .minutes
                .keys()
                .next()
                .is_some_and(|oldest| oldest.has_passed(now))
    }

    /// The batch due at `now`, if any: every counter whose minute has passed,
    /// or every counter once [`MAX_WAITING`](Self::MAX_WAITING) wait.
    /// Costs O(k + log m) for k counters handed out.
    pub fn take_due(&mut self, now: DateTime<Utc>) -> Option<CounterBatch> {
        if !self.due(now) {
            return None;
        }
        if self.waiting >= Self::MAX_WAITING {
            return self.take_all();
        }
        let current = self.minutes.split_off(&Minute::containing(now));
        let passed = mem::replace(&mut self.minutes, current);
        Some(self.hand_out(passed))
    }

    /// The batch a counted request writes itself: every waiting counter, once
    /// [`MAX_WAITING`](Self::MAX_WAITING) distinct counters wait (and no
    /// retry delay holds); `None` otherwise. A minute that has passed is
    /// not enough: its counters wait for [`take_due`](Self::take_due), which
    /// a driver calls at [`poll_timeout`](Self::poll_timeout), so a request
    /// that writes nothing never pays for a write but at the bound.
    pub fn take_full(&mut self, now: DateTime<Utc>) -> Option<CounterBatch> {
        let full = self.waiting >= Self::MAX_WAITING
            && self.retry_at.is_none_or(|retry_at| now >= retry_at);
        if full { self.take_all() } else { None }
    }

    /// Every waiting counter, whatever its minute; for a read that must see all
    /// counts. `None` if nothing waits. Costs O(k) for k counters handed out.
    pub fn take_all(&mut self) -> Option<CounterBatch> {
        if self.waiting == 0 {
            return None;
        }
        let all = mem::take(&mut self.minutes);
        Some(self.hand_out(all))
    }

    /// Reports a batch stored: its counts are never handed out again.
    pub fn written(&mut self, batch: CounterBatch) {
        drop(batch);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.retry_at = None;
    }

    /// Reports a batch whose write failed at `now`: its counts merge back into
    /// the buffer, summed with any that arrived meanwhile. Costs O(k) for k
    /// counters in the batch.
    pub fn failed(&mut self, batch: CounterBatch, now: DateTime<Utc>) {
        for Counter { key, count } in batch.counters {
            let (minute, subject) = key.split();
            self.add(minute, subject, count);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.retry_at = Some(
            now.checked_add_signed(Self::RETRY_DELAY)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        );
    }

    /// The earliest time at which [`due`](Self::due) turns true without further
    /// calls (a time already past means due now); `None` if nothing waits.
    /// A driver with a timer flushes then; calling early is a harmless no-op.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<DateTime<Utc>> {
        let oldest = *self.minutes.keys().next()?;
        let natural = if self.waiting >= Self::MAX_WAITING {
            DateTime::<Utc>::MIN_UTC
        } else {
            oldest.end().unwrap_or(DateTime::<Utc>::MAX_UTC)
        };
        Some(
            self.retry_at
                .map_or(natural, |retry_at| natural.max(retry_at)),
        )
    }

    /// How many distinct counters wait (not counting batches handed out).
    pub fn len(&self) -> usize {
        self.waiting
    }

    /// Whether no counter waits.
    pub fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    /// The sum of the waiting counts.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// How many batches are handed out and not yet reported.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn add(&mut self, minute: Minute, subject: Subject, count: u64) {
        match self.minutes.entry(minute).or_default().entry(subject) {
            hash_map::Entry::Occupied(entry) => *entry.into_mut() += count,
            hash_map::Entry::Vacant(entry) => {
                entry.insert(count);
                self.waiting += 1;
            }
        }
        self.total += count;
    }

    fn hand_out(&mut self, minutes: BTreeMap<Minute, HashMap<Subject, u64>>) -> CounterBatch {
        let mut counters = Vec::with_capacity(minutes.values().map(HashMap::len).sum());
        let mut total = 0;
        for (minute, counts) in minutes {
            for (subject, count) in counts {
                total += count;
                counters.push(Counter {
                    key: subject.with_minute(minute),
                    count,
                });
            }
        }
        self.waiting -= counters.len();
        self.total -= total;
        self.in_flight += 1;
        CounterBatch { counters, total }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 29, h, m, s).unwrap()
    }

    fn key(time: DateTime<Utc>, principal: &str) -> CounterKey {
        CounterKey::new(
            time,
            Some(Principal::new(principal).unwrap()),
            Namespace::new("main").unwrap(),
            Action::Claim,
            Outcome::Empty,
        )
    }

    #[test]
    fn minute_boundary() {
        let mut buffer = CounterBuffer::new();
        buffer.increment(key(at(12, 0, 0), "a"));
        let last_instant = at(12, 1, 0) - TimeDelta::nanoseconds(1);
        assert!(!buffer.due(last_instant));
        assert!(buffer.take_due(last_instant).is_none());
        assert_eq!(buffer.poll_timeout(), Some(at(12, 1, 0)));
        assert!(buffer.due(at(12, 1, 0)));
        let batch = buffer.take_due(at(12, 1, 0)).unwrap();
        assert_eq!(batch.counters().len(), 1);
        assert_eq!(batch.counters()[0].key.minute().start(), at(12, 0, 0));
        buffer.written(batch);
        assert_eq!(buffer.poll_timeout(), None);
    }

    #[test]
    fn take_due_leaves_the_current_minute() {
        let mut buffer = CounterBuffer::new();
        buffer.increment(key(at(12, 0, 59), "a"));
        buffer.increment(key(at(12, 1, 0), "a"));
        buffer.increment(key(at(12, 1, 1), "a"));
        let batch = buffer.take_due(at(12, 1, 30)).unwrap();
        assert_eq!(batch.total(), 1);
        assert_eq!(buffer.total(), 2);
        assert_eq!(buffer.len(), 1);
        assert!(!buffer.due(at(12, 1, 30)));
        buffer.written(batch);
    }

    #[test]
    fn the_1024th_distinct_counter_makes_a_batch_due() {
        let mut buffer = CounterBuffer::new();
        let now = at(12, 0, 0);
        for i in 0..1023 {
            buffer.increment(key(now, &format!("p{i}")));
        }
        // More of an existing counter is not a new distinct one.
        buffer.increment(key(now, "p0"));
        assert_eq!(buffer.len(), 1023);
        assert!(!buffer.due(now));
        buffer.increment(key(now, "p1023"));
        assert_eq!(buffer.len(), 1024);
        assert!(buffer.due(now));
        assert!(buffer.poll_timeout().unwrap() <= now);
        let batch = buffer.take_due(now).unwrap();
        assert_eq!(batch.counters().len(), 1024);
        assert_eq!(batch.total(), 1025);
        assert!(buffer.is_empty());
        buffer.written(batch);
    }

    #[test]
    fn a_counted_request_takes_a_batch_only_at_the_bound() {
        let mut buffer = CounterBuffer::new();
        buffer.increment(key(at(12, 0, 0), "a"));
        // The minute has passed: due for maintenance, not for a request.
        assert!(buffer.due(at(12, 1, 0)));
        assert!(buffer.take_full(at(12, 1, 0)).is_none());
        for i in 1..1024 {
            buffer.increment(key(at(12, 1, 0), &format!("p{i}")));
        }
        assert_eq!(buffer.len(), 1024);
        let batch = buffer.take_full(at(12, 1, 0)).unwrap();
        assert_eq!(batch.counters().len(), 1024);
        assert!(buffer.is_empty());
        // A failed write holds the next request's batch back for the delay.
        buffer.failed(batch, at(12, 1, 0));
        assert!(buffer.take_full(at(12, 1, 59)).is_none());
        let batch = buffer.take_full(at(12, 2, 0)).unwrap();
        buffer.written(batch);
    }

    #[test]
    fn failed_batch_merges_back_and_waits_before_retry() {
        let mut buffer = CounterBuffer::new();
        buffer.increment(key(at(12, 0, 0), "a"));
        buffer.increment(key(at(12, 0, 1), "a"));
        let batch = buffer.take_due(at(12, 1, 0)).unwrap();
        assert_eq!(buffer.in_flight(), 1);
        // Arrives while the batch is being written.
        buffer.increment(key(at(12, 0, 59), "a"));
        buffer.failed(batch, at(12, 1, 5));
        assert_eq!(buffer.in_flight(), 0);
        assert_eq!(buffer.len(), 1);
        assert_eq!(buffer.total(), 3);
        assert!(!buffer.due(at(12, 2, 4)));
        assert_eq!(buffer.poll_timeout(), Some(at(12, 2, 5)));
        assert!(buffer.due(at(12, 2, 5)));
        // An audit read does not wait.
        let batch = buffer.take_all().unwrap();
        assert_eq!(batch.counters()[0].count, 3);
        buffer.written(batch);
        assert_eq!(buffer.total(), 0);
    }

    #[test]
    fn a_write_clears_the_retry_delay() {
        let mut buffer = CounterBuffer::new();
        buffer.increment(key(at(12, 0, 0), "a"));
        let batch = buffer.take_all().unwrap();
        buffer.failed(batch, at(12, 0, 1));
        let batch = buffer.take_all().unwrap();
        buffer.written(batch);
        buffer.increment(key(at(12, 0, 2), "a"));
        assert!(buffer.due(at(12, 1, 0)));
    }

    #[test]
    fn first_minute_at_or_after_rounds_a_partial_minute_up() {
        let first = |time| Minute::first_starting_at_or_after(time).map(Minute::start);
        assert_eq!(first(at(12, 0, 0)), Some(at(12, 0, 0)));
        assert_eq!(
            first(at(12, 0, 0) + TimeDelta::nanoseconds(1)),
            Some(at(12, 1, 0))
        );
        assert_eq!(first(at(12, 0, 59)), Some(at(12, 1, 0)));
        let before_epoch = DateTime::from_timestamp(-30, 0).unwrap();
        assert_eq!(first(before_epoch), DateTime::from_timestamp(0, 0));
        assert_eq!(
            first(DateTime::<Utc>::MIN_UTC),
            Some(DateTime::<Utc>::MIN_UTC)
        );
        assert_eq!(first(DateTime::<Utc>::MAX_UTC), None);
    }

    #[test]
    fn minute_reads_back_only_when_aligned() {
        let minute = Minute::containing(at(12, 0, 42));
        assert_eq!(minute.start(), at(12, 0, 0));
        assert_eq!(Minute::from_start(at(12, 0, 0)), Ok(minute));
        assert_eq!(
            Minute::from_start(at(12, 0, 42)),
            Err(Error::UnalignedMinute(at(12, 0, 42)))
        );
        let before_epoch = DateTime::from_timestamp(-1, 0).unwrap();
        assert_eq!(
            Minute::containing(before_epoch).start(),
            DateTime::from_timestamp(-60, 0).unwrap()
        );
    }

    #[test]
    fn counter_serializes_flat_and_reads_back() {
        let counter = Counter {
            key: CounterKey::new(
                at(12, 0, 42),
                None,
                Namespace::new("main").unwrap(),
                Action::Claim,
                Outcome::RateLimited,
            ),
            count: 7,
        };
        let json = serde_json::to_value(&counter).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "minute": "2026-10-29T12:00:00Z",
                "principal": null,
                "namespace": "main",
                "action": "claim",
                "outcome": "rate_limited",
                "count": 7,
            })
        );
        assert_eq!(serde_json::from_value::<Counter>(json).unwrap(), counter);
        let unaligned = serde_json::json!({
            "minute": "2026-10-29T12:00:01Z", "principal": null, "namespace": "main",
            "action": "claim", "outcome": "ok", "count": 1,
        });
        assert!(serde_json::from_value::<Counter>(unaligned).is_err());
    }
}
