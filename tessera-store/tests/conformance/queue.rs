//! Scheduled runs, priorities, cancel and batches, through the public API.

use std::time::Duration;

use tessera_store::lease::StateName;
use tessera_store::limits::{MAX_CLAIM_BATCH, MAX_ENQUEUE_BATCH, MAX_PRIORITY};
use tessera_store::{
    AuditQuery, Brief, Caller, ClaimOutcome, Clock, EnqueueOptions, Grant, Output, Retry, Scope,
    TaskQuery, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue, task_id};

/// Enqueues task `n` into `renders/jobs` with `options`.
fn enqueue(f: &Fixture<'_>, caller: &Caller, n: usize, options: EnqueueOptions) -> TaskRef {
    f.store
        .enqueue(
            caller,
            &namespace("renders"),
            &queue("jobs"),
            &json_brief(n),
            &options.with_task_id(task_id(n)),
        )
        .unwrap()
}

/// The task the next claim of `renders/jobs` takes, `None` if it is empty.
fn next(f: &Fixture<'_>, caller: &Caller) -> Option<TaskRef> {
    match f
        .store
        .claim(caller, &namespace("renders"), &queue("jobs"))
        .unwrap()
    {
        ClaimOutcome::Granted(claimed) => Some(claimed.task),
        ClaimOutcome::Empty { .. } => None,
    }
}

fn a_scheduled_task_waits_for_its_time_then_takes_its_place_in_the_order(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let start = f.clock.now_utc();
    let later = enqueue(
        &f,
        &worker,
        1,
        EnqueueOptions::default().with_not_before(start + Duration::from_secs(60)),
    );
    // Many tasks scheduled further out change nothing.
    for n in 10..40 {
        enqueue(
            &f,
            &worker,
            n,
            EnqueueOptions::default().with_not_before(start + Duration::from_secs(3600)),
        );
    }
    assert_eq!(next(&f, &worker), None, "nothing is due yet");
    let view = f.store.read_task(&worker, &later).unwrap();
    assert_eq!(
        view.record.attempts[0].state,
        TaskState::Scheduled {
            at: start + Duration::from_secs(60)
        }
    );
    let health = f.store.health(&worker, &namespace("renders")).unwrap();
    assert_eq!((health.attempts.scheduled, health.attempts.ready), (31, 0));
    let listed = f
        .store
        .list_tasks(
            &worker,
            &namespace("renders"),
            &TaskQuery {
                limit: 5,
                ..TaskQuery::new(StateName::Scheduled)
            },
        )
        .unwrap();
    assert_eq!(listed.tasks[0].task, later);

    // Its time passes; a ready task enqueued meanwhile still goes first,
    // as a ready task goes before an ended backoff.
    f.clock.advance(Duration::from_secs(61));
    let ready = enqueue(&f, &worker, 2, EnqueueOptions::default());
    assert_eq!(next(&f, &worker), Some(ready.clone()));
    assert_eq!(next(&f, &worker), Some(later.clone()));
    assert_eq!(next(&f, &worker), None);
    f.clock.advance(Duration::from_secs(3600));
    // Both leases lapsed an hour ago, at one time: claimable since then,
    // they go before those scheduled for the hour, the older first; then
    // the scheduled ones, the older first.
    assert_eq!(next(&f, &worker), Some(later.clone()));
    assert_eq!(next(&f, &worker), Some(ready));
    assert_eq!(
        next(&f, &worker),
        Some(TaskRef::new(
            namespace("renders"),
            task_id(10),
            later.version
        )),
    );
}

fn a_higher_priority_is_claimed_first_lapsed_or_ready(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let low = enqueue(&f, &worker, 1, EnqueueOptions::default());
    let high = enqueue(&f, &worker, 2, EnqueueOptions::default().with_priority(2));
    let top = enqueue(
        &f,
        &worker,
        3,
        EnqueueOptions::default().with_priority(MAX_PRIORITY),
    );
    let high_too = enqueue(&f, &worker, 4, EnqueueOptions::default().with_priority(2));
    assert_eq!(next(&f, &worker), Some(top.clone()));
    assert_eq!(next(&f, &worker), Some(high.clone()), "then the older of 2");
    // The top task's lease lapses: it comes back before every lower one.
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(next(&f, &worker), Some(top));
    // `high`'s lapse, older than the ready `high_too`, loses to it: within
    // a priority a ready task goes first.
    assert_eq!(next(&f, &worker), Some(high_too));
    assert_eq!(next(&f, &worker), Some(high));
    assert_eq!(next(&f, &worker), Some(low));

    let error = f
        .store
        .enqueue(
            &worker,
            &namespace("renders"),
            &queue("jobs"),
            &json_brief(9),
            &EnqueueOptions::default().with_priority(MAX_PRIORITY + 1),
        )
        .unwrap_err();
    assert_eq!((error.status(), error.code()), (400, "invalid_input"));
    let view = f
        .store
        .read_task(
            &worker,
            &enqueue(&f, &worker, 5, EnqueueOptions::default().with_priority(1)),
        )
        .unwrap();
    assert_eq!(view.record.priority, 1);
}

fn a_cancelled_lease_is_refused_at_its_next_heartbeat_and_submit(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::AllNamespaces));
    let operator = f.login(&f.key(&[Scope::Enqueue, Scope::Read], Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = enqueue(&f, &operator, 1, EnqueueOptions::default());
    let claimed = f.claim(&worker, &ns, &q);

    // Cancelling needs the enqueue scope.
    let error = f.store.cancel_task(&worker, &task).unwrap_err();
    assert_eq!(error.status(), 403);
    let cancelled = f.store.cancel_task(&operator, &task).unwrap();
    assert_eq!(cancelled.len(), 1);

    let token = claimed.lease.token();
    let heartbeat = f.store.heartbeat(&worker, &task, token).unwrap_err();
    assert_eq!(
        (heartbeat.status(), heartbeat.code()),
        (409, "task_cancelled")
    );
    let key = "late".parse().unwrap();
    let submit = f
        .store
        .submit(&worker, &task, token, &key, &Output::bytes("late"))
        .unwrap_err();
    assert_eq!(submit.code(), "task_cancelled");
    let fail = f
        .store
        .fail(&worker, &task, token, Retry::Never)
        .unwrap_err();
    assert_eq!(fail.code(), "task_cancelled");
    assert!(
        f.store
            .read_receipt(&operator, &task, claimed.lease.attempt())
            .is_err(),
        "the late submission left no receipt"
    );
    assert_eq!(next(&f, &worker), None, "a cancelled task is not claimable");
    let view = f.store.read_task(&operator, &task).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Cancelled);
    let health = f.store.health(&operator, &ns).unwrap();
    assert_eq!((health.attempts.cancelled, health.attempts.leased), (1, 0));

    let again = f.store.cancel_task(&operator, &task).unwrap_err();
    assert_eq!((again.status(), again.code()), (409, "nothing_to_cancel"));
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let cancels: Vec<_> = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "cancel_task")
        .collect();
    assert_eq!(cancels.len(), 1, "the cancel is audited once");

    // An operator's retry undoes it, under a fresh token.
    f.store.retry_task(&operator, &task).unwrap();
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!((claimed.task, claimed.lease.token().as_i64()), (task, 2));
}

fn a_cancelled_scheduled_task_never_runs(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let at = f.clock.now_utc() + Duration::from_secs(30);
    let task = enqueue(
        &f,
        &worker,
        1,
        EnqueueOptions::default().with_not_before(at),
    );
    f.store.cancel_task(&f.admin, &task).unwrap();
    f.clock.advance(Duration::from_secs(31));
    assert_eq!(next(&f, &worker), None);
    let listed = f
        .store
        .list_tasks(
            &worker,
            &namespace("renders"),
            &TaskQuery::new(StateName::Cancelled),
        )
        .unwrap();
    assert_eq!(listed.tasks.len(), 1);
    assert_eq!(listed.tasks[0].task, task);
}

fn a_batch_enqueues_in_one_transaction_and_again_adds_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let existing = enqueue(&f, &worker, 3, EnqueueOptions::default());
    let batch: Vec<(Brief, EnqueueOptions)> = (1..=5)
        .map(|n| {
            let options = EnqueueOptions::default().with_task_id(task_id(n));
            (json_brief(n), options)
        })
        .collect();
    let first = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    let created: Vec<bool> = first.iter().map(|e| e.created).collect();
    assert_eq!(created, [true, true, false, true, true]);
    assert_eq!(first[2].task, existing);
    let again = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    assert!(
        again.iter().all(|e| !e.created),
        "a batch sent again adds nothing"
    );
    assert_eq!(
        again.iter().map(|e| &e.task).collect::<Vec<_>>(),
        first.iter().map(|e| &e.task).collect::<Vec<_>>()
    );
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(health.attempts.ready, 5);
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let batches: Vec<_> = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "enqueue_batch")
        .map(|event| event.resource.as_ref().map(|r| r.as_str().to_owned()))
        .collect();
    assert_eq!(
        batches,
        [
            Some("queue:jobs/n0".to_owned()),
            Some("queue:jobs/n4".to_owned())
        ]
    );

    // A task named twice in one call is created once, by its first place,
    // and a batch is claimed in the order of the call.
    let twice: Vec<(Brief, EnqueueOptions)> = [9, 8, 9]
        .into_iter()
        .map(|n| {
            (
                json_brief(n),
                EnqueueOptions::default().with_task_id(task_id(n)),
            )
        })
        .collect();
    let answers = f.store.enqueue_batch(&worker, &ns, &q, &twice).unwrap();
    let created: Vec<bool> = answers.iter().map(|e| e.created).collect();
    assert_eq!(created, [true, true, false]);
    assert_eq!(answers[2].task, answers[0].task);
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 7);
    let claimed = f.store.claim_batch(&worker, &ns, &q, 7).unwrap().claimed;
    let order: Vec<&TaskRef> = claimed.iter().map(|c| &c.task).collect();
    assert_eq!(order[5..], [&answers[0].task, &answers[1].task]);

    // One bad task refuses the whole batch; so does an empty or a long one.
    let mut bad = batch.clone();
    bad.push((
        Brief::Bytes(vec![0; tessera_store::limits::MAX_BRIEF_BYTES + 1]),
        EnqueueOptions::default(),
    ));
    bad[0].1 = EnqueueOptions::default().with_task_id(task_id(99));
    let error = f.store.enqueue_batch(&worker, &ns, &q, &bad).unwrap_err();
    assert_eq!(error.status(), 400);
    let view = f.store.read_task(
        &worker,
        &TaskRef::new(ns.clone(), task_id(99), existing.version),
    );
    assert_eq!(view.unwrap_err().status(), 404, "nothing of it was written");
    assert_eq!(
        f.store
            .enqueue_batch(&worker, &ns, &q, &[])
            .unwrap_err()
            .status(),
        400
    );
    let long = vec![(json_brief(0), EnqueueOptions::default()); MAX_ENQUEUE_BATCH + 1];
    assert_eq!(
        f.store
            .enqueue_batch(&worker, &ns, &q, &long)
            .unwrap_err()
            .status(),
        400
    );
    let claimer = f.login(&f.worker(Grant::AllNamespaces));
    let forbidden = f
        .store
        .enqueue_batch(&claimer, &ns, &q, &batch)
        .unwrap_err();
    assert_eq!(forbidden.status(), 403);
}

fn a_batch_claim_leases_tasks_in_claim_order_in_one_transaction(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks: Vec<TaskRef> = (1..=5)
        .map(|n| enqueue(&f, &worker, n, EnqueueOptions::default()))
        .collect();
    let urgent = enqueue(&f, &worker, 6, EnqueueOptions::default().with_priority(1));
    let first = f.store.claim_batch(&worker, &ns, &q, 3).unwrap();
    let taken: Vec<&TaskRef> = first.claimed.iter().map(|c| &c.task).collect();
    assert_eq!(taken, [&urgent, &tasks[0], &tasks[1]]);
    assert!(first.claimed.iter().all(|c| c.lease.token().as_i64() == 1));
    assert_eq!(first.retry_after, None);
    let rest = f.store.claim_batch(&worker, &ns, &q, 10).unwrap();
    assert_eq!(rest.claimed.len(), 3, "fewer when fewer are claimable");
    let empty = f.store.claim_batch(&worker, &ns, &q, 10).unwrap();
    assert!(empty.claimed.is_empty());
    assert!(empty.retry_after.is_some());
    // Each lease is audited, each under its own grant.
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let claims = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "claim")
        .count();
    assert_eq!(claims, 6);
    for claimed in first.claimed.iter().chain(&rest.claimed) {
        f.store
            .heartbeat(&worker, &claimed.task, claimed.lease.token())
            .unwrap();
    }

    // Never two competing attempts of one brief to one batch.
    f.store
        .enqueue(
            &worker,
            &ns,
            &queue("pairs"),
            &json_brief(0),
            &EnqueueOptions::default().with_alternatives(2),
        )
        .unwrap();
    let pair = f
        .store
        .claim_batch(&worker, &ns, &queue("pairs"), 2)
        .unwrap();
    assert_eq!(pair.claimed.len(), 1);
    let error = f.store.claim_batch(&worker, &ns, &q, 0).unwrap_err();
    assert_eq!(error.status(), 400);
    let error = f
        .store
        .claim_batch(&worker, &ns, &q, MAX_CLAIM_BATCH + 1)
        .unwrap_err();
    assert_eq!(error.status(), 400);
    // The key comes first: without the claim scope, any count is 403.
    let enqueuer = f.login(&f.key(&[Scope::Enqueue], Grant::AllNamespaces));
    let error = f.store.claim_batch(&enqueuer, &ns, &q, 0).unwrap_err();
    assert_eq!(error.status(), 403);
}

/// Threads enqueue batches naming the same tasks at once: every task is
/// created once, by one of them, and every answer names the same task.
fn batches_racing_for_the_same_tasks_create_each_once(db: &TestDb) {
    const THREADS: usize = 4;
    const TASKS: usize = 64;
    const ROUNDS: usize = 5;
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    for round in 0..ROUNDS {
        let answers: Vec<Vec<(usize, bool, TaskRef)>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (store, worker, ns, q) = (&f.store, &worker, &ns, &q);
                    scope.spawn(move || {
                        let ids: Vec<usize> = (1..=TASKS).map(|n| round * TASKS + n).collect();
                        let batch: Vec<(Brief, EnqueueOptions)> = ids
                            .iter()
                            .map(|&n| {
                                let options = EnqueueOptions::default().with_task_id(task_id(n));
                                (json_brief(n), options)
                            })
                            .collect();
                        let answers = store.enqueue_batch(worker, ns, q, &batch).unwrap();
                        ids.into_iter()
                            .zip(answers)
                            .map(|(n, answer)| (n, answer.created, answer.task))
                            .collect()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for n in (round * TASKS + 1)..=((round + 1) * TASKS) {
            let of_n: Vec<&(usize, bool, TaskRef)> = answers
                .iter()
                .flatten()
                .filter(|(id, ..)| *id == n)
                .collect();
            assert_eq!(of_n.len(), THREADS);
            let created = of_n.iter().filter(|(_, created, _)| *created).count();
            assert_eq!(created, 1, "task {n} created {created} times");
            assert!(of_n.iter().all(|(.., task)| *task == of_n[0].2));
        }
    }
    let ready = f.store.health(&worker, &ns).unwrap().attempts.ready;
    assert_eq!(ready, (TASKS * ROUNDS) as u64);
}

conformance! {
    batches_racing_for_the_same_tasks_create_each_once,
    a_scheduled_task_waits_for_its_time_then_takes_its_place_in_the_order,
    a_higher_priority_is_claimed_first_lapsed_or_ready,
    a_cancelled_lease_is_refused_at_its_next_heartbeat_and_submit,
    a_cancelled_scheduled_task_never_runs,
    a_batch_enqueues_in_one_transaction_and_again_adds_nothing,
    a_batch_claim_leases_tasks_in_claim_order_in_one_transaction,
}
