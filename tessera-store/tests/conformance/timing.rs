//! Each task its own time: a lease length of its own, a deadline, through
//! every claim path (one at a time, a batch, a claim carried by a
//! submission, a partition-limited queue).

use std::num::NonZeroU32;
use std::time::Duration;

use chrono::TimeDelta;
use tessera_store::{
    Claimed, ConcurrencyLimit, DiscardReason, EnqueueOptions, Grant, IdempotencyKey, Output,
    PartitionKey, SubmitRequest, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

const SECOND: Duration = Duration::from_secs(1);

fn length(claimed: &Claimed) -> TimeDelta {
    claimed.lease.expires_at() - claimed.lease.granted_at()
}

fn states(f: &Fixture<'_>, caller: &tessera_store::Caller, task: &TaskRef) -> Vec<TaskState> {
    f.store
        .read_task(caller, task)
        .unwrap()
        .record
        .attempts
        .iter()
        .map(|attempt| attempt.state)
        .collect()
}

const DEADLINE_EXCEEDED: TaskState = TaskState::Discarded {
    reason: DiscardReason::DeadlineExceeded,
};

fn each_claim_grants_a_task_its_own_lease_and_a_heartbeat_extends_by_it(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("mixed"));
    let default = TimeDelta::from_std(f.config().lease_duration()).unwrap();
    let short = EnqueueOptions::default().with_lease_duration(5 * SECOND);
    let long = EnqueueOptions::default().with_lease_duration(20 * 60 * SECOND);
    let enqueue = |n: usize, options: &EnqueueOptions| {
        f.store
            .enqueue(&worker, &ns, &q, &json_brief(n), options)
            .unwrap()
    };
    let (a, b, c, d, e) = (
        enqueue(0, &short),
        enqueue(1, &EnqueueOptions::default()),
        enqueue(2, &long),
        enqueue(3, &short),
        enqueue(4, &EnqueueOptions::default()),
    );
    // One at a time.
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(
        (first.task.clone(), length(&first)),
        (a, TimeDelta::seconds(5))
    );
    let second = f.claim(&worker, &ns, &q);
    assert_eq!((second.task.clone(), length(&second)), (b, default));
    // A batch grants each its own.
    let batch = f.store.claim_batch(&worker, &ns, &q, 2).unwrap().claimed;
    let lengths: Vec<_> = batch.iter().map(|c| (c.task.clone(), length(c))).collect();
    assert_eq!(
        lengths,
        [(c, TimeDelta::minutes(20)), (d, TimeDelta::seconds(5))]
    );
    // A heartbeat extends by the task's own length.
    f.clock.advance(3 * SECOND);
    let beat = f
        .store
        .heartbeat(&worker, &first.task, first.lease.token())
        .unwrap();
    assert_eq!(
        beat.expires_at(),
        tessera_store::Clock::now_utc(&f.clock) + TimeDelta::seconds(5)
    );
    // A claim carried by a submission grants by the same rule.
    let (_, next) = f
        .store
        .submit_and_claim(
            &worker,
            &SubmitRequest {
                task: first.task.clone(),
                token: first.lease.token(),
                key: IdempotencyKey::parse("done").unwrap(),
                output: Output::bytes("ok"),
            },
            &ns,
            &q,
        )
        .unwrap();
    let next = match next.unwrap() {
        tessera_store::ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("{other:?}"),
    };
    assert_eq!((next.task.clone(), length(&next)), (e, default));
    // The short lease lapses on its own time: five seconds after its last
    // heartbeat the task is claimable again, under a newer token.
    f.clock.advance(6 * SECOND);
    let again = f.claim(&worker, &ns, &q);
    assert_eq!(again.task, batch[1].task);
    assert!(again.lease.token() > batch[1].lease.token());
}

fn a_deadline_bounds_grants_and_heartbeats_and_discards_what_is_not_done(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("timed"));
    let timed = EnqueueOptions::default()
        .with_timeout(30 * SECOND)
        .with_max_tries(5);
    let held = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(0), &timed)
        .unwrap();
    let waiting = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(1), &timed)
        .unwrap();
    let plain = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(2), &EnqueueOptions::default())
        .unwrap();
    let deadline = tessera_store::Clock::now_utc(&f.clock) + TimeDelta::seconds(30);
    f.clock.advance(25 * SECOND);
    // Granted five seconds before its deadline, the lease ends at it.
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, held);
    assert_eq!(claimed.lease.expires_at(), deadline);
    f.clock.advance(4 * SECOND);
    let beat = f
        .store
        .heartbeat(&worker, &held, claimed.lease.token())
        .unwrap();
    assert_eq!(beat.expires_at(), deadline, "no heartbeat runs past it");
    // At the deadline: the holder is fenced off, the waiting task is not
    // granted, and the claim takes the plain task behind it.
    f.clock.advance(SECOND);
    let late = f
        .store
        .submit(
            &worker,
            &held,
            claimed.lease.token(),
            &IdempotencyKey::parse("late").unwrap(),
            &Output::bytes("late"),
        )
        .unwrap_err();
    assert_eq!(late.status(), 409, "{late}");
    let next = f.claim(&worker, &ns, &q);
    assert_eq!(next.task, plain);
    assert_eq!(states(&f, &worker, &waiting), [DEADLINE_EXCEEDED]);
    // The held task's lapse is recorded by the same rules: discarded for
    // its deadline, with tries left.
    assert!(matches!(
        f.store.claim(&worker, &ns, &q).unwrap(),
        tessera_store::ClaimOutcome::Empty { .. }
    ));
    assert_eq!(states(&f, &worker, &held), [DEADLINE_EXCEEDED]);
}

fn a_partition_limited_queue_ends_a_task_past_its_deadline_and_grants_the_next(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("parted"));
    f.store
        .set_queue_limits(
            &worker,
            &ns,
            &q,
            ConcurrencyLimit {
                queue: None,
                per_partition: NonZeroU32::new(1),
            },
        )
        .unwrap();
    let key = PartitionKey::parse("customer-1").unwrap();
    let timed = EnqueueOptions::default()
        .with_partition_key(key.clone())
        .with_timeout(10 * SECOND);
    let gone = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(0), &timed)
        .unwrap();
    let kept = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &json_brief(1),
            &EnqueueOptions::default().with_partition_key(key),
        )
        .unwrap();
    f.clock.advance(11 * SECOND);
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, kept);
    assert_eq!(states(&f, &worker, &gone), [DEADLINE_EXCEEDED]);
}

fn a_lease_or_deadline_out_of_bounds_is_refused_and_writes_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("bad"));
    let now = tessera_store::Clock::now_utc(&f.clock);
    let refused = [
        EnqueueOptions::default().with_lease_duration(Duration::ZERO),
        EnqueueOptions::default().with_lease_duration(tessera_store::lease::MAX_LEASE_DURATION * 2),
        EnqueueOptions::default().with_lease_duration(Duration::from_micros(1_500)),
        EnqueueOptions::default().with_deadline(now),
        EnqueueOptions::default().with_deadline(now - TimeDelta::seconds(1)),
        EnqueueOptions::default()
            .with_not_before(now + TimeDelta::seconds(60))
            .with_deadline(now + TimeDelta::seconds(30)),
        EnqueueOptions::default().with_timeout(Duration::ZERO),
    ];
    for options in &refused {
        let error = f
            .store
            .enqueue(&worker, &ns, &q, &json_brief(0), options)
            .unwrap_err();
        assert_eq!(error.status(), 400, "{options:?}: {error}");
    }
    assert_eq!(db.count_rows("tasks"), 0);
}

fn a_snooze_is_fenced_spends_no_try_is_idempotent_and_audited(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let other = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("later"));
    let task = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &json_brief(0),
            &EnqueueOptions::default().with_max_tries(1),
        )
        .unwrap();
    let claimed = f.claim(&worker, &ns, &q);
    let token = claimed.lease.token();
    // Another principal, or a token never granted, snoozes nothing.
    let wrong = f
        .store
        .snooze(&other, &task, token, 10 * SECOND)
        .unwrap_err();
    assert_eq!(wrong.status(), 409, "{wrong}");
    let unknown = f
        .store
        .snooze(
            &worker,
            &task,
            tessera_store::FencingToken::new(token.as_i64() + 1).unwrap(),
            10 * SECOND,
        )
        .unwrap_err();
    assert_eq!(unknown.status(), 409, "{unknown}");
    // On its last try, the snooze hands it back with the try.
    let state = f.store.snooze(&worker, &task, token, 10 * SECOND).unwrap();
    let until = tessera_store::Clock::now_utc(&f.clock) + TimeDelta::seconds(10);
    assert_eq!(state, TaskState::Backoff { until });
    // Retried (its answer lost), it answers the same and changes nothing.
    let before = f.store.read_task(&worker, &task).unwrap().record;
    assert_eq!(
        f.store.snooze(&worker, &task, token, 10 * SECOND).unwrap(),
        state
    );
    assert_eq!(f.store.read_task(&worker, &task).unwrap().record, before);
    assert_eq!(before.attempts[0].tries, 0);
    // Not claimable before the delay, then granted again and done.
    assert!(matches!(
        f.store.claim(&worker, &ns, &q).unwrap(),
        tessera_store::ClaimOutcome::Empty { .. }
    ));
    f.clock.advance(10 * SECOND);
    let again = f.claim(&worker, &ns, &q);
    assert_eq!(again.task, task);
    // Once granted again, the old token's snooze is stale, not a replay.
    let stale = f.store.snooze(&worker, &task, token, SECOND).unwrap_err();
    assert_eq!(stale.status(), 409, "{stale}");
    let done = f
        .store
        .submit(
            &worker,
            &task,
            again.lease.token(),
            &IdempotencyKey::parse("done").unwrap(),
            &Output::bytes("ok"),
        )
        .unwrap();
    assert!(matches!(done, tessera_store::Submitted::Accepted(_)));
    // Audited as a snooze.
    let events = f
        .store
        .audit(
            &f.admin,
            &tessera_store::AuditQuery {
                limit: 100,
                ..tessera_store::AuditQuery::default()
            },
        )
        .unwrap()
        .events;
    let snoozes: Vec<_> = events
        .iter()
        .filter(|event| event.action.as_str() == "snooze")
        .map(|event| event.outcome.as_str())
        .collect();
    assert!(snoozes.contains(&"ok"), "{snoozes:?}");
}

fn a_unique_key_held_by_a_task_past_its_deadline_goes_to_the_next_enqueue(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("unique"));
    let unique = tessera_store::Uniqueness::new(tessera_store::UniqueKey::parse("report").unwrap());
    let timed = EnqueueOptions::default()
        .with_unique(unique.clone())
        .with_timeout(10 * SECOND);
    let plain = EnqueueOptions::default().with_unique(unique);
    let dead = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(0), &timed)
        .unwrap();
    f.clock.advance(11 * SECOND);
    // One at a time: the dead holder ends, and the enqueue makes a task.
    let next = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(1), &plain)
        .unwrap();
    assert!(next.created, "a holder past its deadline holds nothing");
    assert_eq!(states(&f, &worker, &dead.task), [DEADLINE_EXCEEDED]);
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, next.task);
    // And in a batch, likewise.
    let other = tessera_store::Uniqueness::new(tessera_store::UniqueKey::parse("digest").unwrap());
    let gone = f
        .store
        .enqueue_one(
            &worker,
            &ns,
            &q,
            &json_brief(2),
            &EnqueueOptions::default()
                .with_unique(other.clone())
                .with_timeout(10 * SECOND),
        )
        .unwrap();
    f.clock.advance(11 * SECOND);
    let batch = f
        .store
        .enqueue_batch(
            &worker,
            &ns,
            &q,
            &[(json_brief(3), EnqueueOptions::default().with_unique(other))],
        )
        .unwrap();
    assert!(batch[0].created, "{batch:?}");
    assert_ne!(batch[0].task, gone.task);
}

fn a_duplicate_cannot_move_a_waiting_task_past_its_deadline(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("replaced"));
    let mut unique =
        tessera_store::Uniqueness::new(tessera_store::UniqueKey::parse("report").unwrap());
    unique.mode = tessera_store::UniqueMode::Replace;
    let first = f
        .store
        .enqueue_one(
            &worker,
            &ns,
            &q,
            &json_brief(0),
            &EnqueueOptions::default()
                .with_unique(unique.clone())
                .with_timeout(5 * 60 * SECOND),
        )
        .unwrap();
    let later = tessera_store::Clock::now_utc(&f.clock) + TimeDelta::minutes(10);
    let refused = f
        .store
        .enqueue_one(
            &worker,
            &ns,
            &q,
            &json_brief(1),
            &EnqueueOptions::default()
                .with_unique(unique)
                .with_not_before(later),
        )
        .unwrap_err();
    assert_eq!(refused.status(), 400, "{refused}");
    // The waiting task is as it was, and runs.
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, first.task);
}

fn a_snooze_retried_answers_the_same_and_a_failure_is_no_snooze(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("snoozes"));
    let options = EnqueueOptions::default().with_lease_duration(30 * SECOND);
    let snoozed = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(0), &options)
        .unwrap();
    let failed = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(1), &options)
        .unwrap();
    let first = f.claim(&worker, &ns, &q);
    let second = f.claim(&worker, &ns, &q);
    assert_eq!((&first.task, &second.task), (&snoozed, &failed));
    f.clock.advance(10 * SECOND);
    let delay = 10 * 60 * SECOND;
    let state = f
        .store
        .snooze(&worker, &snoozed, first.lease.token(), delay)
        .unwrap();
    // A lease a failure report ended is not snoozed after the fact.
    f.store
        .fail(
            &worker,
            &failed,
            second.lease.token(),
            tessera_store::Retry::After(30 * SECOND),
        )
        .unwrap();
    // Retried long after the lease would have expired: the same answer.
    f.clock.advance(25 * SECOND);
    assert_eq!(
        f.store
            .snooze(&worker, &snoozed, first.lease.token(), delay)
            .unwrap(),
        state
    );
    // Another delay is another snooze, which the lease cannot take now.
    assert_eq!(
        f.store
            .snooze(&worker, &snoozed, first.lease.token(), SECOND)
            .unwrap_err()
            .status(),
        409
    );
    let refused = f
        .store
        .snooze(&worker, &failed, second.lease.token(), 30 * SECOND)
        .unwrap_err();
    assert_eq!(refused.status(), 409, "{refused}");
}

fn a_schedule_takes_no_deadline(db: &TestDb) {
    #[cfg(feature = "schedule")]
    {
        let f = Fixture::new(db);
        let worker = f.login(&f.full_worker(Grant::AllNamespaces));
        let mut spec =
            tessera_store::ScheduleSpec::new(queue("jobs"), "0 3 * * *", "UTC", json_brief(0));
        spec.spec.deadline = Some(tessera_store::Clock::now_utc(&f.clock) + TimeDelta::hours(1));
        let refused = f
            .store
            .put_schedule(
                &worker,
                &namespace("renders"),
                &tessera_store::ScheduleName::parse("nightly").unwrap(),
                &spec,
            )
            .unwrap_err();
        assert_eq!(refused.status(), 400, "{refused}");
    }
    #[cfg(not(feature = "schedule"))]
    let _ = db;
}

conformance! {
    each_claim_grants_a_task_its_own_lease_and_a_heartbeat_extends_by_it,
    a_deadline_bounds_grants_and_heartbeats_and_discards_what_is_not_done,
    a_partition_limited_queue_ends_a_task_past_its_deadline_and_grants_the_next,
    a_lease_or_deadline_out_of_bounds_is_refused_and_writes_nothing,
    a_snooze_is_fenced_spends_no_try_is_idempotent_and_audited,
    a_unique_key_held_by_a_task_past_its_deadline_goes_to_the_next_enqueue,
    a_duplicate_cannot_move_a_waiting_task_past_its_deadline,
    a_snooze_retried_answers_the_same_and_a_failure_is_no_snooze,
    a_schedule_takes_no_deadline,
}
