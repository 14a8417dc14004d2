//! Recognising a storage provider's refusal, and the daily rows-written
//! allowance.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Days, NaiveDate, NaiveTime, Utc};
use rusqlite::ErrorCode;

/// A host-supplied test for "this SQLite error is my provider refusing a
/// write because an allowance is spent".
///
/// Returning `true` turns the error into `503 storage_quota_exhausted`;
/// `false` leaves it to the store's own rules.
pub type QuotaClassifier = Arc<dyn Fn(&rusqlite::Error) -> bool + Send + Sync>;

/// The next 00:00 UTC strictly after `now`, when daily provider allowances
/// reset.
pub fn next_utc_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    let tomorrow = now
        .date_naive()
        .checked_add_days(Days::new(1))
        .unwrap_or(NaiveDate::MAX);
    tomorrow.and_time(NaiveTime::MIN).and_utc()
}

/// The rules that decide whether a SQLite error is a quota refusal.
#[derive(Clone, Default)]
pub(crate) struct QuotaRules {
    classifier: Option<QuotaClassifier>,
}

impl QuotaRules {
    pub(crate) fn new(classifier: Option<QuotaClassifier>) -> Self {
        Self { classifier }
    }

    /// `refusing` says whether the simulated provider (the write authorizer)
    /// is refusing writes, which makes its `SQLITE_AUTH` a quota refusal.
    pub(crate) fn is_refusal(&self, error: &rusqlite::Error, refusing: bool) -> bool {
        match error.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => return true,
            Some(ErrorCode::AuthorizationForStatementDenied) if refusing => return true,
            _ => {}
        }
        self.classifier
            .as_ref()
            .is_some_and(|classify| classify(error))
    }
}

impl fmt::Debug for QuotaRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaRules")
            .field("classifier", &self.classifier.is_some())
            .finish()
    }
}

/// A configured number of rows that may be written per UTC day, counted in
/// process memory (a restart starts the day's count at zero).
#[derive(Debug, Clone)]
pub(crate) struct DailyAllowance {
    /// Rows per UTC day; 0 turns the allowance off.
    limit: u64,
    day: NaiveDate,
    used: u64,
}

impl DailyAllowance {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            day: NaiveDate::MIN,
            used: 0,
        }
    }

    /// Starts a new day's count when `now` is in a later UTC day. A wall
    /// clock that steps back into an earlier day keeps counting against the
    /// latest day seen, so stepping back and forth never restarts it.
    fn roll(&mut self, now: DateTime<Utc>) {
        let today = now.date_naive();
        if today > self.day {
            self.day = today;
            self.used = 0;
        }
    }

    /// Whether nothing more may be written today.
    pub(crate) fn is_spent(&mut self, now: DateTime<Utc>) -> bool {
        self.roll(now);
        self.limit != 0 && self.used >= self.limit
    }

    /// Whether `rows` more fit in today's allowance.
    pub(crate) fn admits(&mut self, now: DateTime<Utc>, rows: u64) -> bool {
        self.roll(now);
        self.limit == 0 || self.used.saturating_add(rows) <= self.limit
    }

    /// Records rows that were committed.
    pub(crate) fn record(&mut self, now: DateTime<Utc>, rows: u64) {
        self.roll(now);
        self.used = self.used.saturating_add(rows);
    }

    /// Rows written so far today.
    pub(crate) fn used(&mut self, now: DateTime<Utc>) -> u64 {
        self.roll(now);
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

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
    fn allowance_counts_per_utc_day() {
        let mut allowance = DailyAllowance::new(10);
        assert!(allowance.admits(at(29, 10, 0, 0), 10));
        assert!(!allowance.admits(at(29, 10, 0, 0), 11));
        allowance.record(at(29, 10, 0, 0), 10);
        assert!(allowance.is_spent(at(29, 23, 59, 59)));
        assert!(!allowance.is_spent(at(30, 0, 0, 0)));
        assert_eq!(allowance.used(at(30, 0, 0, 0)), 0);
    }

    #[test]
    fn a_clock_stepping_back_a_day_does_not_restart_the_count() {
        let mut allowance = DailyAllowance::new(10);
        allowance.record(at(30, 0, 0, 30), 10);
        assert!(allowance.is_spent(at(29, 23, 59, 50)));
        allowance.record(at(29, 23, 59, 50), 1);
        assert_eq!(allowance.used(at(30, 0, 0, 40)), 11);
        assert!(allowance.is_spent(at(30, 0, 0, 40)));
    }

    #[test]
    fn zero_allowance_is_off() {
        let mut allowance = DailyAllowance::new(0);
        allowance.record(at(29, 10, 0, 0), u64::MAX);
        assert!(!allowance.is_spent(at(29, 10, 0, 0)));
        assert!(allowance.admits(at(29, 10, 0, 0), u64::MAX));
    }

    proptest::proptest! {
        /// Against a model: a transaction is admitted exactly when the day's
        /// committed rows plus its own fit, and a day never exceeds the limit.
        #[test]
        fn allowance_matches_a_per_day_model(
            limit in 0_u64..50,
            steps in proptest::collection::vec((0_u64..20, 0_i64..30_000), 1..60),
        ) {
            let mut allowance = DailyAllowance::new(limit);
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
    }

    #[test]
    fn disk_full_is_a_refusal_and_auth_only_while_refusing() {
        let rules = QuotaRules::default();
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        let auth = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_AUTH),
            None,
        );
        assert!(rules.is_refusal(&full, false));
        assert!(!rules.is_refusal(&auth, false));
        assert!(rules.is_refusal(&auth, true));
        let rules = QuotaRules::new(Some(Arc::new(|e: &rusqlite::Error| {
            e.sqlite_error_code() == Some(ErrorCode::ReadOnly)
        })));
        let read_only = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            None,
        );
        assert!(rules.is_refusal(&read_only, false));
    }
}
