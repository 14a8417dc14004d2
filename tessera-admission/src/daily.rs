//! The daily rows-written allowance: a configured number of rows a store may
//! write per UTC day, and the midnight at which daily allowances reset.

use chrono::{DateTime, Days, NaiveDate, NaiveTime, Utc};

/// The next 00:00 UTC strictly after `now`, when daily allowances (this
/// crate's [`DailyRowAllowance`] and a storage provider's) reset: the
/// `reset_at` of a refusal. Saturates at the last representable day.
#[must_use]
pub fn next_utc_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    let tomorrow = now
        .date_naive()
        .checked_add_days(Days::new(1))
        .unwrap_or(NaiveDate::MAX);
    tomorrow.and_time(NaiveTime::MIN).and_utc()
}

/// A number of rows that may be written per UTC day, counted in memory: a
/// store checks each write transaction with [`admits`](Self::admits) and
/// [`record`](Self::record)s what committed. A restart starts the day's
/// count at zero.
///
/// - A limit of 0 turns it off: everything is admitted, nothing is spent.
/// - The count restarts when `now` falls in a later UTC day than any seen
///   (at [`next_utc_midnight`]).
/// - A wall clock that steps back into an earlier day keeps counting against
///   the latest day seen, so stepping back and forth never restarts it.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use tessera_admission::DailyRowAllowance;
///
/// let mut allowance = DailyRowAllowance::new(10);
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 10, 0, 0).unwrap();
/// assert!(allowance.admits(now, 10));
/// allowance.record(now, 10);
/// assert!(allowance.is_spent(now));
/// let tomorrow = Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap();
/// assert_eq!(allowance.used(tomorrow), 0);
/// ```
#[derive(Debug, Clone)]
pub struct DailyRowAllowance {
    /// Rows per UTC day; 0 turns the allowance off.
    limit: u64,
    /// The latest UTC day seen, which the count is against.
    day: NaiveDate,
    used: u64,
}

impl DailyRowAllowance {
    /// An allowance of `limit` rows per UTC day (0: off), none used yet.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            day: NaiveDate::MIN,
            used: 0,
        }
    }

    /// Rows per UTC day; 0 when off.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Starts a new day's count when `now` is in a later UTC day than any
    /// seen.
    fn roll(&mut self, now: DateTime<Utc>) {
        let today = now.date_naive();
        if today > self.day {
            self.day = today;
            self.used = 0;
        }
    }

    /// Whether nothing more may be written today: on, and the day's count
    /// has reached the limit.
    #[must_use]
    pub fn is_spent(&mut self, now: DateTime<Utc>) -> bool {
        self.roll(now);
        self.limit != 0 && self.used >= self.limit
    }

    /// Whether `rows` more fit in today's allowance (the count plus `rows`
    /// at most the limit); always when off.
    #[must_use]
    pub fn admits(&mut self, now: DateTime<Utc>, rows: u64) -> bool {
        self.roll(now);
        self.limit == 0 || self.used.saturating_add(rows) <= self.limit
    }

    /// Records `rows` that were committed at `now` (saturating).
    pub fn record(&mut self, now: DateTime<Utc>, rows: u64) {
        self.roll(now);
        self.used = self.used.saturating_add(rows);
    }

    /// Rows recorded so far today.
    #[must_use]
    pub fn used(&mut self, now: DateTime<Utc>) -> u64 {
        self.roll(now);
        self.used
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(d: u32, h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, d, h, m, s).unwrap()
    }

    #[test]
    fn next_midnight_is_strictly_after_now() {
        assert_eq!(next_utc_midnight(at(29, 0, 0, 0)), at(30, 0, 0, 0));
        assert_eq!(next_utc_midnight(at(29, 23, 59, 59)), at(30, 0, 0, 0));
        assert_eq!(
            next_utc_midnight(Utc.with_ymd_and_hms(2026, 12, 31, 12, 0, 0).unwrap()),
            Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()
        );
    }

    #[test]
    fn next_midnight_saturates_at_the_last_day() {
        let last = NaiveDate::MAX.and_time(NaiveTime::MIN).and_utc();
        assert_eq!(next_utc_midnight(DateTime::<Utc>::MAX_UTC), last);
    }

    #[test]
    fn allowance_counts_per_utc_day() {
        let mut allowance = DailyRowAllowance::new(10);
        assert_eq!(allowance.limit(), 10);
        assert!(allowance.admits(at(29, 10, 0, 0), 10));
        assert!(!allowance.admits(at(29, 10, 0, 0), 11));
        allowance.record(at(29, 10, 0, 0), 10);
        assert!(allowance.is_spent(at(29, 23, 59, 59)));
        assert!(!allowance.is_spent(at(30, 0, 0, 0)));
        assert_eq!(allowance.used(at(30, 0, 0, 0)), 0);
    }

    #[test]
    fn a_clock_stepping_back_a_day_does_not_restart_the_count() {
        let mut allowance = DailyRowAllowance::new(10);
        allowance.record(at(30, 0, 0, 30), 10);
        assert!(allowance.is_spent(at(29, 23, 59, 50)));
        allowance.record(at(29, 23, 59, 50), 1);
        assert_eq!(allowance.used(at(30, 0, 0, 40)), 11);
        assert!(allowance.is_spent(at(30, 0, 0, 40)));
    }

    #[test]
    fn zero_allowance_is_off() {
        let mut allowance = DailyRowAllowance::new(0);
        allowance.record(at(29, 10, 0, 0), u64::MAX);
        assert!(!allowance.is_spent(at(29, 10, 0, 0)));
        assert!(allowance.admits(at(29, 10, 0, 0), u64::MAX));
    }

    #[test]
    fn counts_saturate() {
        let mut allowance = DailyRowAllowance::new(10);
        allowance.record(at(29, 10, 0, 0), u64::MAX);
        allowance.record(at(29, 10, 0, 0), 1);
        assert_eq!(allowance.used(at(29, 10, 0, 0)), u64::MAX);
        assert!(!allowance.admits(at(29, 10, 0, 0), 0));
        assert!(allowance.is_spent(at(29, 10, 0, 0)));
        // An admission check cannot wrap past the limit either.
        let mut allowance = DailyRowAllowance::new(10);
        allowance.record(at(29, 10, 0, 0), 5);
        assert!(!allowance.admits(at(29, 10, 0, 0), u64::MAX));
    }

    proptest::proptest! {
        /// Against a model: a transaction is admitted exactly when the day's
        /// committed rows plus its own fit, and a day never exceeds the limit.
        #[test]
        fn allowance_matches_a_per_day_model(
            limit in 0_u64..50,
            steps in proptest::collection::vec((0_u64..20, 0_i64..30_000), 1..60),
        ) {
            let mut allowance = DailyRowAllowance::new(limit);
            let mut now = at(29, 0, 0, 0);
            let mut model: std::collections::HashMap<NaiveDate, u64> = Default::default();
            for (rows, advance_seconds) in steps {
                now += chrono::TimeDelta::seconds(advance_seconds);
                let used = model.entry(now.date_naive()).or_default();
                let fits = limit == 0 || *used + rows <= limit;
                proptest::prop_assert_eq!(allowance.admits(now, rows), fits);
                proptest::prop_assert_eq!(allowance.is_spent(now), limit != 0 && *used >= limit);
                if fits {
                    allowance.record(now, rows);
                    *used += rows;
                }
                proptest::prop_assert!(limit == 0 || *used <= limit);
                proptest::prop_assert_eq!(allowance.used(now), *used);
            }
        }

        /// With the clock stepping back and forth, the count is always the
        /// rows recorded since the latest day seen began.
        #[test]
        fn a_wandering_clock_counts_against_the_latest_day(
            steps in proptest::collection::vec((0_u64..5, -100_000_i64..100_000), 1..60),
        ) {
            let mut allowance = DailyRowAllowance::new(1_000);
            let start = at(29, 12, 0, 0);
            let mut latest_day = NaiveDate::MIN;
            let mut since_latest_day = 0;
            for (rows, offset) in steps {
                let now = start + chrono::TimeDelta::seconds(offset);
                if now.date_naive() > latest_day {
                    latest_day = now.date_naive();
                    since_latest_day = 0;
                }
                allowance.record(now, rows);
                since_latest_day += rows;
                proptest::prop_assert_eq!(allowance.used(now), since_latest_day);
            }
        }
    }
}
