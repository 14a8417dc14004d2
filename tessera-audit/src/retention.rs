//! When expired audit rows are deleted, and which rows readers may show.

use chrono::{DateTime, TimeDelta, Utc};

use crate::Minute;

/// How long an audit row or counter is kept.
pub const RETENTION: TimeDelta = TimeDelta::hours(24);

/// The oldest row time a reader may show at `now`: rows at or after it are
/// visible, rows before it are expired and awaiting deletion.
///
/// A row exactly 24 hours old is still visible (and not yet deleted); one
/// nanosecond older and it is hidden and deleted. In SQL: readers filter
/// `time >= cutoff`, retention deletes `time < cutoff`.
pub fn visible_since(now: DateTime<Utc>) -> DateTime<Utc> {
    now.checked_sub_signed(RETENTION)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Whether a reader at `now` may show a row written at `row_time`.
pub fn is_visible(row_time: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    row_time >= visible_since(now)
}

/// Decides when this instance runs retention: at most once every
/// [`INTERVAL`](Self::INTERVAL), deleting expired rows in batches of
/// [`BATCH_SIZE`](Self::BATCH_SIZE).
///
/// The first call to [`start`](Self::start) runs at once, so an instance that is
/// restarted often still cleans up. A run that fails part-way counts as a run:
/// the next waits the full interval. A driver with a timer calls `start` at
/// [`poll_timeout`](Self::poll_timeout).
///
/// A run deletes, each by its own threshold ([`RetentionRun`]): audit rows
/// before the [`cutoff`](RetentionRun::cutoff), counters of minutes before
/// the [`first_visible_minute`](RetentionRun::first_visible_minute), and
/// rows whose purge time has come by the run's
/// [`started_at`](RetentionRun::started_at) (anonymous principals, their keys
/// and limit rows).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use tessera_audit::{RetentionSchedule, RetentionStep};
///
/// let mut schedule = RetentionSchedule::new();
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
/// if let Some(run) = schedule.start(now) {
///     // DELETE ... WHERE rowid IN (SELECT rowid ... WHERE time < ?cutoff LIMIT ?batch_size)
///     for deleted in [500, 500, 17] {
///         match run.after_batch(deleted) {
///             RetentionStep::Continue => continue,
///             RetentionStep::Stop => break,
///         }
///     }
/// }
/// assert!(schedule.start(now).is_none());
/// assert_eq!(schedule.poll_timeout(), Some(now + RetentionSchedule::INTERVAL));
/// ```
#[derive(Debug, Clone)]
pub struct RetentionSchedule {
    last_start: Option<DateTime<Utc>>,
    interval: TimeDelta,
}

impl Default for RetentionSchedule {
    fn default() -> Self {
        Self {
            last_start: None,
            interval: Self::INTERVAL,
        }
    }
}

impl RetentionSchedule {
    /// The shortest time between two runs, unless
    /// [`with_interval`](Self::with_interval) says otherwise.
    pub const INTERVAL: TimeDelta = TimeDelta::minutes(5);

    /// Rows deleted per statement.
    pub const BATCH_SIZE: usize = 500;

    /// A schedule that has never run.
    pub fn new() -> Self {
        Self::default()
    }

    /// A schedule that has never run, with `interval` (not below zero)
    /// between two runs instead of [`INTERVAL`](Self::INTERVAL): for a
    /// test or a chaos run that must see retention at work within seconds.
    #[must_use]
    pub fn with_interval(interval: TimeDelta) -> Self {
        Self {
            last_start: None,
            interval: interval.max(TimeDelta::zero()),
        }
    }

    /// The shortest time between two runs.
    pub fn interval(&self) -> TimeDelta {
        self.interval
    }

    /// Whether [`start`](Self::start) would begin a run at `now`.
    #[must_use]
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        match self.last_start {
            None => true,
            // A clock stepped back also runs, so a jump cannot stall retention.
            Some(last) => now < last || now - last >= self.interval,
        }
    }

    /// Begins a run at `now` if one is due, recording it.
    #[must_use]
    pub fn start(&mut self, now: DateTime<Utc>) -> Option<RetentionRun> {
        if !self.due(now) {
            return None;
        }
        self.last_start = Some(now);
        Some(RetentionRun {
            started_at: now,
            cutoff: visible_since(now),
        })
    }

    /// When the schedule next allows a run, for a driver's timer: before the
    /// first run, [`DateTime::MIN_UTC`] (a time already past: due now, as
    /// [`CounterBuffer::poll_timeout`](crate::CounterBuffer::poll_timeout)
    /// answers); after one, its start plus the [`interval`](Self::interval).
    /// `None` if that lies past the end of `DateTime`, when no run comes due
    /// unless the clock steps back.
    ///
    /// A clock stepped back before the last start makes a run due sooner
    /// ([`due`](Self::due) judges each `now`). Calling
    /// [`start`](Self::start) before this time is a harmless no-op.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<DateTime<Utc>> {
        match self.last_start {
            None => Some(DateTime::<Utc>::MIN_UTC),
            Some(last) => last.checked_add_signed(self.interval),
        }
    }

    /// When the latest run started; `None` before the first.
    pub fn last_start(&self) -> Option<DateTime<Utc>> {
        self.last_start
    }
}

/// One retention run, with its thresholds fixed when it started.
///
/// Each kind of row has its own threshold, and a backend deletes by the one
/// its table needs:
///
/// | rows | deleted when | threshold |
/// | --- | --- | --- |
/// | audit events | `time < cutoff` | [`cutoff`](Self::cutoff) |
/// | counters | `minute < first visible minute` | [`first_visible_minute`](Self::first_visible_minute) |
/// | anonymous principals, keys, limit rows | `purge_at <= started_at` | [`started_at`](Self::started_at) |
#[must_use = "a retention run does nothing unless its batches are deleted"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionRun {
    started_at: DateTime<Utc>,
    cutoff: DateTime<Utc>,
}

impl RetentionRun {
    /// Rows older than this (`time < cutoff`) are deleted: audit events.
    pub fn cutoff(&self) -> DateTime<Utc> {
        self.cutoff
    }

    /// The `now` the run started at. Rows with a purge time are deleted
    /// once it has come (`purge_at <= started_at`): anonymous principals,
    /// their keys and their limit rows.
    pub fn started_at(&self) -> DateTime<Utc> {
        self.started_at
    }

    /// Whether this run deletes a row due for purging at `purge_at`.
    #[must_use]
    pub fn is_purge_due(&self, purge_at: DateTime<Utc>) -> bool {
        purge_at <= self.started_at
    }

    /// The first counter minute inside the window that starts at the
    /// [`cutoff`](Self::cutoff): the minute starting at the cutoff, or the
    /// next one when the cutoff falls inside a minute. Counters of earlier
    /// minutes (`minute < first_visible_minute`) are deleted, so a minute
    /// only partly inside the window is deleted, and hidden from readers
    /// that filter with [`Minute::first_starting_at_or_after`] of
    /// [`visible_since`].
    pub fn first_visible_minute(&self) -> Minute {
        Minute::first_starting_at_or_after(self.cutoff)
            .expect("a cutoff is a day before the end of time, so a minute starts after it")
    }

    /// Whether this run deletes the counters of `minute`.
    #[must_use]
    pub fn selects_minute(&self, minute: Minute) -> bool {
        minute < self.first_visible_minute()
    }

    /// Rows to delete per statement (`LIMIT`).
    pub fn batch_size(&self) -> usize {
        RetentionSchedule::BATCH_SIZE
    }

    /// Whether this run deletes a row written at `row_time`; the predicate a
    /// store's `DELETE` expresses.
    pub fn selects(&self, row_time: DateTime<Utc>) -> bool {
        row_time < self.cutoff
    }

    /// What to do after a batch deleted `deleted` rows: a full batch may have
    /// left more behind, a short one means none are left.
    #[must_use]
    pub fn after_batch(&self, deleted: usize) -> RetentionStep {
        if deleted >= self.batch_size() {
            RetentionStep::Continue
        } else {
            RetentionStep::Stop
        }
    }
}

/// Whether a retention run deletes another batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetentionStep {
    /// The last batch was full: delete another.
    Continue,
    /// The last batch was short: the run is over.
    Stop,
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn noon() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
    }

    #[test]
    fn five_minute_gate() {
        let mut schedule = RetentionSchedule::new();
        assert!(schedule.due(noon()));
        assert!(schedule.start(noon()).is_some());
        let almost = noon() + TimeDelta::minutes(5) - TimeDelta::nanoseconds(1);
        assert!(!schedule.due(almost));
        assert!(schedule.start(almost).is_none());
        assert!(schedule.start(noon() + TimeDelta::minutes(5)).is_some());
        assert!(schedule.start(noon() + TimeDelta::minutes(6)).is_none());
    }

    #[test]
    fn clock_stepping_back_runs() {
        let mut schedule = RetentionSchedule::new();
        let _ = schedule.start(noon());
        assert!(schedule.start(noon() - TimeDelta::hours(1)).is_some());
    }

    #[test]
    fn exactly_24_hours_is_kept_and_visible() {
        let run = RetentionSchedule::new().start(noon()).unwrap();
        let exactly = noon() - TimeDelta::hours(24);
        let older = exactly - TimeDelta::nanoseconds(1);
        assert_eq!(run.cutoff(), exactly);
        assert!(!run.selects(exactly));
        assert!(is_visible(exactly, noon()));
        assert!(run.selects(older));
        assert!(!is_visible(older, noon()));
    }

    #[test]
    fn poll_timeout_is_due_now_then_each_interval() {
        let mut schedule = RetentionSchedule::new();
        assert_eq!(schedule.last_start(), None);
        assert_eq!(schedule.poll_timeout(), Some(DateTime::<Utc>::MIN_UTC));
        let _ = schedule.start(noon());
        assert_eq!(schedule.last_start(), Some(noon()));
        let next = noon() + TimeDelta::minutes(5);
        assert_eq!(schedule.poll_timeout(), Some(next));
        assert!(!schedule.due(next - TimeDelta::nanoseconds(1)));
        assert!(schedule.due(next));
        // A run that is never due again without the clock stepping back.
        let mut late = RetentionSchedule::new();
        let _ = late.start(DateTime::<Utc>::MAX_UTC - TimeDelta::minutes(1));
        assert_eq!(late.poll_timeout(), None);
    }

    #[test]
    fn thresholds_of_each_kind_of_row() {
        let now = noon() + TimeDelta::seconds(30);
        let run = RetentionSchedule::new().start(now).unwrap();
        assert_eq!(run.started_at(), now);
        assert!(run.is_purge_due(now));
        assert!(run.is_purge_due(now - TimeDelta::nanoseconds(1)));
        assert!(!run.is_purge_due(now + TimeDelta::nanoseconds(1)));
        // The cutoff is 12:00:30 the day before: the minute 12:00 is partly
        // outside the window, so 12:01 is the first visible one.
        let yesterday = noon() - TimeDelta::hours(24);
        assert_eq!(run.cutoff(), now - TimeDelta::hours(24));
        assert_eq!(
            run.first_visible_minute().start(),
            yesterday + TimeDelta::minutes(1)
        );
        assert!(run.selects_minute(Minute::containing(yesterday)));
        assert!(!run.selects_minute(Minute::containing(yesterday + TimeDelta::minutes(1))));
        // On a whole minute, that minute is the first visible one.
        let on_minute = RetentionSchedule::new().start(noon()).unwrap();
        assert_eq!(on_minute.first_visible_minute().start(), yesterday);
        assert!(!on_minute.selects_minute(Minute::containing(yesterday)));
        assert!(on_minute.selects_minute(Minute::containing(yesterday - TimeDelta::seconds(1))));
    }

    #[test]
    fn a_millisecond_past_the_minute_skips_to_the_next() {
        let just_past = noon() + TimeDelta::hours(24) + TimeDelta::milliseconds(1);
        let run = RetentionSchedule::new().start(just_past).unwrap();
        assert_eq!(
            run.first_visible_minute().start(),
            noon() + TimeDelta::minutes(1)
        );
    }

    #[test]
    fn full_batch_continues_short_batch_stops() {
        let run = RetentionSchedule::new().start(noon()).unwrap();
        assert_eq!(run.batch_size(), 500);
        assert_eq!(run.after_batch(500), RetentionStep::Continue);
        assert_eq!(run.after_batch(499), RetentionStep::Stop);
        assert_eq!(run.after_batch(0), RetentionStep::Stop);
    }
}
