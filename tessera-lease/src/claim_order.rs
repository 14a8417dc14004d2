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
//! [`is_due`](ClaimKey::is_due): the highest priority first; within it,
//! ready tasks first, oldest first, then lapsed leases, ended backoffs and
//! passed schedules by when each became claimable, ties to the older task.
//! Each index is ordered by priority, then by the rest of its key, and a
//! backend searches it one priority at a time, from the highest
//! ([`priorities`]), stopping at the first due entry: at most
//! `MAX_PRIORITY + 1` searches, however many entries are not yet due.
//! [`first_claimable`] picks between the two indexes' first entries.
//! Together they say exactly what
//! [`Task::next_claimable_at`](crate::Task::next_claimable_at) and
//! [`Task::claim`](crate::Task::claim) say for one task.

use std::time::Duration;

use chrono::{DateTime, Utc};

use std::cmp::Ordering;

use crate::attempt::AttemptRecord;
use crate::spec::{MAX_PRIORITY, TaskRecord};
use crate::state::TaskState;
use crate::task::lapse_end;

/// Every priority, highest first: the order a backend searches its claim
/// indexes in.
pub fn priorities() -> impl Iterator<Item = u8> {
    (0..=MAX_PRIORITY).rev()
}

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
    /// end otherwise, `None` while every unfinished attempt is leased or
    /// waiting for parents, or once all are final. The value a backend's claim index holds.
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
                TaskState::Backoff { until } | TaskState::Scheduled { at: until } => {
                    Some(ClaimableAt::At(until))
                }
                TaskState::Leased
                | TaskState::Done
                | TaskState::Failed
                | TaskState::Discarded { .. }
                | TaskState::Cancelled
                | TaskState::Waiting { .. } => None,
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

/// A claim candidate's place in the claim order: its task's priority, when
/// it became claimable, then its `sequence`, the backend's enqueue order (a
/// row id; smaller is older).
///
/// Keys compare in claim order, smallest first: the higher priority, then
/// ready before every time, earlier times first, and at the same time the
/// older task. A task in backoff, scheduled, or past either is keyed by
/// [`TaskRecord::claimable_at`]; a lapsing lease by [`ClaimKey::lapsed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimKey<S = u64> {
    /// The task's priority ([`TaskRecord::priority`]); a higher one sorts
    /// first.
    pub priority: u8,
    /// When the candidate became (or becomes) claimable.
    pub at: ClaimableAt,
    /// The candidate task's enqueue order; ties go to the smaller.
    pub sequence: S,
}

impl<S: Ord> Ord for ClaimKey<S> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .priority
            .cmp(&self.priority)
            .then_with(|| self.at.cmp(&other.at))
            .then_with(|| self.sequence.cmp(&other.sequence))
    }
}

impl<S: Ord> PartialOrd for ClaimKey<S> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<S> ClaimKey<S> {
    /// The key of a task of `priority` in the claim index, claimable from
    /// `at`.
    #[must_use]
    pub fn new(priority: u8, at: ClaimableAt, sequence: S) -> Self {
        Self {
            priority,
            at,
            sequence,
        }
    }

    /// The key of a leased attempt of task `sequence`, of `priority`, that
    /// lapses into being claimable at `lapses_at`
    /// ([`AttemptRecord::lapses_at`]).
    #[must_use]
    pub fn lapsed(priority: u8, lapses_at: DateTime<Utc>, sequence: S) -> Self {
        Self::new(priority, ClaimableAt::At(lapses_at), sequence)
    }

    /// The lowest priority a lapsed lease needs to come before this key:
    /// `None` if none can (a ready candidate of the highest priority). A
    /// ready candidate beats every lapse of its own priority; any other
    /// is compared with lapses of its priority too.
    #[must_use]
    pub fn lapse_floor(&self) -> Option<u8> {
        match self.at {
            ClaimableAt::Ready => self.priority.checked_add(1).filter(|p| *p <= MAX_PRIORITY),
            ClaimableAt::At(_) => Some(self.priority),
        }
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
/// is kept, as the backend has it in hand. A ready candidate beats every
/// lapse of its priority or below, so a backend that finds one needs only
/// search the priorities above it for a lapsed lease
/// ([`ClaimKey::lapse_floor`]). Both arguments must already be due at the
/// claim's `now` ([`ClaimKey::is_due`]).
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
        let ready_young = ClaimKey::new(0, ClaimableAt::Ready, 9_u64);
        let early_old = ClaimKey::lapsed(0, at(1), 1);
        let early_young = ClaimKey::new(0, ClaimableAt::At(at(1)), 2);
        let late_old = ClaimKey::lapsed(0, at(2), 0);
        let mut keys = [late_old, early_young, ready_young, early_old];
        keys.sort();
        assert_eq!(keys, [ready_young, early_old, early_young, late_old]);
    }

    #[test]
    fn a_higher_priority_comes_first_whatever_its_time() {
        let urgent_late = ClaimKey::lapsed(2, at(50), 9_u64);
        let urgent_ready = ClaimKey::new(2, ClaimableAt::Ready, 10);
        let normal_ready = ClaimKey::new(0, ClaimableAt::Ready, 1);
        let high_ready = ClaimKey::new(1, ClaimableAt::Ready, 3);
        let mut keys = [normal_ready, urgent_late, high_ready, urgent_ready];
        keys.sort();
        assert_eq!(keys, [urgent_ready, urgent_late, high_ready, normal_ready]);
        assert_eq!(
            first_claimable(Some(&normal_ready), Some(&urgent_late)),
            Some(ClaimSource::Lapsed)
        );
        assert_eq!(priorities().collect::<Vec<_>>(), [3, 2, 1, 0]);
    }

    #[test]
    fn a_ready_key_needs_lapses_above_its_priority_only() {
        let ready = |p| ClaimKey::new(p, ClaimableAt::Ready, 1_u64);
        let ended = |p| ClaimKey::new(p, ClaimableAt::At(at(1)), 1_u64);
        assert_eq!(ready(0).lapse_floor(), Some(1));
        assert_eq!(ready(MAX_PRIORITY).lapse_floor(), None);
        assert_eq!(ended(0).lapse_floor(), Some(0));
        assert_eq!(ended(MAX_PRIORITY).lapse_floor(), Some(MAX_PRIORITY));
    }

    #[test]
    fn first_claimable_keeps_ready_and_breaks_ties_to_the_index() {
        let ready = ClaimKey::new(0, ClaimableAt::Ready, 5_u64);
        let ended = ClaimKey::new(0, ClaimableAt::At(at(10)), 5);
        let lapsed = |seconds, sequence| ClaimKey::lapsed(0, at(seconds), sequence);
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
