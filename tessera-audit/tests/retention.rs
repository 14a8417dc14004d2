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

/// A schedule driven by a wandering clock: `poll_timeout` is exactly when
/// `due` turns true for any `now` not before the last start.
#[derive(Debug, Clone)]
enum Step {
    Advance(i64),
    Rewind(i64),
    Start,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0i64..400).prop_map(Step::Advance),
        1 => (0i64..400).prop_map(Step::Rewind),
        3 => Just(Step::Start),
    ]
}

proptest! {
    #[test]
    fn poll_timeout_says_when_a_run_is_next_due(
        steps in proptest::collection::vec(step(), 1..40),
        probe in -600i64..600,
    ) {
        let mut schedule = RetentionSchedule::new();
        let mut now = origin();
        for step in steps {
            match step {
                Step::Advance(seconds) => now += TimeDelta::seconds(seconds),
                Step::Rewind(seconds) => now -= TimeDelta::seconds(seconds),
                Step::Start => {
                    let due = schedule.due(now);
                    let run = schedule.start(now);
                    prop_assert_eq!(due, run.is_some());
                    if let Some(run) = run {
                        prop_assert_eq!(run.started_at(), now);
                        prop_assert_eq!(schedule.last_start(), Some(now));
                    }
                }
            }
            let timeout = schedule.poll_timeout().expect("never near the end of time");
            let at = now + TimeDelta::seconds(probe);
            match schedule.last_start() {
                None => prop_assert!(schedule.due(at) && timeout <= at),
                Some(last) if at >= last => prop_assert_eq!(schedule.due(at), at >= timeout),
                // A clock stepped back before the last start runs at once.
                Some(_) => prop_assert!(schedule.due(at)),
            }
        }
    }

    /// Counters a run deletes are exactly those of minutes not wholly inside
    /// the window readers show, so a counter is never both kept and hidden.
    #[test]
    fn counters_are_deleted_exactly_when_their_minute_leaves_the_window(
        now_millis in 0i64..10 * 24 * 3_600_000,
        minute_offset in -3i64..3,
    ) {
        let now = origin() + TimeDelta::milliseconds(now_millis);
        let run = RetentionSchedule::new().start(now).unwrap();
        let cutoff = run.cutoff();
        let minute = Minute::containing(cutoff + TimeDelta::minutes(minute_offset));
        let wholly_inside = minute.start() >= cutoff;
        prop_assert_eq!(run.selects_minute(minute), !wholly_inside);
        prop_assert_eq!(
            Some(run.first_visible_minute()),
            Minute::first_starting_at_or_after(visible_since(now))
        );
        // The store's millisecond arithmetic, for times at whole milliseconds.
        let millis = cutoff.timestamp_millis();
        let stored = millis.div_euclid(60_000) + i64::from(millis.rem_euclid(60_000) != 0);
        prop_assert_eq!(run.first_visible_minute().start().timestamp_millis() / 60_000, stored);
    }
}
