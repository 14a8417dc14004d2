use std::fmt;

use chrono::TimeDelta;

use super::*;
use crate::digest::Digest;
use crate::error::DurationRule;
use crate::name::IdempotencyKey;
use crate::state::StateName;
use crate::time::MAX_BACKOFF;

const LEASE: Duration = Duration::from_secs(30);

fn t0() -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse().unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    t0() + TimeDelta::seconds(seconds)
}

fn who(name: &str) -> Principal {
    Principal::parse(name).unwrap()
}

fn token(value: i64) -> FencingToken {
    FencingToken::new(value).unwrap()
}

fn task_with(spec: TaskSpec) -> Task {
    Task::new(TaskId::parse("task-1").unwrap(), BriefVersion::FIRST, spec).unwrap()
}

fn task() -> Task {
    task_with(TaskSpec::default())
}

fn alternatives(n: u16) -> Task {
    task_with(TaskSpec {
        alternatives: n,
        ..TaskSpec::default()
    })
}

fn submission(principal: &str, token: FencingToken, key: &str, digest: u8) -> Submission {
    Submission {
        principal: who(principal),
        token,
        key: IdempotencyKey::parse(key).unwrap(),
        digest: Digest::from_bytes([digest; 32]),
    }
}

fn accept(task: &mut Task, sub: &Submission, now: DateTime<Utc>) -> Receipt {
    match task.submit(sub, None, now) {
        Ok(Submitted::Accepted(receipt)) => receipt,
        other => panic!("expected acceptance, got {other:?}"),
    }
}

/// Runs a rule that must fail and checks that it changed nothing.
fn refused<T: fmt::Debug>(
    task: &mut Task,
    rule: impl FnOnce(&mut Task) -> Result<T, LeaseError>,
) -> LeaseError {
    let before = task.clone();
    let err = rule(task).expect_err("the rule must refuse");
    assert_eq!(*task, before, "a refused rule changed the task");
    err
}

fn state(task: &Task, n: u16) -> TaskState {
    task.attempt(AttemptNumber::new(n).unwrap()).unwrap().state
}

// -- creation --------------------------------------------------------

#[test]
fn a_new_task_has_every_attempt_ready_and_no_token() {
    let task = alternatives(3);
    assert_eq!(task.attempts().len(), 3);
    assert!(task.attempts().iter().all(|a| a.state == TaskState::Ready));
    assert_eq!(task.last_token(), None);
    assert!(!task.is_finished());
    assert_eq!(task.next_claimable_at(t0()), Some(t0()));
}

#[test]
fn alternatives_and_lapse_backoff_are_bounded() {
    let id = TaskId::parse("t").unwrap();
    for n in [0, MAX_ALTERNATIVES + 1] {
        let spec = TaskSpec {
            alternatives: n,
            ..TaskSpec::default()
        };
        assert!(matches!(
            Task::new(id.clone(), BriefVersion::FIRST, spec),
            Err(LeaseError::OutOfRange {
                field: Field::Alternatives,
                ..
            })
        ));
    }
    let spec = TaskSpec {
        lapse_backoff: MAX_BACKOFF * 2,
        ..TaskSpec::default()
    };
    assert!(Task::new(id, BriefVersion::FIRST, spec).is_err());
    assert!(BriefVersion::new(0).is_err());
}

// -- claim -----------------------------------------------------------

#[test]
fn claim_leases_a_ready_attempt_under_the_first_token() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    assert_eq!(lease.token(), FencingToken::FIRST);
    assert_eq!(lease.attempt(), AttemptNumber::FIRST);
    assert_eq!(lease.holder(), &who("a"));
    assert_eq!(lease.granted_at(), t0());
    assert_eq!(lease.expires_at(), at(30));
    assert_eq!(state(&task, 1), TaskState::Leased);
    assert_eq!(task.attempts()[0].tries, 1);
    assert_eq!(task.last_token(), Some(FencingToken::FIRST));
    assert_eq!(task.live_lease(AttemptNumber::FIRST, at(29)), Some(lease));
    assert_eq!(task.live_lease(AttemptNumber::FIRST, at(30)), None);
}

#[test]
fn claim_of_a_held_task_says_when_it_may_lapse() {
    let mut task = task();
    task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| t.claim(&who("b"), at(10), LEASE));
    assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(30) });
}

#[test]
fn claim_rejects_zero_and_overlong_durations() {
    let mut task = task();
    let err = refused(&mut task, |t| t.claim(&who("a"), t0(), Duration::ZERO));
    assert_eq!(
        err,
        LeaseError::InvalidDuration {
            field: Field::LeaseDuration,
            rule: DurationRule::Zero
        }
    );
    let err = refused(&mut task, |t| {
        t.claim(&who("a"), t0(), crate::MAX_LEASE_DURATION * 2)
    });
    assert!(matches!(
        err,
        LeaseError::InvalidDuration {
            rule: DurationRule::TooLong { .. },
            ..
        }
    ));
}

#[test]
fn claim_of_a_finished_task_is_refused() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
    assert!(task.is_finished());
    assert_eq!(task.next_claimable_at(at(2)), None);
    let err = refused(&mut task, |t| t.claim(&who("b"), at(2), LEASE));
    assert_eq!(err, LeaseError::TaskFinished);
}

#[test]
fn a_lapsed_lease_is_claimed_again_under_a_higher_token() {
    let mut task = task();
    let first = task.claim(&who("a"), t0(), LEASE).unwrap();
    let second = task.claim(&who("b"), at(30), LEASE).unwrap();
    assert!(second.token() > first.token());
    assert_eq!(second.holder(), &who("b"));
    assert_eq!(task.attempts()[0].tries, 2);
}

#[test]
fn lapse_backoff_delays_the_next_claim() {
    let mut task = task_with(TaskSpec {
        lapse_backoff: Duration::from_secs(60),
        ..TaskSpec::default()
    });
    task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| t.claim(&who("b"), at(45), LEASE));
    assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(90) });
    assert_eq!(
        task.claim(&who("b"), at(90), LEASE).unwrap().token(),
        token(2)
    );
}

#[test]
fn claim_refuses_when_tokens_are_exhausted() {
    let mut record = task().into_record();
    record.last_token = Some(token(i64::MAX));
    let mut task = Task::restore(record).unwrap();
    let err = refused(&mut task, |t| t.claim(&who("a"), t0(), LEASE));
    assert_eq!(err, LeaseError::TokensExhausted);
}

#[test]
fn claim_refuses_an_expiry_past_the_end_of_time() {
    let mut task = task();
    let err = refused(&mut task, |t| {
        t.claim(&who("a"), DateTime::<Utc>::MAX_UTC, LEASE)
    });
    assert_eq!(err, LeaseError::TimeOutOfRange);
}

// -- competing attempts ---------------------------------------------

#[test]
fn competing_attempts_each_get_their_own_lease_and_token() {
    let mut task = alternatives(3);
    let leases: Vec<Lease> = ["a", "b", "c"]
        .iter()
        .map(|w| task.claim(&who(w), t0(), LEASE).unwrap())
        .collect();
    let numbers: Vec<u16> = leases.iter().map(|l| l.attempt().as_u16()).collect();
    assert_eq!(numbers, [1, 2, 3]);
    let tokens: Vec<i64> = leases.iter().map(|l| l.token().as_i64()).collect();
    assert_eq!(tokens, [1, 2, 3]);
    assert_ne!(leases[0].artifact(), leases[1].artifact());
    let err = refused(&mut task, |t| t.claim(&who("d"), at(1), LEASE));
    assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(30) });
}

#[test]
fn one_attempt_lapsing_never_touches_another() {
    let mut task = alternatives(2);
    let a = task.claim(&who("a"), t0(), LEASE).unwrap();
    let b = task.claim(&who("b"), at(10), LEASE).unwrap();
    // a lapses at 30 while b holds until 40; only a is claimable again.
    let c = task.claim(&who("c"), at(35), LEASE).unwrap();
    assert_eq!(c.attempt(), a.attempt());
    assert_eq!(c.token(), token(3));
    // b still submits under its own token although the task's last is 3.
    let receipt = accept(&mut task, &submission("b", b.token(), "kb", 2), at(36));
    assert_eq!(receipt.attempt, b.attempt());
    assert_eq!(state(&task, 1), TaskState::Leased);
    assert_eq!(state(&task, 2), TaskState::Done);
    // a's own lapsed token is stale now that its attempt was granted again.
    let err = refused(&mut task, |t| {
        t.submit(&submission("a", a.token(), "ka", 1), None, at(36))
    });
    assert_eq!(err, LeaseError::StaleToken { token: a.token() });
}

// -- heartbeat -------------------------------------------------------

#[test]
fn heartbeat_extends_from_now() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let extended = task
        .heartbeat(&who("a"), lease.token(), at(20), LEASE)
        .unwrap();
    assert_eq!(extended.expires_at(), at(50));
    assert_eq!(extended.token(), lease.token());
    assert_eq!(extended.granted_at(), t0());
}

#[test]
fn heartbeat_never_moves_expiry_into_the_past() {
    let mut task = task();
    let lease = task.claim(&who("a"), at(100), LEASE).unwrap();
    // The clock stepped back 60 s: now + extension lies before the expiry.
    let kept = task
        .heartbeat(&who("a"), lease.token(), at(40), Duration::from_secs(5))
        .unwrap();
    assert_eq!(kept.expires_at(), at(130));
}

#[test]
fn heartbeat_at_or_after_expiry_is_refused() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), lease.token(), at(30), LEASE)
    });
    assert_eq!(
        err,
        LeaseError::LeaseExpired {
            token: lease.token(),
            expired_at: at(30)
        }
    );
    // Also after a sweep made the attempt ready.
    assert_eq!(task.expire(at(31)), [AttemptNumber::FIRST]);
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), lease.token(), at(31), LEASE)
    });
    assert!(matches!(err, LeaseError::LeaseExpired { .. }));
}

#[test]
fn heartbeat_by_another_holder_is_refused() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("b"), lease.token(), at(1), LEASE)
    });
    assert_eq!(
        err,
        LeaseError::WrongHolder {
            token: lease.token()
        }
    );
}

#[test]
fn heartbeat_with_a_stale_or_unknown_token_is_refused() {
    let mut task = task();
    let old = task.claim(&who("a"), t0(), LEASE).unwrap();
    task.claim(&who("a"), at(30), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), old.token(), at(31), LEASE)
    });
    assert_eq!(err, LeaseError::StaleToken { token: old.token() });
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), token(3), at(31), LEASE)
    });
    assert_eq!(err, LeaseError::UnknownToken { token: token(3) });
}

#[test]
fn heartbeat_after_the_lease_ended_is_refused() {
    let mut task = alternatives(3);
    let done = task.claim(&who("a"), t0(), LEASE).unwrap();
    let failed = task.claim(&who("a"), t0(), LEASE).unwrap();
    let retried = task.claim(&who("a"), t0(), LEASE).unwrap();
    accept(&mut task, &submission("a", done.token(), "k", 1), at(1));
    task.fail(
        &who("a"),
        failed.token(),
        at(1),
        Retry::Never,
        &mut Jitter::seeded(0),
    )
    .unwrap();
    task.fail(
        &who("a"),
        retried.token(),
        at(1),
        Retry::After(Duration::from_secs(60)),
        &mut Jitter::seeded(0),
    )
    .unwrap();
    for (lease, name) in [
        (&done, StateName::Done),
        (&failed, StateName::Failed),
        (&retried, StateName::Backoff),
    ] {
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), lease.token(), at(2), LEASE)
        });
        assert_eq!(
            err,
            LeaseError::LeaseEnded {
                token: lease.token(),
                attempt: lease.attempt(),
                state: name
            }
        );
    }
}

#[test]
fn heartbeat_rejects_a_zero_extension() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), lease.token(), at(1), Duration::ZERO)
    });
    assert_eq!(
        err,
        LeaseError::InvalidDuration {
            field: Field::Extension,
            rule: DurationRule::Zero
        }
    );
}

// -- submit ----------------------------------------------------------

#[test]
fn submit_finishes_the_attempt_and_names_everything_in_the_receipt() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let sub = submission("a", lease.token(), "k1", 5);
    let receipt = accept(&mut task, &sub, at(10));
    assert_eq!(receipt.task, *task.id());
    assert_eq!(receipt.version, BriefVersion::FIRST);
    assert_eq!(receipt.attempt, AttemptNumber::FIRST);
    assert_eq!(receipt.token, lease.token());
    assert_eq!(receipt.principal, who("a"));
    assert_eq!(receipt.idempotency_key, sub.key);
    assert_eq!(receipt.artifact, lease.artifact());
    assert_eq!(receipt.digest, sub.digest);
    assert_eq!(receipt.accepted_at, at(10));
    assert_eq!(state(&task, 1), TaskState::Done);
    assert_eq!(task.live_lease(AttemptNumber::FIRST, at(10)), None);
}

#[test]
fn a_receipt_is_never_dated_before_its_grant() {
    let mut task = task();
    let lease = task.claim(&who("a"), at(100), LEASE).unwrap();
    let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(90));
    assert_eq!(receipt.accepted_at, at(100));
}

#[test]
fn same_key_and_digest_replays_without_changing_anything() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let sub = submission("a", lease.token(), "k", 1);
    let receipt = accept(&mut task, &sub, at(1));
    let before = task.clone();
    // Long after the lease would have lapsed.
    let replay = task.submit(&sub, Some(&receipt), at(1000)).unwrap();
    assert_eq!(replay, Submitted::Replayed(receipt.clone()));
    assert_eq!(task, before);
}

#[test]
fn same_key_with_another_digest_conflicts() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
    let err = refused(&mut task, |t| {
        t.submit(
            &submission("a", lease.token(), "k", 2),
            Some(&receipt),
            at(2),
        )
    });
    assert_eq!(err, LeaseError::IdempotencyConflict);
}

#[test]
fn a_stored_receipt_of_another_scope_is_misuse() {
    let mut task = alternatives(2);
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
    let other = task.claim(&who("b"), at(1), LEASE).unwrap();
    for sub in [
        submission("b", other.token(), "k", 1),
        submission("a", other.token(), "other-key", 1),
    ] {
        let err = refused(&mut task, |t| t.submit(&sub, Some(&receipt), at(2)));
        assert_eq!(err, LeaseError::ReceiptMismatch);
    }
}

#[test]
fn a_done_attempt_refuses_a_second_result() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    accept(&mut task, &submission("a", lease.token(), "k1", 1), at(1));
    let err = refused(&mut task, |t| {
        t.submit(&submission("a", lease.token(), "k2", 2), None, at(2))
    });
    assert_eq!(
        err,
        LeaseError::LeaseEnded {
            token: lease.token(),
            attempt: AttemptNumber::FIRST,
            state: StateName::Done
        }
    );
}

#[test]
fn submit_refuses_expired_foreign_stale_and_unknown_tokens() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.submit(&submission("a", lease.token(), "k", 1), None, at(30))
    });
    assert!(matches!(err, LeaseError::LeaseExpired { .. }));
    let err = refused(&mut task, |t| {
        t.submit(&submission("b", lease.token(), "k", 1), None, at(1))
    });
    assert!(matches!(err, LeaseError::WrongHolder { .. }));
    let err = refused(&mut task, |t| {
        t.submit(&submission("a", token(2), "k", 1), None, at(1))
    });
    assert!(matches!(err, LeaseError::UnknownToken { .. }));
    task.claim(&who("b"), at(31), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.submit(&submission("a", lease.token(), "k", 1), None, at(32))
    });
    assert!(matches!(err, LeaseError::StaleToken { .. }));
}

// -- fail ------------------------------------------------------------

#[test]
fn fail_never_is_final() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let state = task
        .fail(
            &who("a"),
            lease.token(),
            at(1),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(state, TaskState::Failed);
    assert!(task.is_finished());
    assert_eq!(
        refused(&mut task, |t| t.claim(&who("b"), at(2), LEASE)),
        LeaseError::TaskFinished
    );
}

#[test]
fn fail_with_backoff_waits_then_grants_a_higher_token() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let state = task
        .fail(
            &who("a"),
            lease.token(),
            at(5),
            Retry::After(Duration::from_secs(60)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(state, TaskState::Backoff { until: at(65) });
    assert_eq!(
        refused(&mut task, |t| t.claim(&who("b"), at(64), LEASE)),
        LeaseError::NoAttemptReady { next_at: at(65) }
    );
    assert_eq!(
        task.claim(&who("b"), at(65), LEASE).unwrap().token(),
        token(2)
    );
}

#[test]
fn fail_with_zero_backoff_is_ready_at_once() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let state = task
        .fail(
            &who("a"),
            lease.token(),
            at(5),
            Retry::After(Duration::ZERO),
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(state, TaskState::Ready);
    assert_eq!(
        task.claim(&who("a"), at(5), LEASE).unwrap().token(),
        token(2)
    );
}

#[test]
fn fail_refuses_overlong_backoff_and_bad_tokens() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let err = refused(&mut task, |t| {
        t.fail(
            &who("a"),
            lease.token(),
            at(1),
            Retry::After(MAX_BACKOFF * 2),
            &mut Jitter::seeded(0),
        )
    });
    assert!(matches!(
        err,
        LeaseError::InvalidDuration {
            field: Field::Backoff,
            ..
        }
    ));
    let err = refused(&mut task, |t| {
        t.fail(
            &who("b"),
            lease.token(),
            at(1),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
    });
    assert!(matches!(err, LeaseError::WrongHolder { .. }));
    let err = refused(&mut task, |t| {
        t.fail(
            &who("a"),
            lease.token(),
            at(30),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
    });
    assert!(matches!(err, LeaseError::LeaseExpired { .. }));
}

// -- expire ----------------------------------------------------------

#[test]
fn expire_makes_a_lapsed_attempt_ready_and_leaves_live_ones() {
    let mut task = alternatives(2);
    task.claim(&who("a"), t0(), LEASE).unwrap();
    task.claim(&who("b"), at(10), LEASE).unwrap();
    assert!(task.expire(at(29)).is_empty());
    assert_eq!(task.expire(at(30)), [AttemptNumber::FIRST]);
    assert_eq!(state(&task, 1), TaskState::Ready);
    assert_eq!(state(&task, 2), TaskState::Leased);
    assert!(
        task.expire(at(30)).is_empty(),
        "a second sweep writes nothing"
    );
}

#[test]
fn expire_applies_the_lapse_backoff_from_the_lapse() {
    let spec = TaskSpec {
        lapse_backoff: Duration::from_secs(60),
        ..TaskSpec::default()
    };
    let mut task = task_with(spec);
    task.claim(&who("a"), t0(), LEASE).unwrap();
    let _ = task.expire(at(40));
    assert_eq!(state(&task, 1), TaskState::Backoff { until: at(90) });
    assert_eq!(task.expire(at(90)), [AttemptNumber::FIRST]);
    assert_eq!(state(&task, 1), TaskState::Ready);
    // A late sweep goes straight to ready, as a claim would see it.
    let mut late = task_with(spec);
    late.claim(&who("a"), t0(), LEASE).unwrap();
    let _ = late.expire(at(500));
    assert_eq!(state(&late, 1), TaskState::Ready);
}

#[test]
fn expire_ends_elapsed_backoffs_only() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    task.fail(
        &who("a"),
        lease.token(),
        at(1),
        Retry::After(Duration::from_secs(10)),
        &mut Jitter::seeded(0),
    )
    .unwrap();
    assert!(task.expire(at(10)).is_empty());
    assert_eq!(task.expire(at(11)), [AttemptNumber::FIRST]);
    assert_eq!(state(&task, 1), TaskState::Ready);
}

#[test]
fn a_recorded_lapse_survives_the_clock_stepping_back() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    let _ = task.expire(at(30));
    let err = refused(&mut task, |t| {
        t.heartbeat(&who("a"), lease.token(), at(25), LEASE)
    });
    assert_eq!(
        err,
        LeaseError::LeaseEnded {
            token: lease.token(),
            attempt: AttemptNumber::FIRST,
            state: StateName::Ready
        }
    );
    assert_eq!(task.live_lease(AttemptNumber::FIRST, at(25)), None);
}

#[test]
fn expire_leaves_final_attempts_alone() {
    let mut task = task();
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
    assert!(task.expire(at(10_000)).is_empty());
    assert_eq!(state(&task, 1), TaskState::Done);
}

// -- alternatives ----------------------------------------------------

#[test]
fn alternatives_lists_each_finished_attempt_once_in_order() {
    let mut task = alternatives(3);
    let l1 = task.claim(&who("a"), t0(), LEASE).unwrap();
    let l2 = task.claim(&who("b"), t0(), LEASE).unwrap();
    let l3 = task.claim(&who("c"), t0(), LEASE).unwrap();
    let r2 = accept(&mut task, &submission("b", l2.token(), "k", 2), at(1));
    let r1 = accept(&mut task, &submission("a", l1.token(), "k", 1), at(2));
    task.fail(
        &who("c"),
        l3.token(),
        at(3),
        Retry::Never,
        &mut Jitter::seeded(0),
    )
    .unwrap();
    let mut foreign = r1.clone();
    foreign.task = TaskId::parse("other").unwrap();
    let mut old_version = r1.clone();
    old_version.version = BriefVersion::new(2).unwrap();
    let mut stale = r2.clone();
    stale.token = token(9);
    let stored = [
        r2.clone(),
        foreign,
        r1.clone(),
        old_version,
        stale,
        r2.clone(),
    ];
    assert_eq!(task.alternatives(&stored), [&r1, &r2]);
    assert!(task.is_finished());
}

// -- records ---------------------------------------------------------

#[test]
fn records_round_trip_through_restore_and_serde() {
    let mut task = alternatives(2);
    let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
    task.fail(
        &who("a"),
        lease.token(),
        at(1),
        Retry::After(Duration::from_secs(5)),
        &mut Jitter::seeded(0),
    )
    .unwrap();
    task.claim(&who("b"), at(2), LEASE).unwrap();
    assert_eq!(Task::restore(task.record().clone()).unwrap(), task);
    let json = serde_json::to_string(&task).unwrap();
    assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), task);
}

#[test]
fn restore_rejects_each_broken_invariant() {
    let mut base = alternatives(2);
    base.claim(&who("a"), t0(), LEASE).unwrap();
    base.claim(&who("b"), t0(), LEASE).unwrap();
    let base = base.into_record();
    type Breakage = fn(&mut TaskRecord);
    let breakages: [(&str, Breakage); 9] = [
        ("no attempts", |r| r.attempts.clear()),
        ("misnumbered", |r| {
            r.attempts[1].number = AttemptNumber::FIRST
        }),
        ("leased without lease", |r| r.attempts[0].lease = None),
        ("untried lease", |r| r.attempts[0].tries = 0),
        ("token above last", |r| r.last_token = Some(token(1))),
        ("no last token", |r| r.last_token = None),
        ("shared token", |r| {
            let lease = r.attempts[0].lease.clone();
            r.attempts[1].lease = lease;
        }),
        ("empty lease", |r| {
            let lease = r.attempts[0].lease.as_mut().unwrap();
            lease.expires_at = lease.granted_at;
        }),
        ("long backoff", |r| r.lapse_backoff = MAX_BACKOFF * 2),
    ];
    for (name, breakage) in breakages {
        let mut record = base.clone();
        breakage(&mut record);
        assert!(
            matches!(Task::restore(record), Err(LeaseError::InvalidRecord { .. })),
            "{name} was accepted"
        );
    }
    assert!(Task::restore(base).is_ok());
}

#[test]
fn a_snooze_gives_its_try_back_on_any_try() {
    let mut task = task_with(TaskSpec {
        max_tries: 1,
        ..TaskSpec::default()
    });
    let one = AttemptNumber::new(1).unwrap();
    // Snoozed on its one try, again and again: never discarded.
    for round in 0..3 {
        let lease = task.claim(&who("w"), at(round * 100), LEASE).unwrap();
        assert_eq!(task.attempt(one).unwrap().tries, 1);
        let state = task
            .fail(
                &who("w"),
                lease.token(),
                at(round * 100 + 1),
                Retry::Snooze(Duration::ZERO),
                &mut Jitter::seeded(0),
            )
            .unwrap();
        assert_eq!(state, TaskState::Ready);
        assert_eq!(task.attempt(one).unwrap().tries, 0);
        // The stored record reads back.
        Task::restore(task.record().clone()).unwrap();
        // The old token is done with: its lease ended at the snooze.
        assert!(matches!(
            task.heartbeat(&who("w"), lease.token(), at(round * 100 + 2), LEASE),
            Err(LeaseError::LeaseEnded { .. } | LeaseError::LeaseExpired { .. })
        ));
    }
    // With a delay it waits, then is claimed under a new token.
    let lease = task.claim(&who("w"), at(1_000), LEASE).unwrap();
    let state = task
        .fail(
            &who("w"),
            lease.token(),
            at(1_001),
            Retry::Snooze(Duration::from_secs(60)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(state, TaskState::Backoff { until: at(1_061) });
    assert_eq!(task.next_claimable_at(at(1_001)), Some(at(1_061)));
    let next = task.claim(&who("v"), at(1_061), LEASE).unwrap();
    assert!(next.token() > lease.token());
    // A failure on the try it gave back is its last try again.
    let state = task
        .fail(
            &who("v"),
            next.token(),
            at(1_062),
            Retry::Backoff,
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(
        state,
        TaskState::Discarded {
            reason: DiscardReason::Failed
        }
    );
    // A snooze past the longest backoff is refused.
    let mut task = task_with(TaskSpec::default());
    let lease = task.claim(&who("w"), at(0), LEASE).unwrap();
    assert!(
        task.fail(
            &who("w"),
            lease.token(),
            at(1),
            Retry::Snooze(MAX_BACKOFF + Duration::from_secs(1)),
            &mut Jitter::seeded(0),
        )
        .is_err()
    );
}

/// A task enqueued after parents, with `alternatives` attempts.
fn waiting_child(alternatives: u16, not_before: Option<DateTime<Utc>>) -> Task {
    task_with(TaskSpec {
        alternatives,
        not_before,
        waits: true,
        ..TaskSpec::default()
    })
}

#[test]
fn a_waiting_task_is_never_claimed_until_unblocked() {
    let mut child = waiting_child(2, None);
    assert!(
        child
            .record()
            .attempts
            .iter()
            .all(|a| a.state.name() == StateName::Waiting)
    );
    assert_eq!(child.record().claimable_at(), None);
    assert_eq!(child.next_claimable_at(at(0)), None);
    assert!(child.claim(&who("w"), at(0), LEASE).is_err());
    assert!(child.expire(at(3600)).is_empty());
    assert_eq!(child.end(), None);
    assert_eq!(
        child.unblock(at(1)),
        vec![AttemptNumber(1), AttemptNumber(2)]
    );
    assert!(child.unblock(at(1)).is_empty(), "unblocked once");
    assert_eq!(child.next_claimable_at(at(1)), Some(at(1)));
    child.claim(&who("w"), at(1), LEASE).unwrap();
}

#[test]
fn a_waiting_task_keeps_its_not_before_for_when_it_is_unblocked() {
    let mut late = waiting_child(1, Some(at(60)));
    assert_eq!(late.record().attempts[0].state.until(), Some(at(60)));
    assert_eq!(late.unblock(at(10)), vec![AttemptNumber(1)]);
    assert_eq!(
        late.record().attempts[0].state,
        TaskState::Scheduled { at: at(60) }
    );
    assert!(late.claim(&who("w"), at(30), LEASE).is_err());
    late.claim(&who("w"), at(60), LEASE).unwrap();
    // Past its not-before time already: ready at once.
    let mut due = waiting_child(1, Some(at(5)));
    let _ = due.unblock(at(10));
    assert_eq!(due.record().attempts[0].state, TaskState::Ready);
}

#[test]
fn a_duplicate_reschedules_a_waiting_task_without_ending_its_wait() {
    let mut child = waiting_child(1, None);
    assert!(child.is_waiting());
    child.reschedule(Some(at(30))).unwrap();
    assert_eq!(
        child.record().attempts[0].state,
        TaskState::Waiting {
            not_before: Some(at(30))
        }
    );
    assert!(child.claim(&who("w"), at(40), LEASE).is_err());
}

#[test]
fn a_failed_parent_cancels_only_what_still_waits() {
    let mut child = waiting_child(2, None);
    assert_eq!(
        child.cancel_waiting(),
        vec![AttemptNumber(1), AttemptNumber(2)]
    );
    for attempt in &child.record().attempts {
        assert_eq!(attempt.state, TaskState::Cancelled);
        assert_eq!(attempt.last_error.as_deref(), Some(PARENT_FAILED));
    }
    assert_eq!(child.end(), Some(ParentEnd::Cancelled));
    assert!(child.cancel_waiting().is_empty());
    assert!(child.unblock(at(0)).is_empty());
    // An operator's retry runs it anyway.
    child.retry().unwrap();
    child.claim(&who("w"), at(0), LEASE).unwrap();
    // A task that no longer waits is left alone.
    let mut ready = task();
    assert!(ready.cancel_waiting().is_empty());
    assert_eq!(ready.record().attempts[0].state, TaskState::Ready);
}

#[test]
fn a_deadline_discards_a_waiting_task() {
    let mut child = task_with(TaskSpec {
        waits: true,
        deadline: Some(at(10)),
        ..TaskSpec::default()
    });
    assert!(child.expire(at(5)).is_empty());
    assert_eq!(child.expire(at(10)), vec![AttemptNumber(1)]);
    assert_eq!(
        child.record().attempts[0].state,
        TaskState::Discarded {
            reason: DiscardReason::DeadlineExceeded
        }
    );
    assert_eq!(child.end(), Some(ParentEnd::Failed));
}

#[test]
fn a_task_ends_done_once_an_attempt_is_done_and_every_attempt_is_final() {
    let mut parent = alternatives(3);
    let first = parent.claim(&who("a"), at(0), LEASE).unwrap();
    let second = parent.claim(&who("b"), at(0), LEASE).unwrap();
    accept(&mut parent, &submission("a", first.token(), "k", 1), at(1));
    assert_eq!(parent.end(), None, "two attempts are not final");
    parent
        .fail(
            &who("b"),
            second.token(),
            at(2),
            Failure::with_error(Retry::Never, "no"),
            &mut Jitter::seeded(0),
        )
        .unwrap();
    assert_eq!(parent.end(), None);
    parent.cancel().unwrap();
    assert_eq!(parent.end(), Some(ParentEnd::Done));

    let mut failed = alternatives(2);
    let lease = failed.claim(&who("a"), at(0), LEASE).unwrap();
    failed
        .fail(
            &who("a"),
            lease.token(),
            at(1),
            Failure::with_error(Retry::Never, "no"),
            &mut Jitter::seeded(0),
        )
        .unwrap();
    failed.cancel().unwrap();
    assert_eq!(failed.end(), Some(ParentEnd::Failed));

    let mut cancelled = alternatives(2);
    cancelled.cancel().unwrap();
    assert_eq!(cancelled.end(), Some(ParentEnd::Cancelled));
}

#[test]
fn a_waiting_record_round_trips_and_restores() {
    let child = waiting_child(2, Some(at(5)));
    let json = serde_json::to_string(&child).unwrap();
    assert!(json.contains(r#""state":"waiting""#), "{json}");
    assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), child);
}

mod waiting_on_parents {
    use proptest::prelude::*;

    use super::*;
    use crate::dependency::{RunAfter, Unblocked, Waiting};

    fn ends() -> impl Strategy<Value = ParentEnd> {
        prop_oneof![
            3 => Just(ParentEnd::Done),
            1 => Just(ParentEnd::Failed),
            1 => Just(ParentEnd::Cancelled),
        ]
    }

    proptest! {
        /// A child task driven by its count of parents: never claimable
        /// while the count says it waits; ready once, on the last parent,
        /// when the count says so; cancelled with `parent_failed` when it
        /// says so; and whatever comes after changes nothing.
        #[test]
        fn a_child_runs_or_is_cancelled_as_its_parents_decide(
            alternatives in 1_u16..4,
            parents in proptest::collection::vec(ends(), 1..6),
            any_outcome in any::<bool>(),
            delay in proptest::option::of(0_i64..120),
        ) {
            let run_after = if any_outcome { RunAfter::AnyOutcome } else { RunAfter::AllDone };
            let not_before = delay.map(at);
            let mut child = waiting_child(alternatives, not_before);
            let mut count = match Waiting::at_enqueue(parents.len(), &[], run_after).unwrap() {
                Unblocked::Waiting(count) => count,
                other => panic!("{other:?}"),
            };
            let now = at(60);
            let mut settled = false;
            for end in parents {
                prop_assert!(child.claim(&who("w"), now, LEASE).is_err());
                prop_assert_eq!(child.record().claimable_at(), None);
                match count.on_parent_end(end).unwrap() {
                    Unblocked::Waiting(next) => count = next,
                    Unblocked::Ready => {
                        prop_assert!(!settled);
                        settled = true;
                        prop_assert_eq!(child.unblock(now).len(), usize::from(alternatives));
                        let claimable = not_before.is_none_or(|at| at <= now);
                        prop_assert_eq!(child.claim(&who("w"), now, LEASE).is_ok(), claimable);
                        break;
                    }
                    Unblocked::Cancelled => {
                        prop_assert!(!settled);
                        settled = true;
                        prop_assert!(!any_outcome);
                        prop_assert_eq!(child.cancel_waiting().len(), usize::from(alternatives));
                        prop_assert_eq!(child.end(), Some(ParentEnd::Cancelled));
                        break;
                    }
                }
            }
            prop_assert!(settled, "the last parent settles the child");
            prop_assert!(child.unblock(now).is_empty());
            prop_assert!(child.cancel_waiting().is_empty());
        }
    }
}
