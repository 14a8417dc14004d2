//! When expired audit rows are deleted, and which rows readers may show.

use chrono::{DateTime, TimeDelta, Utc};

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
/// the next waits the full interval.
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
/// ```
#[derive(Debug, Clone, Default)]
pub struct RetentionSchedule {
    last_start: Option<DateTime<Utc>>,
}

impl RetentionSchedule {
    /// The shortest time between two runs.
    pub const INTERVAL: TimeDelta = TimeDelta::minutes(5);

    /// Rows deleted per statement.
    pub const BATCH_SIZE: usize = 500;

    /// A schedule that has never run.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether [`start`](Self::start) would begin a run at `now`.
    #[must_use]
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        match self.last_start {
            None => true,
            // A clock stepped back also runs, so a jump cannot stall retention.
            Some(last) => now < last || now - last >= Self::INTERVAL,
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
            cutoff: visible_since(now),
        })
    }
}

/// One retention run, with its cutoff fixed when it started.
#[must_use = "a retention run does nothing unless its batches are deleted"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionRun {
    cutoff: DateTime<Utc>,
}

impl RetentionRun {
    /// Rows older than this (`time < cutoff`) are deleted.
    pub fn cutoff(&self) -> DateTime<Utc> {
        self.cutoff
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
    fn full_batch_continues_short_batch_stops() {
        let run = RetentionSchedule::new().start(noon()).unwrap();
        assert_eq!(run.batch_size(), 500);
        assert_eq!(run.after_batch(500), RetentionStep::Continue);
        assert_eq!(run.after_batch(499), RetentionStep::Stop);
        assert_eq!(run.after_batch(0), RetentionStep::Stop);
    }
}
