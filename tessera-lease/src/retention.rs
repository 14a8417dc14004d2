//! How long finished work is kept: the rule that says when a finished
//! task may be purged, from when each of its attempts reached its final
//! state.
//!
//! A task is purged as a whole (its attempts, receipts and slot with it),
//! and only once every attempt is final: done, failed, discarded or
//! cancelled. Each final state has its own keep time, counted from when
//! the attempt reached it; a task is kept until the last of its attempts'
//! keep times has passed, and forever if any of them keeps forever.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::state::StateName;

/// How long finished tasks are kept, by the state their attempts ended
/// in; `None` keeps them forever. Failed attempts (given up by their
/// holder) are kept as discarded ones are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Retention {
    /// Done: a submission was accepted.
    #[serde(default, with = "keep_millis")]
    pub done: Option<Duration>,
    /// Discarded (out of tries, lapsed or failed on the last try) or
    /// failed for good.
    #[serde(default, with = "keep_millis")]
    pub discarded: Option<Duration>,
    /// Cancelled by an operator.
    #[serde(default, with = "keep_millis")]
    pub cancelled: Option<Duration>,
}

impl Default for Retention {
    /// Done work for a day, so a replay or an inspection finds it; work
    /// that went wrong (discarded, failed, cancelled) for a week, long
    /// enough for an operator to look and retry after a weekend.
    fn default() -> Self {
        Self {
            done: Some(Self::DAY),
            discarded: Some(Self::WEEK),
            cancelled: Some(Self::WEEK),
        }
    }
}

impl Retention {
    /// A day.
    pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);
    /// A week.
    pub const WEEK: Duration = Duration::from_secs(7 * 24 * 60 * 60);
    /// The longest keep time that is not forever: ten years.
    pub const MAX: Duration = Duration::from_secs(10 * 366 * 24 * 60 * 60);

    /// Every finished task kept for good.
    pub const FOREVER: Self = Self {
        done: None,
        discarded: None,
        cancelled: None,
    };

    /// The keep time of attempts that ended in `state`; `None` (forever)
    /// for a state that is not final, which never counts anyway.
    pub fn keep(&self, state: StateName) -> Option<Duration> {
        match state {
            StateName::Done => self.done,
            StateName::Failed | StateName::Discarded => self.discarded,
            StateName::Cancelled => self.cancelled,
            StateName::Ready
            | StateName::Leased
            | StateName::Backoff
            | StateName::Scheduled
            | StateName::Waiting => None,
        }
    }

    /// When a task whose attempts are in `attempts` (each state with when
    /// it was reached) may be purged: the latest of its attempts' ends
    /// plus their keep times. `None` while an attempt is unfinished or
    /// one of them keeps forever, or for a task with no attempt.
    pub fn purge_at(
        &self,
        attempts: impl IntoIterator<Item = (StateName, DateTime<Utc>)>,
    ) -> Option<DateTime<Utc>> {
        let mut latest: Option<DateTime<Utc>> = None;
        for (state, at) in attempts {
            if !is_final(state) {
                return None;
            }
            let keep = TimeDelta::from_std(self.keep(state)?).ok()?;
            let until = at.checked_add_signed(keep)?;
            latest = Some(latest.map_or(until, |l| l.max(until)));
        }
        latest
    }

    /// Whether such a task may be purged at `now` ([`purge_at`](Self::purge_at)
    /// has passed).
    pub fn purgeable(
        &self,
        attempts: impl IntoIterator<Item = (StateName, DateTime<Utc>)>,
        now: DateTime<Utc>,
    ) -> bool {
        self.purge_at(attempts).is_some_and(|at| at <= now)
    }

    /// The latest time an attempt may have reached `state` and still be
    /// purged at `now` (its keep time before now): every purgeable task
    /// has each of its attempts at or before the cutoff of its state.
    /// `None` for a state kept forever.
    pub fn cutoff(&self, state: StateName, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let keep = TimeDelta::from_std(self.keep(state)?).ok()?;
        Some(
            now.checked_sub_signed(keep)
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        )
    }

    /// Each keep time at most [`MAX`](Self::MAX), so times never
    /// overflow.
    pub fn check(&self) -> Result<(), crate::LeaseError> {
        for keep in [self.done, self.discarded, self.cancelled]
            .into_iter()
            .flatten()
        {
            if keep > Self::MAX {
                return Err(crate::LeaseError::OutOfRange {
                    field: crate::Field::Retention,
                    value: i64::try_from(keep.as_secs()).unwrap_or(i64::MAX),
                    max: i64::try_from(Self::MAX.as_secs()).unwrap_or(i64::MAX),
                });
            }
        }
        Ok(())
    }
}

/// Whether an attempt in `state` is finished.
fn is_final(state: StateName) -> bool {
    matches!(
        state,
        StateName::Done | StateName::Failed | StateName::Discarded | StateName::Cancelled
    )
}

/// A keep time as whole milliseconds, `null` for forever.
mod keep_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        keep: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match keep {
            Some(keep) => {
                serializer.serialize_u64(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            }
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    const ALL: [StateName; 8] = [
        StateName::Ready,
        StateName::Leased,
        StateName::Backoff,
        StateName::Scheduled,
        StateName::Done,
        StateName::Failed,
        StateName::Discarded,
        StateName::Cancelled,
    ];

    #[test]
    fn a_task_is_kept_until_its_last_attempts_keep_time() {
        let retention = Retention {
            done: Some(Duration::from_secs(60)),
            discarded: Some(Duration::from_secs(600)),
            cancelled: None,
        };
        let done = (StateName::Done, at(0));
        assert_eq!(retention.purge_at([done]), Some(at(60)));
        assert!(!retention.purgeable([done], at(59)));
        assert!(retention.purgeable([done], at(60)));
        // Another attempt discarded later keeps the task longer.
        let discarded = (StateName::Discarded, at(10));
        assert_eq!(retention.purge_at([done, discarded]), Some(at(610)));
        // An unfinished attempt, or a state kept forever, keeps it.
        assert_eq!(retention.purge_at([done, (StateName::Leased, at(0))]), None);
        assert_eq!(
            retention.purge_at([done, (StateName::Cancelled, at(0))]),
            None
        );
        assert_eq!(retention.purge_at([]), None);
        assert_eq!(Retention::FOREVER.purge_at([done]), None);
        assert_eq!(retention.cutoff(StateName::Done, at(100)), Some(at(40)));
        assert_eq!(retention.cutoff(StateName::Cancelled, at(100)), None);
        assert!(Retention::default().check().is_ok());
        let too_long = Retention {
            done: Some(Retention::MAX + Duration::from_secs(1)),
            ..Retention::default()
        };
        assert!(too_long.check().is_err());
    }

    #[test]
    fn serde_writes_milliseconds_and_null_for_forever() {
        let json = serde_json::to_string(&Retention {
            cancelled: None,
            ..Retention::default()
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"done":86400000,"discarded":604800000,"cancelled":null}"#
        );
        let back: Retention = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cancelled, None);
        assert_eq!(back.done, Some(Retention::DAY));
    }

    proptest::proptest! {
        /// A purgeable task has every attempt final and at or before its
        /// state's cutoff; and one with every attempt final and at or
        /// before its cutoff is purgeable: the cutoffs a store searches
        /// by find exactly what the rule purges.
        #[test]
        fn the_cutoffs_find_exactly_the_purgeable_tasks(
            keeps in proptest::array::uniform3(proptest::option::of(0_u64..1_000)),
            attempts in proptest::collection::vec((0_usize..8, 0_i64..2_000), 1..5),
            now in 0_i64..3_000,
        ) {
            let retention = Retention {
                done: keeps[0].map(Duration::from_secs),
                discarded: keeps[1].map(Duration::from_secs),
                cancelled: keeps[2].map(Duration::from_secs),
            };
            let attempts: Vec<(StateName, DateTime<Utc>)> =
                attempts.iter().map(|(state, t)| (ALL[*state], at(*t))).collect();
            let by_cutoffs = attempts.iter().all(|(state, reached)| {
                is_final(*state)
                    && retention.cutoff(*state, at(now)).is_some_and(|cutoff| *reached <= cutoff)
            });
            proptest::prop_assert_eq!(
                retention.purgeable(attempts.iter().copied(), at(now)),
                by_cutoffs
            );
        }
    }
}
