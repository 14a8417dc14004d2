//! Retention and visibility, through the public API.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use tessera_audit::*;

fn origin() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 0, 0, 0).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A store simulated over rows aged up to 48 h: every run deletes only rows
    /// older than its cutoff, stops on a short batch with none of them left, and
    /// a reader never shows a row a run would delete.
    #[test]
    fn never_selects_a_row_younger_than_the_cutoff(
        ages in proptest::collection::vec(0i64..48 * 3600, 0..1600),
        steps in proptest::collection::vec(0i64..3600, 1..12),
    ) {
        let mut now = origin() + TimeDelta::hours(48);
        let mut rows: Vec<DateTime<Utc>> = ages.iter().map(|&age| now - TimeDelta::seconds(age)).collect();
        let mut schedule = RetentionSchedule::new();
        let mut last_run: Option<DateTime<Utc>> = None;
        for step in steps {
            now += TimeDelta::seconds(step);
            let Some(run) = schedule.start(now) else {
                prop_assert!(last_run.is_some_and(|last| now - last < RetentionSchedule::INTERVAL));
                continue;
            };
            prop_assert!(last_run.is_none_or(|last| now - last >= RetentionSchedule::INTERVAL));
            last_run = Some(now);
            prop_assert_eq!(run.cutoff(), now - TimeDelta::hours(24));
            loop {
                // DELETE ... WHERE time < cutoff LIMIT batch_size
                let mut deleted = 0;
                rows.retain(|&time| {
                    if deleted < run.batch_size() && run.selects(time) {
                        deleted += 1;
                        false
                    } else {
                        true
                    }
                });
                if run.after_batch(deleted) == RetentionStep::Stop {
                    break;
                }
            }
            for &time in &rows {
                prop_assert!(!run.selects(time), "a run stopped with expired rows left");
                prop_assert!(time >= run.cutoff());
            }
        }
        for &time in &rows {
            let visible = is_visible(time, now);
            prop_assert_eq!(visible, now - time <= TimeDelta::hours(24));
        }
    }

    #[test]
    fn a_run_selects_exactly_the_rows_readers_hide(age in -3600i64..48 * 3600) {
        let now = origin() + TimeDelta::hours(48);
        let time = now - TimeDelta::seconds(age);
        let run = RetentionSchedule::new().start(now).unwrap();
        prop_assert_eq!(run.selects(time), !is_visible(time, now));
        if time >= now - TimeDelta::hours(24) {
            prop_assert!(!run.selects(time));
        }
    }
}

#[test]
fn visibility_at_exactly_24_hours() {
    let now = origin() + TimeDelta::hours(30);
    let exactly = now - TimeDelta::hours(24);
    assert_eq!(visible_since(now), exactly);
    assert!(is_visible(exactly, now));
    assert!(!is_visible(exactly - TimeDelta::nanoseconds(1), now));
    assert_eq!(RETENTION, TimeDelta::hours(24));
}
