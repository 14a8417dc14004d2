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

/// A cron expression (five fields, minutes to weekdays, or `@hourly` and
/// the like) evaluated in a named IANA time zone.
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
    /// never matches again.
    pub fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&time.with_timezone(&self.zone), false)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    }

    /// The latest run-at at or before `time`.
    pub fn latest_at_or_before(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&time.with_timezone(&self.zone), true)
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

    #[test]
    fn a_daylight_saving_gap_skips_the_missing_local_time() {
        // 02:30 does not exist in Stockholm on 2027-03-28.
        let nightly = CronSchedule::parse("30 2 * * *", "Europe/Stockholm").unwrap();
        let next = nightly.next_after(at("2027-03-27T02:00:00Z")).unwrap();
        assert!(next > at("2027-03-27T02:00:00Z"));
        assert_eq!(nightly.due(next, next), None);
    }
}
