//! The claim-order values a backend indexes agree with the lease rules
//! themselves, over random stored records.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;
use tessera_lease::{
    AttemptNumber, AttemptRecord, BriefVersion, ClaimKey, ClaimSource, FencingToken, LeaseError,
    LeaseRecord, MAX_PRIORITY, Principal, Task, TaskId, TaskRecord, TaskState, first_claimable,
    priorities,
};

const LEASE: Duration = Duration::from_secs(30);

fn origin() -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse().unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    origin() + TimeDelta::seconds(seconds)
}

/// One attempt: (state 0..8, granted at, lease length, backoff end), times in
/// seconds from the origin.
type AttemptSeed = (u8, i64, i64, i64);

fn attempt(index: usize, (state, granted, length, until): AttemptSeed) -> AttemptRecord {
    let number = AttemptNumber::new(u16::try_from(index + 1).unwrap()).unwrap();
    let lease = LeaseRecord {
        holder: Principal::parse("worker").unwrap(),
        token: FencingToken::new(i64::try_from(index + 1).unwrap()).unwrap(),
        granted_at: at(granted),
        expires_at: at(granted + length),
    };
    let (state, lease) = match state {
        0 => (TaskState::Ready, None),
        1 => (TaskState::Ready, Some(lease)), // a lapse swept back to ready
        2 => (TaskState::Leased, Some(lease)),
        3 => (TaskState::Done, Some(lease)),
        4 => (TaskState::Failed, Some(lease)),
        5 => (TaskState::Scheduled { at: at(until) }, None),
        6 => (TaskState::Cancelled, None),
        7 => (TaskState::Cancelled, Some(lease)),
        _ => (TaskState::Backoff { until: at(until) }, Some(lease)),
    };
    AttemptRecord {
        number,
        state,
        tries: u32::from(lease.is_some()),
        lease,
        last_error: None,
    }
}

fn record() -> impl Strategy<Value = TaskRecord> {
    let seed = (0_u8..9, 0_i64..200, 1_i64..100, 0_i64..300);
    (
        proptest::collection::vec(seed, 1..5),
        0_u64..60,
        0..=MAX_PRIORITY,
    )
        .prop_map(|(seeds, backoff, priority)| {
            let attempts: Vec<AttemptRecord> = seeds
                .into_iter()
                .enumerate()
                .map(|(index, seed)| attempt(index, seed))
                .collect();
            TaskRecord {
                id: TaskId::parse("task").unwrap(),
                version: BriefVersion::FIRST,
                lapse_backoff: Duration::from_secs(backoff),
                max_tries: tessera_lease::DEFAULT_MAX_TRIES,
                priority,
                lease_duration: None,
                deadline: None,
                last_token: Some(FencingToken::new(attempts.len() as i64).unwrap()),
                attempts,
            }
        })
}

/// The task's earliest claim key in a backend's two indexes: its claim index
/// entry and the lapses of its leased attempts.
fn keys(record: &TaskRecord, sequence: u64) -> (Option<ClaimKey>, Option<ClaimKey>) {
    let priority = record.priority;
    let claimable = record
        .claimable_at()
        .map(|at| ClaimKey::new(priority, at, sequence));
    let lapsed = record
        .attempts
        .iter()
        .filter_map(|a| a.lapses_at(record.lapse_backoff))
        .min()
        .map(|at| ClaimKey::lapsed(priority, at, sequence));
    (claimable, lapsed)
}

proptest! {
    /// The indexed values say what `next_claimable_at` and `claim` say: the
    /// earliest of them (ready counting as now) is the next claimable time,
    /// and a claim succeeds exactly when one of them is due.
    #[test]
    fn indexed_claimability_agrees_with_the_lease_rules(
        record in record(),
        now in 0_i64..400,
    ) {
        let now = at(now);
        let task = Task::restore(record.clone()).expect("the strategy builds valid records");
        let (claimable, lapsed) = keys(&record, 0);

        let earliest = [
            claimable.map(|key| key.at.time().unwrap_or(now)),
            lapsed.and_then(|key| key.at.time()),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.max(now));
        prop_assert_eq!(earliest, task.next_claimable_at(now));

        let due = claimable.is_some_and(|key| key.is_due(now))
            || lapsed.is_some_and(|key| key.is_due(now));
        let claimed = task.clone().claim(&Principal::parse("next").unwrap(), now, LEASE);
        prop_assert_eq!(due, claimed.is_ok());
        match claimed {
            Ok(_) => prop_assert_eq!(task.next_claimable_at(now), Some(now)),
            Err(LeaseError::NoAttemptReady { next_at }) => {
                prop_assert!(next_at > now);
                prop_assert_eq!(Some(next_at), earliest);
            }
            Err(LeaseError::TaskFinished) => prop_assert_eq!(earliest, None),
            Err(other) => prop_assert!(false, "unexpected refusal {other:?}"),
        }
    }

    /// Merging the first due entry of each index picks the smallest due key
    /// of all tasks, as one index over both would.
    #[test]
    fn two_index_merge_takes_the_first_task_in_claim_order(
        records in proptest::collection::vec(record(), 1..8),
        now in 0_i64..400,
    ) {
        let now = at(now);
        let mut claimable = Vec::new();
        let mut lapsed = Vec::new();
        for (sequence, record) in records.iter().enumerate() {
            let (c, l) = keys(record, sequence as u64);
            claimable.extend(c.filter(|key| key.is_due(now)));
            lapsed.extend(l.filter(|key| key.is_due(now)));
        }
        // A backend searches each index a priority at a time, highest
        // first, and stops at the first priority with a due entry; lapses
        // only from the claimable key's floor up.
        fn search(keys: &[ClaimKey], floor: u8) -> Option<&ClaimKey> {
            priorities()
                .filter(|p| *p >= floor)
                .find_map(|p| keys.iter().filter(|key| key.priority == p).min())
        }
        let first_claimable_key = search(&claimable, 0);
        prop_assert_eq!(first_claimable_key, claimable.iter().min());
        let first_lapsed_key = match first_claimable_key.map(ClaimKey::lapse_floor) {
            None => search(&lapsed, 0),
            Some(None) => None,
            Some(Some(floor)) => search(&lapsed, floor),
        };
        let picked = match first_claimable(first_claimable_key, first_lapsed_key) {
            Some(ClaimSource::Claimable) => first_claimable_key,
            Some(ClaimSource::Lapsed) => first_lapsed_key,
            None => None,
        };
        let overall = claimable.iter().chain(&lapsed).min();
        prop_assert_eq!(picked, overall);
        // The task picked is one the lease rules let a claim take now.
        if let Some(key) = picked {
            let task = Task::restore(records[key.sequence as usize].clone()).unwrap();
            prop_assert_eq!(task.next_claimable_at(now), Some(now));
        }
    }
}
