//! Claim order: when a task becomes claimable, and which claimable task a
//! claim takes first.
//!
//! A backend keeps two indexes and never restates the rule:
//!
//! - tasks by [`TaskRecord::claimable_at`]: [`ClaimableAt::Ready`] while an
//!   attempt is ready, else the earliest backoff end; absent while every
//!   unfinished attempt is leased, or once all are finished;
//! - leased attempts by [`AttemptRecord::lapses_at`]: the lease's expiry
//!   plus the task's lapse backoff. A heartbeat moves only this entry.
//!
//! A claim at `now` takes the smallest [`ClaimKey`] that
//! [`is_due`](ClaimKey::is_due): ready tasks first, oldest first, then lapsed
//! leases and ended backoffs by when each became claimable, ties to the
//! older task. With each index ordered by its key, the first entry of each
//! is enough: [`first_claimable`] picks between them. Together they say
//! exactly what [`Task::next_claimable_at`](crate::Task::next_claimable_at)
//! and [`Task::claim`](crate::Task::claim) say for one task.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::attempt::AttemptRecord;
use crate::state::TaskState;
use crate::task::{TaskRecord, lapse_end};

/// When a task can next be claimed, leaving lapsing leases aside (those are
/// [`AttemptRecord::lapses_at`]).
///
/// Ordered as the claim order needs: [`Ready`](Self::Ready) before every
/// time, times in order. A backend storing it in one column keeps `Ready` as
/// a value below every time it stores (the SQLite backend uses 0, Unix
/// milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClaimableAt {
    /// An attempt is ready now.
    Ready,
    /// From this time on: a retry backoff's end, or a lease's lapse plus the
    /// task's lapse backoff.
    At(DateTime<Utc>),
}

impl ClaimableAt {
    /// Whether a claim at `now` may take it: ready, or the time has come
    /// (`at <= now`).
    #[must_use]
    pub fn is_due(self, now: DateTime<Utc>) -> bool {
        match self {
            Self::Ready => true,
            Self::At(at) => at <= now,
        }
    }

    /// The time, `None` when ready.
    #[must_use]
    pub fn time(self) -> Option<DateTime<Utc>> {
        match self {
            Self::Ready => None,
            Self::At(at) => Some(at),
        }
    }
}

impl TaskRecord {
    /// When the task can next be claimed without a lease lapsing:
    /// [`ClaimableAt::Ready`] while an attempt is ready, the earliest backoff
    /// end otherwise, `None` while every unfinished attempt is leased or once
    /// all are final. The value a backend's claim index holds.
    ///
    /// A leased attempt's lapse is not in it (see
    /// [`AttemptRecord::lapses_at`]), so a heartbeat leaves it unchanged. An
    /// ended backoff stays `At` its end: it is claimable, ordered by when it
    /// became so.
    #[must_use]
    pub fn claimable_at(&self) -> Option<ClaimableAt> {
        self.attempts
            .iter()
            .filter_map(|attempt| match attempt.state {
                TaskState::Ready => Some(ClaimableAt::Ready),
                TaskState::Backoff { until } => Some(ClaimableAt::At(until)),
                TaskState::Leased
                | TaskState::Done
                | TaskState::Failed
                | TaskState::Discarded { .. } => None,
            })
            .min()
    }
}

impl AttemptRecord {
    /// When this attempt, if leased, becomes claimable by its lease lapsing:
    /// the lease's expiry plus the task's `lapse_backoff` (the last
    /// representable time if that overflows). `None` unless the attempt is
    /// [`TaskState::Leased`] with a lease. The value a backend's index of
    /// leased attempts holds; a heartbeat moves it.
    #[must_use]
    pub fn lapses_at(&self, lapse_backoff: Duration) -> Option<DateTime<Utc>> {
        match (self.state, &self.lease) {
            (TaskState::Leased, Some(lease)) => Some(lapse_end(lease.expires_at, lapse_backoff)),
            _ => None,
        }
    }
}

/// A claim candidate's place in the claim order: when it became claimable,
/// then its `sequence`, the backend's enqueue order (a row id; smaller is
/// older).
///
/// Keys compare in claim order (the derived `Ord`, field by field): ready
/// before every time, earlier times first, and at the same time the older
/// task. A task in backoff or with an ended backoff is keyed by
/// [`TaskRecord::claimable_at`]; a lapsing lease by
/// [`ClaimKey::lapsed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey<S = u64> {
    /// When the candidate became (or becomes) claimable.
    pub at: ClaimableAt,
    /// The candidate task's enqueue order; ties go to the smaller.
    pub sequence: S,
}

impl<S> ClaimKey<S> {
    /// The key of a task in the claim index, claimable from `at`.
    #[must_use]
    pub fn new(at: ClaimableAt, sequence: S) -> Self {
        Self { at, sequence }
    }

    /// The key of a leased attempt of task `sequence` that lapses into being
    /// claimable at `lapses_at` ([`AttemptRecord::lapses_at`]).
    #[must_use]
    pub fn lapsed(lapses_at: DateTime<Utc>, sequence: S) -> Self {
        Self::new(ClaimableAt::At(lapses_at), sequence)
    }

    /// Whether a claim at `now` may take this candidate.
    #[must_use]
    pub fn is_due(&self, now: DateTime<Utc>) -> bool {
        self.at.is_due(now)
    }
}

/// Which of a backend's two candidates a claim takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimSource {
    /// The first task of the claim index ([`TaskRecord::claimable_at`]): a
    /// ready attempt or an ended backoff.
    Claimable,
    /// The first lapsed lease ([`AttemptRecord::lapses_at`]).
    Lapsed,
}

/// Picks the candidate a claim takes: the smaller [`ClaimKey`] of
/// `claimable` (the first due entry of the claim index) and `lapsed` (the
/// first due lapsed lease); `None` when neither exists.
///
/// Equal keys name the same task at the same time; the claimable candidate
/// is kept, as the backend has it in hand. A ready candidate always wins, so
/// a backend that finds one need not look up a lapsed lease at all. Both
/// arguments must already be due at the claim's `now` ([`ClaimKey::is_due`]).
#[must_use]
pub fn first_claimable<S: Ord>(
    claimable: Option<&ClaimKey<S>>,
    lapsed: Option<&ClaimKey<S>>,
) -> Option<ClaimSource> {
    match (claimable, lapsed) {
        (Some(claimable), Some(lapsed)) if lapsed >= claimable => Some(ClaimSource::Claimable),
        (_, Some(_)) => Some(ClaimSource::Lapsed),
        (Some(_), None) => Some(ClaimSource::Claimable),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::tries::Jitter;
    use crate::{BriefVersion, Principal, Retry, Task, TaskId, TaskSpec};

    const LEASE: Duration = Duration::from_secs(30);

    fn at(seconds: i64) -> DateTime<Utc> {
        "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::seconds(seconds)
    }

    fn who() -> Principal {
        Principal::parse("p1").unwrap()
    }

    fn lapses(task: &Task) -> Vec<Option<DateTime<Utc>>> {
        let backoff = task.record().lapse_backoff;
        task.attempts()
            .iter()
            .map(|a| a.lapses_at(backoff))
            .collect()
    }

    #[test]
    fn claimability_follows_the_attempts() {
        let spec = TaskSpec {
            alternatives: 2,
            lapse_backoff: Duration::from_secs(5),
            ..TaskSpec::default()
        };
        let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
        assert_eq!(task.record().claimable_at(), Some(ClaimableAt::Ready));
        task.claim(&who(), at(0), LEASE).unwrap();
        assert_eq!(
            task.record().claimable_at(),
            Some(ClaimableAt::Ready),
            "attempt 2 is ready"
        );
        let second = task.claim(&who(), at(1), LEASE).unwrap();
        // Both leased: out of the claim index; each lease lapses at its
        // expiry plus the lapse backoff.
        assert_eq!(task.record().claimable_at(), None);
        assert_eq!(lapses(&task), [Some(at(35)), Some(at(36))]);
        assert_eq!(task.next_claimable_at(at(2)), Some(at(35)));
        // A retry backoff puts it back, at the backoff's end.
        task.fail(
            &who(),
            second.token(),
            at(2),
            Retry::After(Duration::from_secs(10)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
        assert_eq!(task.record().claimable_at(), Some(ClaimableAt::At(at(12))));
        assert_eq!(lapses(&task), [Some(at(35)), None]);
        assert_eq!(task.next_claimable_at(at(2)), Some(at(12)));
    }

    #[test]
    fn a_heartbeat_moves_only_the_lapse() {
        let mut task = Task::new(
            TaskId::parse("t").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap();
        let lease = task.claim(&who(), at(0), LEASE).unwrap();
        assert_eq!(lapses(&task), [Some(at(30))], "no lapse backoff");
        task.heartbeat(&who(), lease.token(), at(20), LEASE)
            .unwrap();
        assert_eq!(lapses(&task), [Some(at(50))]);
        assert_eq!(task.record().claimable_at(), None);
    }

    #[test]
    fn finished_and_unleased_attempts_never_lapse() {
        let mut task = Task::new(
            TaskId::parse("t").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap();
        assert_eq!(lapses(&task), [None], "ready");
        let lease = task.claim(&who(), at(0), LEASE).unwrap();
        task.fail(
            &who(),
            lease.token(),
            at(1),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
        .unwrap();
        assert_eq!(lapses(&task), [None], "failed, with its lease kept");
        assert_eq!(task.record().claimable_at(), None);
    }

    #[test]
    fn a_lapse_past_the_end_of_time_saturates() {
        let mut task = Task::new(
            TaskId::parse("t").unwrap(),
            BriefVersion::FIRST,
            TaskSpec {
                lapse_backoff: crate::MAX_BACKOFF,
                ..TaskSpec::default()
            },
        )
        .unwrap();
        let near_the_end = DateTime::<Utc>::MAX_UTC - TimeDelta::seconds(60);
        task.claim(&who(), near_the_end, LEASE).unwrap();
        assert_eq!(lapses(&task), [Some(DateTime::<Utc>::MAX_UTC)]);
    }

    #[test]
    fn ready_is_due_before_every_time() {
        assert!(ClaimableAt::Ready < ClaimableAt::At(DateTime::<Utc>::MIN_UTC));
        assert!(ClaimableAt::Ready.is_due(DateTime::<Utc>::MIN_UTC));
        assert!(ClaimableAt::At(at(5)).is_due(at(5)));
        assert!(!ClaimableAt::At(at(5)).is_due(at(4)));
        assert_eq!(ClaimableAt::At(at(5)).time(), Some(at(5)));
        assert_eq!(ClaimableAt::Ready.time(), None);
    }

    #[test]
    fn claim_keys_order_ready_then_time_then_age() {
        let ready_young = ClaimKey::new(ClaimableAt::Ready, 9_u64);
        let early_old = ClaimKey::lapsed(at(1), 1);
        let early_young = ClaimKey::new(ClaimableAt::At(at(1)), 2);
        let late_old = ClaimKey::lapsed(at(2), 0);
        let mut keys = [late_old, early_young, ready_young, early_old];
        keys.sort();
        assert_eq!(keys, [ready_young, early_old, early_young, late_old]);
    }

    #[test]
    fn first_claimable_keeps_ready_and_breaks_ties_to_the_index() {
        let ready = ClaimKey::new(ClaimableAt::Ready, 5_u64);
        let ended = ClaimKey::new(ClaimableAt::At(at(10)), 5);
        let lapsed = |seconds, sequence| ClaimKey::lapsed(at(seconds), sequence);
        let pick = |c: Option<&ClaimKey>, l: Option<&ClaimKey>| first_claimable(c, l);
        assert_eq!(pick(None, None), None);
        assert_eq!(pick(Some(&ready), None), Some(ClaimSource::Claimable));
        assert_eq!(pick(None, Some(&lapsed(0, 1))), Some(ClaimSource::Lapsed));
        assert_eq!(
            pick(Some(&ready), Some(&lapsed(0, 1))),
            Some(ClaimSource::Claimable)
        );
        assert_eq!(
            pick(Some(&ended), Some(&lapsed(9, 9))),
            Some(ClaimSource::Lapsed)
        );
        assert_eq!(
            pick(Some(&ended), Some(&lapsed(10, 4))),
            Some(ClaimSource::Lapsed)
        );
        assert_eq!(
            pick(Some(&ended), Some(&lapsed(10, 5))),
            Some(ClaimSource::Claimable)
        );
        assert_eq!(
            pick(Some(&ended), Some(&lapsed(10, 6))),
            Some(ClaimSource::Claimable)
        );
        assert_eq!(
            pick(Some(&ended), Some(&lapsed(11, 0))),
            Some(ClaimSource::Claimable)
        );
    }
}
