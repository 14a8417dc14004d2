//! Periodic schedules: when a cron schedule is due, and the catch-up rule.
//!
//! A schedule fires a run-at by enqueueing its task and inserting
//! `(schedule, run_at)` into a unique index in the same transaction, so any
//! number of schedulers may race: the first insert wins, every other one
//! meets the index and writes nothing. Each scheduler asks [`CronSchedule::due`]
//! with the last run-at the store has fired.
//!
//! **Catch-up:** after downtime a schedule fires once, for the latest
//! run-at that has passed, never once per missed tick. The run-ats skipped
//! on the way are gone; the next fire is the next occurrence after now.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError, Rule};
use crate::name::{ScheduleName, TaskId};

/// A cron expression (five fields, minutes to weekdays; six with a leading
/// seconds field; or `@hourly` and the like) evaluated in a named IANA time
/// zone.
///
/// Run-ats are whole seconds: the times asked about are read to the second
/// below, so a schedule has at most one run-at a second, whatever its
/// expression (`* * * * * *` is the most frequent there is).
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "ScheduleText", into = "ScheduleText")]
pub struct CronSchedule {
    text: ScheduleText,
    zone: Tz,
    cron: Cron,
}

/// A [`CronSchedule`] as written: its expression and time zone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleText {
    /// The cron expression, e.g. `*/5 * * * *`.
    pub cron: String,
    /// The IANA time zone it is read in, e.g. `Europe/Stockholm` or `UTC`.
    pub zone: String,
}

impl CronSchedule {
    /// The longest expression accepted, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Parses `cron` in `zone`.
    ///
    /// ```
    /// use tessera_lease::CronSchedule;
    /// let nightly = CronSchedule::parse("30 2 * * *", "Europe/Stockholm")?;
    /// let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    /// // 02:30 in Stockholm is 01:30 UTC in winter.
    /// assert_eq!(nightly.next_after(at("2026-12-02T12:00:00Z")), Some(at("2026-12-03T01:30:00Z")));
    /// assert!(CronSchedule::parse("61 * * * *", "UTC").is_err());
    /// assert!(CronSchedule::parse("* * * * *", "Mars/Olympus").is_err());
    /// # Ok::<(), tessera_lease::LeaseError>(())
    /// ```
    pub fn parse(cron: &str, zone: &str) -> Result<Self, LeaseError> {
        Self::try_from(ScheduleText {
            cron: cron.to_owned(),
            zone: zone.to_owned(),
        })
    }

    /// The expression as written.
    pub fn cron(&self) -> &str {
        &self.text.cron
    }

    /// The time zone's IANA name.
    pub fn zone(&self) -> &str {
        &self.text.zone
    }

    /// The first run-at strictly after `time`; `None` if the expression
    /// never matches again. A whole second.
    pub fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Run-ats are whole seconds, so the first one after the second
        // `time` falls in is the first one after `time`.
        self.cron
            .find_next_occurrence(&whole_second(time).with_timezone(&self.zone), false)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    }

    /// The latest run-at at or before `time`. A whole second.
    pub fn latest_at_or_before(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&whole_second(time).with_timezone(&self.zone), true)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    }

    /// The run-at to fire at `now`, given the last one fired (or, before the
    /// first fire, when the schedule was created): the latest run-at in
    /// `(since, now]`, or `None` when none has passed. Missed run-ats
    /// collapse into this one (the catch-up rule of the module docs).
    ///
    /// ```
    /// use tessera_lease::CronSchedule;
    /// let hourly = CronSchedule::parse("0 * * * *", "UTC")?;
    /// let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    /// // Down from 10:00 to 13:20: 11:00, 12:00 and 13:00 were missed; 13:00 fires once.
    /// let last = at("2026-12-02T10:00:00Z");
    /// assert_eq!(hourly.due(last, at("2026-12-02T13:20:00Z")), Some(at("2026-12-02T13:00:00Z")));
    /// assert_eq!(hourly.due(at("2026-12-02T13:00:00Z"), at("2026-12-02T13:20:00Z")), None);
    /// # Ok::<(), tessera_lease::LeaseError>(())
    /// ```
    pub fn due(&self, since: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.latest_at_or_before(now)
            .filter(|run_at| *run_at > since)
    }

    /// [`due`](Self::due) for a stored schedule: run-ats at or before
    /// `active_since` (when it was put, replaced or last resumed) never
    /// fire, nor any at or before `last_fired`.
    ///
    /// ```
    /// use tessera_lease::CronSchedule;
    /// let hourly = CronSchedule::parse("0 * * * *", "UTC")?;
    /// let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    /// // Resumed at 12:30 after a pause: 11:00 and 12:00 passed while paused.
    /// let resumed = at("2026-12-02T12:30:00Z");
    /// let last = Some(at("2026-12-02T10:00:00Z"));
    /// assert_eq!(hourly.due_since(resumed, last, at("2026-12-02T12:45:00Z")), None);
    /// assert_eq!(
    ///     hourly.due_since(resumed, last, at("2026-12-02T13:05:00Z")),
    ///     Some(at("2026-12-02T13:00:00Z"))
    /// );
    /// # Ok::<(), tessera_lease::LeaseError>(())
    /// ```
    pub fn due_since(
        &self,
        active_since: DateTime<Utc>,
        last_fired: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let since = last_fired.map_or(active_since, |last| last.max(active_since));
        self.due(since, now)
    }
}

/// `time` read to the second below. The cron search keeps a time's
/// fraction of a second, so a seconds field would otherwise match `time`
/// itself and make every instant a run-at.
fn whole_second(time: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(time.timestamp(), 0).unwrap_or(time)
}

/// The id of the task a schedule's fire of `run_at` enqueues:
/// `sched-<name>-<run-at in Unix milliseconds, 13 digits or more>`.
/// Deterministic, so every scheduler that fires one run-at names the same
/// task; distinct for distinct (schedule, run-at) pairs, since the name is
/// everything between the prefix and the last `-`. Run-ats before 1970
/// are read as 1970.
///
/// ```
/// use tessera_lease::{ScheduleName, fire_task_id};
/// let at = "2026-12-02T13:00:00Z".parse::<chrono::DateTime<chrono::Utc>>().unwrap();
/// let id = fire_task_id(&ScheduleName::parse("nightly-report")?, at);
/// assert_eq!(id.as_str(), "sched-nightly-report-1796216400000");
/// # Ok::<(), tessera_lease::LeaseError>(())
/// ```
pub fn fire_task_id(schedule: &ScheduleName, run_at: DateTime<Utc>) -> TaskId {
    let millis = run_at.timestamp_millis().max(0);
    // 6 + 64 + 1 + 19 bytes fit in a task id, of name characters only.
    TaskId::parse(&format!("sched-{schedule}-{millis:013}"))
        .expect("a schedule name and a number make a task id")
}

impl TryFrom<ScheduleText> for CronSchedule {
    type Error = LeaseError;

    fn try_from(text: ScheduleText) -> Result<Self, Self::Error> {
        let invalid = |field, len, rule| LeaseError::InvalidInput { field, len, rule };
        let len = text.cron.len();
        if text.cron.trim().is_empty() {
            return Err(invalid(Field::Cron, len, Rule::Empty));
        }
        if len > Self::MAX_LEN {
            return Err(invalid(
                Field::Cron,
                len,
                Rule::TooLong { max: Self::MAX_LEN },
            ));
        }
        let cron =
            Cron::from_str(&text.cron).map_err(|_| invalid(Field::Cron, len, Rule::Syntax))?;
        let zone = Tz::from_str(&text.zone)
            .map_err(|_| invalid(Field::TimeZone, text.zone.len(), Rule::Unknown))?;
        Ok(Self { text, zone, cron })
    }
}

impl From<CronSchedule> for ScheduleText {
    fn from(schedule: CronSchedule) -> Self {
        schedule.text
    }
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CronSchedule {}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSchedule")
            .field("cron", &self.text.cron)
            .field("zone", &self.text.zone)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn due_is_the_latest_passed_run_at_after_the_last_fire() {
        let every_five = CronSchedule::parse("*/5 * * * *", "UTC").unwrap();
        let created = at("2026-12-02T10:01:00Z");
        assert_eq!(every_five.due(created, at("2026-12-02T10:04:59Z")), None);
        assert_eq!(
            every_five.due(created, at("2026-12-02T10:05:00Z")),
            Some(at("2026-12-02T10:05:00Z"))
        );
        assert_eq!(
            every_five.due(at("2026-12-02T10:05:00Z"), at("2026-12-02T10:05:00Z")),
            None
        );
    }

    #[test]
    fn serde_keeps_the_text_and_refuses_bad_input() {
        let schedule = CronSchedule::parse("@hourly", "America/New_York").unwrap();
        let json = serde_json::to_string(&schedule).unwrap();
        assert_eq!(json, r#"{"cron":"@hourly","zone":"America/New_York"}"#);
        assert_eq!(
            serde_json::from_str::<CronSchedule>(&json).unwrap(),
            schedule
        );
        assert!(serde_json::from_str::<CronSchedule>(r#"{"cron":"x","zone":"UTC"}"#).is_err());
        assert!(matches!(
            CronSchedule::parse("", "UTC"),
            Err(LeaseError::InvalidInput {
                rule: Rule::Empty,
                ..
            })
        ));
    }

    proptest::proptest! {
        /// Distinct (schedule, run-at) pairs name distinct tasks.
        #[test]
        fn fire_task_ids_are_distinct(
            a in "[a-z0-9][a-z0-9-]{0,20}[a-z0-9]",
            b in "[a-z0-9][a-z0-9-]{0,20}[a-z0-9]",
            x in 0_i64..4_102_444_800_000,
            y in 0_i64..4_102_444_800_000,
        ) {
            let name = |n: &str| ScheduleName::parse(n).unwrap();
            let time = |ms| DateTime::from_timestamp_millis(ms).unwrap();
            let (first, second) = (fire_task_id(&name(&a), time(x)), fire_task_id(&name(&b), time(y)));
            proptest::prop_assert_eq!(first == second, a == b && x == y);
        }

        /// The floor and the last fire both hold: nothing at or before
        /// either fires, and what fires is the latest run-at due.
        #[test]
        fn due_since_never_fires_at_or_before_its_floors(
            floor in 0_i64..100_000,
            last in proptest::option::of(0_i64..100_000),
            now in 0_i64..200_000,
        ) {
            let every_five = CronSchedule::parse("*/5 * * * *", "UTC").unwrap();
            let base = at("2026-12-02T10:00:00Z");
            let time = |s: i64| base + chrono::TimeDelta::seconds(s);
            let due = every_five.due_since(time(floor), last.map(time), time(now));
            if let Some(run_at) = due {
                proptest::prop_assert!(run_at > time(floor));
                proptest::prop_assert!(last.is_none_or(|l| run_at > time(l)));
                proptest::prop_assert_eq!(every_five.latest_at_or_before(time(now)), Some(run_at));
            }
        }
    }

    /// A field of a random cron expression, of values in `0..max`.
    fn cron_field(max: u32) -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("*".to_owned()),
            (1..max.min(30)).prop_map(|step| format!("*/{step}")),
            (0..max).prop_map(|value| value.to_string()),
            (0..max, 0..max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
            (0..max, 0..max).prop_map(|(a, b)| format!("{a},{b}")),
        ]
    }

    /// A scheduler's passes, each `steps[i]` ms after the one before,
    /// from `start`: the run-ats it fires.
    fn fires(schedule: &CronSchedule, start: DateTime<Utc>, steps: &[i64]) -> Vec<DateTime<Utc>> {
        let mut now = start;
        let mut last = None;
        let mut fired = Vec::new();
        for step in steps {
            now += chrono::TimeDelta::milliseconds(*step);
            if let Some(run_at) = schedule.due_since(start, last, now) {
                fired.push(run_at);
                last = Some(run_at);
            }
        }
        fired
    }

    #[test]
    fn a_seconds_field_fires_each_run_at_once() {
        let start = at("2026-12-02T10:00:00.250Z");
        // A pass every 3 ms for 10 s.
        let steps = vec![3; 3_334];
        let every_ten = CronSchedule::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(
            fires(&every_ten, start, &steps),
            vec![at("2026-12-02T10:00:10Z")]
        );
        let every_second = CronSchedule::parse("* * * * * *", "UTC").unwrap();
        let fired = fires(&every_second, start, &steps);
        assert_eq!(fired.len(), 10);
        assert_eq!(fired.first(), Some(&at("2026-12-02T10:00:01Z")));
        assert_eq!(
            every_second.next_after(at("2026-12-02T10:00:01.999Z")),
            Some(at("2026-12-02T10:00:02Z"))
        );
        assert_eq!(
            every_second.latest_at_or_before(at("2026-12-02T10:00:01.999Z")),
            Some(at("2026-12-02T10:00:01Z"))
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever the expression, five fields or six: every run-at is a
        /// whole second, fires once, in order, after the start and at or
        /// before the pass that fires it; so a schedule fires at most once
        /// a second.
        #[test]
        fn any_expression_fires_each_run_at_once_and_at_most_once_a_second(
            seconds in proptest::option::of(cron_field(60)),
            minutes in cron_field(60),
            hours in cron_field(24),
            start in 0_i64..400_000_000,
            steps in proptest::collection::vec(1_i64..1_500, 1..400),
        ) {
            let cron = match &seconds {
                Some(seconds) => format!("{seconds} {minutes} {hours} * * *"),
                None => format!("{minutes} {hours} * * *"),
            };
            let schedule = CronSchedule::parse(&cron, "Europe/Stockholm").unwrap();
            let start = at("2026-12-02T10:00:00Z") + chrono::TimeDelta::milliseconds(start);
            let fired = fires(&schedule, start, &steps);
            let end = start + chrono::TimeDelta::milliseconds(steps.iter().sum());
            for (n, run_at) in fired.iter().enumerate() {
                proptest::prop_assert_eq!(run_at.timestamp_subsec_nanos(), 0, "{}", cron);
                proptest::prop_assert!(*run_at > start && *run_at <= end);
                if n > 0 {
                    proptest::prop_assert!(*run_at >= fired[n - 1] + chrono::TimeDelta::seconds(1));
                }
            }
            let seconds_passed = (end - start).num_seconds() + 1;
            proptest::prop_assert!(i64::try_from(fired.len()).unwrap() <= seconds_passed);
        }
    }

    #[test]
    fn a_daylight_saving_gap_skips_the_missing_local_time() {
        // 02:30 does not exist in Stockholm on 2027-03-28.
        let nightly = CronSchedule::parse("30 2 * * *", "Europe/Stockholm").unwrap();
        let next = nightly.next_after(at("2027-03-27T02:00:00Z")).unwrap();
        assert!(next > at("2027-03-27T02:00:00Z"));
        assert_eq!(nightly.due(next, next), None);
    }
}
