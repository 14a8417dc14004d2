//! Each task its own time: a task's own lease length and its deadline,
//! checked against a random walk of claims, heartbeats, snoozes, failures
//! and the passing of time.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use tessera_lease::{
    BriefVersion, DiscardReason, Jitter, Principal, Retry, Task, TaskId, TaskSpec, TaskState,
};

/// The store's lease length, when the task has none of its own.
const DEFAULT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
enum Step {
    /// Time passes, in milliseconds.
    Wait(u32),
    Claim,
    Heartbeat,
    Snooze(u32),
    Fail,
    Expire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1_u32..90_000).prop_map(Step::Wait),
        3 => Just(Step::Claim),
        2 => Just(Step::Heartbeat),
        1 => (0_u32..30_000).prop_map(Step::Snooze),
        1 => Just(Step::Fail),
        2 => Just(Step::Expire),
    ]
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_task_s_own_time_bounds_every_lease(
        own in proptest::option::of(1_u64..120_000),
        deadline_ms in proptest::option::of(0_i64..400_000),
        alternatives in 1_u16..3,
        max_tries in 1_u32..4,
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let deadline = deadline_ms.map(|ms| start() + TimeDelta::milliseconds(ms + 1));
        let spec = TaskSpec {
            alternatives,
            max_tries,
            lease_duration: own.map(Duration::from_millis),
            deadline,
            ..TaskSpec::default()
        };
        let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
        let holder = Principal::parse("worker").unwrap();
        let length = own.map_or(DEFAULT, Duration::from_millis);
        let mut jitter = Jitter::seeded(7);
        let mut now = start();
        let mut held = Vec::new();
        for step in steps {
            match step {
                Step::Wait(ms) => now += TimeDelta::milliseconds(i64::from(ms)),
                Step::Claim => {
                    let tries: Vec<u32> = task.attempts().iter().map(|a| a.tries).collect();
                    match task.claim(&holder, now, DEFAULT) {
                        Ok(lease) => {
                            // Never at or past the deadline; the task's own
                            // length, cut at the deadline.
                            prop_assert!(deadline.is_none_or(|d| lease.granted_at() < d));
                            let full = lease.granted_at() + TimeDelta::from_std(length).unwrap();
                            let expected = deadline.map_or(full, |d| full.min(d));
                            prop_assert_eq!(lease.expires_at(), expected);
                            let number = lease.attempt();
                            let attempt = task.attempt(number).unwrap();
                            prop_assert_eq!(attempt.tries, tries[usize::from(number.as_u16()) - 1] + 1);
                            held.push(lease);
                        }
                        Err(_) => prop_assert!(
                            task.next_claimable_at(now) != Some(now),
                            "a claim refused while the rules say one is claimable now"
                        ),
                    }
                }
                Step::Heartbeat => {
                    if let Some(lease) = held.last() {
                        let before = task
                            .attempt(lease.attempt())
                            .and_then(|a| a.lease.as_ref())
                            .map(|l| l.expires_at);
                        if let Ok(extended) = task.heartbeat(&holder, lease.token(), now, DEFAULT) {
                            prop_assert!(deadline.is_none_or(|d| extended.expires_at() <= d));
                            prop_assert!(before.is_none_or(|b| extended.expires_at() >= b));
                            let reach = now + TimeDelta::from_std(length).unwrap();
                            let reach = deadline.map_or(reach, |d| reach.min(d));
                            prop_assert_eq!(extended.expires_at(), reach.max(before.unwrap()));
                        } else {
                            // Refused only for a lease no longer live.
                            prop_assert!(task.live_lease(lease.attempt(), now).is_none_or(
                                |live| live.token() != lease.token()
                            ));
                        }
                    }
                }
                Step::Snooze(ms) => {
                    if let Some(lease) = held.pop() {
                        let tries = task.attempt(lease.attempt()).unwrap().tries;
                        let snooze = Retry::Snooze(Duration::from_millis(u64::from(ms)));
                        if task.fail(&holder, lease.token(), now, snooze, &mut jitter).is_ok() {
                            // The try the lease took is given back.
                            let after = task.attempt(lease.attempt()).unwrap().tries;
                            prop_assert_eq!(after + 1, tries);
                        }
                    }
                }
                Step::Fail => {
                    if let Some(lease) = held.pop() {
                        let _ = task.fail(&holder, lease.token(), now, Retry::Backoff, &mut jitter);
                    }
                }
                Step::Expire => {
                    let _ = task.expire(now);
                    if deadline.is_some_and(|d| now >= d) {
                        // At the deadline every attempt is final, or holds a
                        // lease that has not expired (impossible unless a
                        // clock stepped back).
                        for attempt in task.attempts() {
                            prop_assert!(
                                attempt.state.is_final(),
                                "attempt {:?} is {:?} past the deadline",
                                attempt.number,
                                attempt.state
                            );
                        }
                        prop_assert_eq!(task.next_claimable_at(now), None);
                    }
                }
            }
            // Every lease stored ends at the deadline at the latest.
            for attempt in task.attempts() {
                if let Some(lease) = &attempt.lease {
                    prop_assert!(deadline.is_none_or(|d| lease.expires_at <= d));
                }
            }
        }
    }
}

#[test]
fn at_the_deadline_a_ready_and_a_lapsed_attempt_end_discarded_deadline_exceeded() {
    let deadline = start() + TimeDelta::seconds(30);
    let spec = TaskSpec {
        alternatives: 2,
        deadline: Some(deadline),
        lease_duration: Some(Duration::from_secs(10)),
        ..TaskSpec::default()
    };
    let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
    let holder = Principal::parse("worker").unwrap();
    // Granted 25 s in, the 10 s lease is cut at the deadline.
    let lease = task
        .claim(&holder, start() + TimeDelta::seconds(25), DEFAULT)
        .unwrap();
    assert_eq!(lease.expires_at(), deadline);
    // A heartbeat cannot carry it past the deadline.
    let extended = task
        .heartbeat(
            &holder,
            lease.token(),
            start() + TimeDelta::seconds(29),
            DEFAULT,
        )
        .unwrap();
    assert_eq!(extended.expires_at(), deadline);
    assert!(
        task.claim(&holder, deadline, DEFAULT).is_err(),
        "no grant at the deadline"
    );
    let changed = task.expire(deadline);
    assert_eq!(changed.len(), 2);
    for attempt in task.attempts() {
        assert_eq!(
            attempt.state,
            TaskState::Discarded {
                reason: DiscardReason::DeadlineExceeded
            }
        );
    }
    // The late holder is fenced off.
    assert!(
        task.heartbeat(&holder, lease.token(), deadline, DEFAULT)
            .is_err()
    );
}

#[test]
fn an_own_lease_length_out_of_bounds_is_refused() {
    for length in [Duration::ZERO, tessera_lease::MAX_LEASE_DURATION * 2] {
        let spec = TaskSpec {
            lease_duration: Some(length),
            ..TaskSpec::default()
        };
        assert!(Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).is_err());
    }
}

#[test]
fn a_discard_reason_reads_the_same_in_serde_and_as_stored() {
    for reason in DiscardReason::ALL {
        let state = TaskState::Discarded { reason };
        let json = serde_json::to_value(state).unwrap();
        assert_eq!(json["reason"], reason.as_str(), "{json}");
        assert_eq!(serde_json::from_value::<TaskState>(json).unwrap(), state);
    }
}

#[test]
fn a_snooze_is_known_again_by_its_delay_and_a_failure_is_not() {
    let start = start();
    let holder = Principal::parse("worker").unwrap();
    let mut jitter = Jitter::seeded(1);
    let mut task = Task::new(
        TaskId::parse("t").unwrap(),
        BriefVersion::FIRST,
        TaskSpec::default(),
    )
    .unwrap();
    let lease = task.claim(&holder, start, DEFAULT).unwrap();
    let delay = Duration::from_secs(30);
    // Snoozed at its grant's own time, and later.
    let state = task
        .fail(
            &holder,
            lease.token(),
            start,
            Retry::Snooze(delay),
            &mut jitter,
        )
        .unwrap();
    let later = start + TimeDelta::minutes(5);
    assert_eq!(
        task.snoozed(&holder, lease.token(), delay, later),
        Some(state)
    );
    assert_eq!(
        task.snoozed(&holder, lease.token(), Duration::from_secs(31), later),
        None
    );
    let other = Principal::parse("other").unwrap();
    assert_eq!(task.snoozed(&other, lease.token(), delay, later), None);
    // A retry asked for by a failure report is no snooze.
    let mut failed = Task::new(
        TaskId::parse("f").unwrap(),
        BriefVersion::FIRST,
        TaskSpec::default(),
    )
    .unwrap();
    let lease = failed.claim(&holder, start, DEFAULT).unwrap();
    failed
        .fail(
            &holder,
            lease.token(),
            start + TimeDelta::seconds(10),
            Retry::After(delay),
            &mut jitter,
        )
        .unwrap();
    assert_eq!(failed.snoozed(&holder, lease.token(), delay, later), None);
}

#[test]
fn a_debounce_longer_than_its_maximum_says_so() {
    let mut unique =
        tessera_lease::Uniqueness::new(tessera_lease::UniqueKey::parse("report").unwrap());
    unique.mode = tessera_lease::UniqueMode::Debounce {
        delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(5),
    };
    let error = unique.validate().unwrap_err().to_string();
    assert!(error.contains("longer than its max_delay"), "{error}");
    assert!(!error.contains("0 seconds"), "{error}");
}
