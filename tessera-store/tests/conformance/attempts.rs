//! Attempt limits: a lapse counts as a try, the last try's lapse or failed
//! retry discards the attempt, the default backoff grows with seeded jitter,
//! and an operator's retry puts a discarded attempt back.

use std::time::Duration;

use tessera_store::lease::StateName;
use tessera_store::limits::{MAX_ERROR_BYTES, MAX_TRIES};
use tessera_store::{
    AuditQuery, Caller, ClaimOutcome, Clock, DiscardReason, EnqueueOptions, Error, Failure, Grant,
    ListOrder, Retry, Scope, TaskCursor, TaskQuery, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

/// Enqueues one task with `tries` tries in `renders/jobs`.
fn try_enqueue(f: &Fixture<'_>, caller: &Caller, tries: u32) -> Result<TaskRef, Error> {
    f.store.enqueue(
        caller,
        &namespace("renders"),
        &queue("jobs"),
        &json_brief(0),
        &EnqueueOptions::default().with_max_tries(tries),
    )
}

/// One task with `tries` tries in `renders/jobs`.
fn enqueue_with_tries(f: &Fixture<'_>, caller: &Caller, tries: u32) -> TaskRef {
    try_enqueue(f, caller, tries).unwrap()
}

fn a_task_whose_every_worker_crashes_is_discarded_after_its_tries(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = enqueue_with_tries(&f, &worker, 3);
    for token in 1..=3 {
        let claimed = f.claim(&worker, &ns, &q);
        assert_eq!(claimed.lease.token().as_i64(), token);
        // The worker crashes: its lease lapses.
        f.clock.advance(Duration::from_secs(61));
    }
    assert!(matches!(
        f.store.claim(&worker, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    let attempt = f.store.read_task(&worker, &task).unwrap().record.attempts[0].clone();
    assert_eq!(
        attempt.state,
        TaskState::Discarded {
            reason: DiscardReason::Lapsed
        }
    );
    assert_eq!(attempt.tries, 3, "every lapse counted as a try");
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!((health.attempts.discarded, health.attempts.ready), (1, 0));

    // An operator retries it: one more try, under a fresh token.
    let retried = f.store.retry_task(&f.admin, &task).unwrap();
    assert_eq!(retried.len(), 1);
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!((&claimed.task, claimed.lease.token().as_i64()), (&task, 4));
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(
        (view.record.attempts[0].tries, view.record.max_tries),
        (4, 4)
    );
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert!(
        events
            .events
            .iter()
            .any(|event| event.action.as_str() == "retry_task"),
        "the retry is audited"
    );
}

fn a_retry_asked_for_on_the_last_try_discards_the_attempt_with_its_error(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = enqueue_with_tries(&f, &worker, 2);

    let first = f.claim(&worker, &ns, &q);
    let failure = Failure::with_error(Retry::After(Duration::ZERO), "disk full");
    let state = f
        .store
        .fail(&worker, &task, first.lease.token(), failure)
        .unwrap();
    assert_eq!(state, TaskState::Ready, "a try is left");

    let second = f.claim(&worker, &ns, &q);
    let failure = Failure::with_error(Retry::Backoff, "disk still full");
    let state = f
        .store
        .fail(&worker, &task, second.lease.token(), failure)
        .unwrap();
    let discarded = TaskState::Discarded {
        reason: DiscardReason::Failed,
    };
    assert_eq!(state, discarded);
    let attempt = f.store.read_task(&worker, &task).unwrap().record.attempts[0].clone();
    assert_eq!(attempt.state, discarded);
    assert_eq!(attempt.last_error.as_deref(), Some("disk still full"));
    // A late call under the discarded lease is refused.
    let late = f
        .store
        .heartbeat(&worker, &task, second.lease.token())
        .unwrap_err();
    assert_eq!(late.status(), 409);

    // An error text past its bound is refused and changes nothing.
    let third = {
        f.store.retry_task(&f.admin, &task).unwrap();
        f.claim(&worker, &ns, &q)
    };
    let long = "x".repeat(MAX_ERROR_BYTES + 1);
    let error = f
        .store
        .fail(
            &worker,
            &task,
            third.lease.token(),
            Failure::with_error(Retry::Never, long),
        )
        .unwrap_err();
    assert_eq!(error.status(), 400);
    assert!(
        f.store
            .heartbeat(&worker, &task, third.lease.token())
            .is_ok()
    );
    f.store
        .fail(&worker, &task, third.lease.token(), Retry::Never)
        .unwrap();
    // Retrying a task with nothing failed or discarded is a conflict.
    f.store.retry_task(&f.admin, &task).unwrap();
    let error = f.store.retry_task(&f.admin, &task).unwrap_err();
    assert_eq!(error.status(), 409);
}

/// The waits the default backoff gives one task's first three failures.
fn default_backoffs(db: &TestDb, seed: u64) -> Vec<Duration> {
    let f = Fixture::with(db, |config| config.with_retry_jitter_seed(seed));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = enqueue_with_tries(&f, &worker, 10);
    let mut waits = Vec::new();
    for _ in 0..3 {
        let claimed = f.claim(&worker, &ns, &q);
        let state = f
            .store
            .fail(&worker, &task, claimed.lease.token(), Retry::Backoff)
            .unwrap();
        let TaskState::Backoff { until } = state else {
            panic!("a default backoff gave {state:?}");
        };
        let wait = (until - f.clock.now_utc()).to_std().unwrap();
        waits.push(wait);
        f.clock.advance(wait);
    }
    waits
}

fn the_default_backoff_doubles_with_jitter_drawn_from_the_seed(db: &TestDb) {
    let waits = default_backoffs(db, 42);
    for (n, wait) in waits.iter().enumerate() {
        let step = Duration::from_secs(1 << n);
        assert!(
            *wait >= step / 2 && *wait <= step,
            "try {}: {wait:?} outside half to all of {step:?}",
            n + 1
        );
    }
    assert_eq!(default_backoffs(&db.fresh(), 42), waits, "the same seed");
}

fn a_try_count_past_the_limit_reads_as_a_corrupt_record(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = enqueue_with_tries(&f, &worker, 3);
    f.claim(&worker, &ns, &q);
    db.set_try_counts(4);
    let error = f.store.read_task(&worker, &task).unwrap_err();
    assert_eq!(error.code(), "corrupt_database");
    // Out-of-range limits are refused at enqueue.
    for tries in [0, MAX_TRIES + 1] {
        let error = try_enqueue(&f, &worker, tries).unwrap_err();
        assert_eq!(error.status(), 400);
    }
}

fn an_upgrade_from_version_one_leaves_every_stored_attempt_a_try(db: &TestDb) {
    let mut f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let busy = enqueue_with_tries(&f, &worker, 20);
    let quiet = enqueue_with_tries(&f, &worker, 20);
    f.claim(&worker, &ns, &q);
    // Version 1 kept no limit: an attempt could have had 30 tries.
    db.set_try_counts(30);
    db.set_schema_version(1);
    f.reopen(f.config());
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let view = f.store.read_task(&worker, &busy).unwrap();
    assert_eq!(
        (view.record.attempts[0].tries, view.record.max_tries),
        (30, 31)
    );
    assert_eq!(
        f.store.read_task(&worker, &quiet).unwrap().record.max_tries,
        31
    );
    // The leased one keeps its lease; the ready one can still be claimed.
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, quiet);
}

fn discarded_tasks_are_listed_a_page_at_a_time_and_retried_from_the_listing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks: Vec<TaskRef> = (0..5).map(|_| enqueue_with_tries(&f, &worker, 1)).collect();
    // Another namespace's dead task is not listed here.
    let elsewhere = f
        .store
        .enqueue(
            &worker,
            &namespace("other"),
            &q,
            &json_brief(0),
            &EnqueueOptions::default().with_max_tries(1),
        )
        .unwrap();
    for _ in &tasks {
        let claimed = f.claim(&worker, &ns, &q);
        f.store
            .fail(
                &worker,
                &claimed.task,
                claimed.lease.token(),
                Retry::Backoff,
            )
            .unwrap();
    }
    let claimed = f.claim(&worker, &namespace("other"), &q);
    assert_eq!(claimed.task, elsewhere);
    f.store
        .fail(&worker, &elsewhere, claimed.lease.token(), Retry::Backoff)
        .unwrap();

    let listed = |order: ListOrder| -> Vec<TaskRef> {
        let mut query = TaskQuery::new(StateName::Discarded);
        query.order = order;
        query.limit = 2;
        let mut seen = Vec::new();
        loop {
            let page = f.store.list_tasks(&worker, &ns, &query).unwrap();
            assert!(page.tasks.len() <= 2);
            for listing in &page.tasks {
                assert_eq!(
                    (listing.tries, listing.state),
                    (
                        1,
                        TaskState::Discarded {
                            reason: DiscardReason::Failed
                        }
                    )
                );
            }
            seen.extend(page.tasks.into_iter().map(|listing| listing.task));
            match page.next {
                // The cursor travels as text.
                Some(next) => query.after = Some(next.to_string().parse().unwrap()),
                None => return seen,
            }
        }
    };
    assert_eq!(listed(ListOrder::Oldest), tasks);
    let mut newest = tasks.clone();
    newest.reverse();
    assert_eq!(listed(ListOrder::Newest), newest);
    let ready = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Ready))
        .unwrap();
    assert_eq!((ready.tasks.len(), ready.next), (0, None));

    // Each listed attempt says when it reached its state.
    let failed_at = Clock::now_utc(&f.clock);
    let mut query = TaskQuery::new(StateName::Discarded);
    query.limit = 1;
    let page = f.store.list_tasks(&worker, &ns, &query).unwrap();
    assert_eq!(page.tasks[0].changed_at, failed_at);

    // Retried from the listing, a task leaves it.
    f.clock.advance(Duration::from_secs(60));
    f.store.retry_task(&f.admin, &tasks[2]).unwrap();
    let mut left = tasks.clone();
    left.remove(2);
    assert_eq!(listed(ListOrder::Oldest), left);
    let page = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Ready))
        .unwrap();
    assert_eq!(page.tasks[0].task, tasks[2]);
    assert_eq!(
        page.tasks[0].changed_at,
        failed_at + chrono::TimeDelta::seconds(60)
    );

    // A listing is a read: audited, and refused without the read scope.
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert!(
        events
            .events
            .iter()
            .any(|event| event.action.as_str() == "list_tasks")
    );
    let claimer = f.login(&f.key(&[Scope::Claim, Scope::Enqueue], Grant::AllNamespaces));
    let error = f
        .store
        .list_tasks(&claimer, &ns, &TaskQuery::new(StateName::Discarded))
        .unwrap_err();
    assert_eq!(error.status(), 403);
    assert_eq!(
        "7".parse::<TaskCursor>().unwrap_err().code(),
        "invalid_input"
    );
}

conformance! {
    a_task_whose_every_worker_crashes_is_discarded_after_its_tries,
    a_retry_asked_for_on_the_last_try_discards_the_attempt_with_its_error,
    the_default_backoff_doubles_with_jitter_drawn_from_the_seed,
    a_try_count_past_the_limit_reads_as_a_corrupt_record,
    an_upgrade_from_version_one_leaves_every_stored_attempt_a_try,
    discarded_tasks_are_listed_a_page_at_a_time_and_retried_from_the_listing,
}
