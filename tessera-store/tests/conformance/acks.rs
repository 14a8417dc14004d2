//! Acknowledgements through the completer: a batch of submissions gets
//! one answer per submission (receipt, replay, stale token, conflict, not
//! found), one receipt and one audit row per accepted one, in one commit;
//! threads acknowledging at once each get their own answers; a commit
//! that fails acknowledges nothing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tessera_store::{
    AckBatching, ConflictKind, EnqueueOptions, Error, FencingToken, Grant, IdempotencyKey, Output,
    Retry, SubmitRequest, Submitted, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, assert_quota, json_brief, midnight, namespace, queue};

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn request(task: &TaskRef, token: FencingToken, k: &str, output: &str) -> SubmitRequest {
    SubmitRequest {
        task: task.clone(),
        token,
        key: key(k),
        output: Output::bytes(output),
    }
}

fn conflict_kind(answer: &Result<Submitted, Error>) -> Option<ConflictKind> {
    match answer {
        Err(Error::Conflict { kind, .. }) => Some(*kind),
        _ => None,
    }
}

fn a_batch_answers_each_submission_on_its_own(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &q, 3);
    let leases: Vec<_> = (0..3).map(|_| f.claim(&worker, &ns, &q)).collect();
    let token = |n: usize| leases[n].lease.token();
    let unknown = TaskRef::new(
        ns.clone(),
        tessera_store::TaskId::parse("t-nowhere").unwrap(),
        tasks[0].version,
    );
    let events_before = db.count_rows("access_audit");
    let receipts_before = db.count_receipts();

    let batch = [
        request(&tasks[0], token(0), "k0", "zero"),
        request(&tasks[1], token(1), "k1", "one"),
        // Not this lease's token.
        request(
            &tasks[2],
            FencingToken::new(token(2).as_i64() + 1).unwrap(),
            "k2",
            "two",
        ),
        // The first submission again, later in the same batch: a replay.
        request(&tasks[0], token(0), "k0", "zero"),
        // Its key with another output: a conflict.
        request(&tasks[0], token(0), "k0", "something else"),
        request(&unknown, token(0), "k9", "nine"),
    ];
    let (answers, cost) = f
        .store
        .measure(|store| store.submit_batch(&worker, &batch).unwrap());
    assert_eq!(answers.len(), batch.len());
    let Ok(Submitted::Accepted(first)) = &answers[0] else {
        panic!("a fresh submission is accepted: {:?}", answers[0]);
    };
    assert_eq!((&first.task, first.token), (&tasks[0].id, token(0)));
    let Ok(Submitted::Accepted(second)) = &answers[1] else {
        panic!("a fresh submission is accepted: {:?}", answers[1]);
    };
    assert_eq!(second.token, token(1));
    assert_eq!(answers[2].as_ref().unwrap_err().status(), 409);
    assert_eq!(
        answers[3].as_ref().ok(),
        Some(&Submitted::Replayed(first.clone()))
    );
    assert_eq!(
        conflict_kind(&answers[4]),
        Some(ConflictKind::IdempotencyConflict)
    );
    // A task that is not there under a fencing token was purged.
    assert_eq!(answers[5].as_ref().unwrap_err().status(), 410);

    // One receipt and one audit row per accepted submission, in one commit.
    assert_eq!(db.count_receipts(), receipts_before + 2);
    assert_eq!(db.count_rows("access_audit"), events_before + 2);
    assert_eq!(cost.write_transactions, 1);
    let stored = f
        .store
        .read_receipt(&worker, &tasks[1], second.attempt)
        .unwrap();
    assert_eq!(&stored.receipt, second);
    assert_eq!(stored.output.as_deref(), Some(&b"one"[..]));

    // The refused one's lease is untouched: it submits now.
    let again = f
        .store
        .submit(
            &worker,
            &tasks[2],
            token(2),
            &key("k2"),
            &Output::bytes("two"),
        )
        .unwrap();
    assert!(matches!(again, Submitted::Accepted(_)));
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(health.attempts.done, 3);
}

fn a_batch_is_checked_whole_before_anything_is_written(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let outsider = f.login(&f.worker(Grant::Namespace(namespace("elsewhere"))));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &q, 1);
    let lease = f.claim(&worker, &ns, &q);
    let error = f.store.submit_batch(&worker, &[]).unwrap_err();
    assert_eq!(error.status(), 400);
    let too_many = vec![request(&tasks[0], lease.lease.token(), "k", "x"); 1_001];
    assert_eq!(
        f.store
            .submit_batch(&worker, &too_many)
            .unwrap_err()
            .status(),
        400
    );
    // A namespace the key has no grant for is that submission's 403.
    let answers = f
        .store
        .submit_batch(
            &outsider,
            &[request(&tasks[0], lease.lease.token(), "k", "x")],
        )
        .unwrap();
    assert_eq!(answers[0].as_ref().unwrap_err().status(), 403);
    assert_eq!(db.count_receipts(), 0);
}

fn a_refused_commit_acknowledges_none_of_its_batch(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &q, 2);
    let leases: Vec<_> = (0..2).map(|_| f.claim(&worker, &ns, &q)).collect();
    let batch: Vec<_> = (0..2)
        .map(|n| request(&tasks[n], leases[n].lease.token(), "done", "out"))
        .collect();
    f.store.refuse_writes(true);
    let error = f.store.submit_batch(&worker, &batch).unwrap_err();
    assert_quota(&error, midnight());
    assert_eq!(db.count_receipts(), 0);
    f.store.refuse_writes(false);
    let answers = f.store.submit_batch(&worker, &batch).unwrap();
    assert!(
        answers
            .iter()
            .all(|answer| matches!(answer, Ok(Submitted::Accepted(_))))
    );
    // While writes are refused, a replay still answers from a read.
    f.store.refuse_writes(true);
    let replays = f.store.submit_batch(&worker, &batch).unwrap();
    assert!(
        replays
            .iter()
            .all(|answer| matches!(answer, Ok(Submitted::Replayed(_))))
    );
}

/// Threads submitting and failing at once each get their own answers,
/// whichever commits carried them, and every accepted one has its receipt
/// and its audit row.
fn threads_acknowledging_at_once_each_get_their_own_answers(db: &TestDb) {
    const THREADS: usize = 8;
    const EACH: usize = 12;
    let f = Fixture::with(db, |config| {
        config.with_ack_batching(AckBatching {
            max_batch: 5,
            max_wait: Duration::from_millis(1),
        })
    });
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, THREADS * EACH);
    let leases: Vec<_> = (0..THREADS * EACH)
        .map(|_| f.claim(&worker, &ns, &q))
        .collect();
    let events_before = db.count_rows("access_audit");
    let leases = Arc::new(leases);
    let answers: Vec<Vec<(usize, String)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, worker, leases) = (&f.store, &worker, Arc::clone(&leases));
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for n in (thread * EACH)..((thread + 1) * EACH) {
                        let lease = &leases[n];
                        let token = lease.lease.token();
                        // Every third lease fails; its stale retry conflicts.
                        if n % 3 == 0 {
                            let state = store
                                .fail(worker, &lease.task, token, Retry::Never)
                                .unwrap();
                            assert_eq!(state, TaskState::Failed);
                            let stale = store
                                .submit(
                                    worker,
                                    &lease.task,
                                    token,
                                    &key("late"),
                                    &Output::bytes("x"),
                                )
                                .unwrap_err();
                            assert_eq!(stale.status(), 409);
                            mine.push((n, "failed".to_owned()));
                        } else {
                            let output = format!("output {n}");
                            let submitted = store
                                .submit(
                                    worker,
                                    &lease.task,
                                    token,
                                    &key("k"),
                                    &Output::bytes(output.as_bytes()),
                                )
                                .unwrap();
                            let Submitted::Accepted(receipt) = submitted else {
                                panic!("a fresh key is accepted");
                            };
                            assert_eq!((&receipt.task, receipt.token), (&lease.task.id, token));
                            mine.push((n, receipt.digest.to_string()));
                        }
                    }
                    mine
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let answered: HashSet<usize> = answers.iter().flatten().map(|(n, _)| *n).collect();
    assert_eq!(answered.len(), THREADS * EACH);
    for (n, answer) in answers.iter().flatten() {
        let lease = &leases[*n];
        if answer == "failed" {
            continue;
        }
        let stored = f
            .store
            .read_receipt(&worker, &lease.task, lease.lease.attempt())
            .unwrap();
        assert_eq!(&stored.receipt.digest.to_string(), answer);
        assert_eq!(stored.output, Some(format!("output {n}").into_bytes()));
    }
    let failed = (0..THREADS * EACH).filter(|n| n % 3 == 0).count();
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(
        (health.attempts.done, health.attempts.failed),
        ((THREADS * EACH - failed) as u64, failed as u64)
    );
    // One audit row per accepted submission and per failure report (the
    // reads above add theirs after).
    let reads = (THREADS * EACH - failed) as u64;
    assert_eq!(
        db.count_rows("access_audit"),
        events_before + (THREADS * EACH) as u64 + reads
    );
}

/// A submission that carries the next claim: one transaction for both,
/// with the receipt and audit row of each; a refused submission claims
/// nothing; an empty queue answers empty after the submission; a replay
/// still claims.
fn a_submission_carries_the_next_claim_in_one_transaction(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &q, 2);
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(first.task, tasks[0]);
    let events_before = db.count_rows("access_audit");
    let meter_before = f.store.meter();

    let (submitted, next) = f
        .store
        .submit_and_claim(
            &worker,
            &request(&tasks[0], first.lease.token(), "k0", "zero"),
            &ns,
            &q,
        )
        .unwrap();
    let Submitted::Accepted(receipt) = submitted else {
        panic!("accepted, not {submitted:?}")
    };
    assert_eq!(receipt.token, first.lease.token());
    let second = next.unwrap().claimed().cloned().expect("the next task");
    assert_eq!(second.task, tasks[1]);
    let cost = f.store.meter().since(&meter_before);
    assert_eq!(cost.write_transactions, 1, "{cost:?}");
    assert_eq!(
        db.count_rows("access_audit"),
        events_before + 2,
        "the submission's row and the claim's"
    );
    assert_eq!(
        f.store
            .read_task(&worker, &tasks[0])
            .unwrap()
            .record
            .attempts[0]
            .state,
        TaskState::Done
    );

    // A token the task never issued: the submission is refused and
    // nothing is claimed.
    f.enqueue(&worker, &ns, &q, 1);
    let snapshot = db.table_snapshot();
    let refused = f.store.submit_and_claim(
        &worker,
        &request(&tasks[1], FencingToken::new(99).unwrap(), "k1", "one"),
        &ns,
        &q,
    );
    assert_eq!(
        conflict_kind(&refused.map(|(submitted, _)| submitted)),
        Some(ConflictKind::UnknownToken)
    );
    assert_eq!(db.table_snapshot(), snapshot, "nothing written");

    // The last task: the submission commits and the claim finds the
    // queue empty once the third task is taken.
    let third = f.claim(&worker, &ns, &q);
    let (submitted, next) = f
        .store
        .submit_and_claim(
            &worker,
            &request(&tasks[1], second.lease.token(), "k1", "one"),
            &ns,
            &q,
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    assert!(next.unwrap().claimed().is_none(), "the queue is empty");

    // A replay answers the stored receipt and still claims.
    let (replayed, next) = f
        .store
        .submit_and_claim(
            &worker,
            &request(&tasks[1], second.lease.token(), "k1", "one"),
            &ns,
            &q,
        )
        .unwrap();
    assert!(matches!(replayed, Submitted::Replayed(_)));
    assert!(next.unwrap().claimed().is_none());
    let (submitted, _) = f
        .store
        .submit_and_claim(
            &worker,
            &request(&third.task, third.lease.token(), "k2", "two"),
            &ns,
            &q,
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

/// A submission whose task still has another attempt claimable, carrying
/// the next claim: the claim sees the task as the submission left it, its
/// first attempt done, and leases the other attempt, which comes first in
/// claim order.
fn a_carried_claim_sees_the_task_its_submission_changed(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let rival = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &json_brief(0),
            &EnqueueOptions::default().with_alternatives(2),
        )
        .unwrap();
    f.enqueue(&worker, &ns, &q, 1);
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(first.task, rival);
    let meter_before = f.store.meter();

    let (submitted, next) = f
        .store
        .submit_and_claim(
            &worker,
            &request(&rival, first.lease.token(), "k0", "zero"),
            &ns,
            &q,
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    let next = next.unwrap().claimed().cloned().expect("the next task");
    assert_eq!(next.task, rival, "the other attempt comes first");
    assert_ne!(next.lease.attempt(), first.lease.attempt());
    assert_eq!(f.store.meter().since(&meter_before).write_transactions, 1);
    let attempts = f.store.read_task(&worker, &rival).unwrap().record.attempts;
    let states: Vec<TaskState> = attempts.iter().map(|attempt| attempt.state).collect();
    assert_eq!(states, [TaskState::Done, TaskState::Leased]);
}

/// Threads that each take one task at a time with `submit_and_claim`, each
/// with its own key, until the queue is empty: every task is done once,
/// by the thread that held its lease, with one receipt and a claim and a
/// submission audit row each, and no task was held by two threads.
/// Threads that each submit and claim until they hear "empty": every task
/// is done once, and no thread hears "empty" while a task is still ready
/// (one another thread's statement held locked, say). Nothing is
/// enqueued meanwhile and no lease lapses, so a ready task seen after an
/// empty answer was ready when it was given.
fn threads_carrying_their_next_claims_do_each_task_once(db: &TestDb) {
    const THREADS: usize = 8;
    const TASKS: usize = 240;
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| f.login(&f.full_worker(Grant::AllNamespaces)))
        .collect();
    let tasks = f.enqueue(&workers[0], &ns, &q, TASKS);
    let events_before = db.count_rows("access_audit");
    let done: Vec<Vec<TaskRef>> = std::thread::scope(|scope| {
        let threads: Vec<_> = workers
            .iter()
            .map(|worker| {
                let (store, ns, q) = (&f.store, &ns, &q);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    let mut next = store.claim(worker, ns, q).unwrap().claimed().cloned();
                    if next.is_none() {
                        assert_eq!(db.count_attempts_in("ready"), 0, "empty while work waits");
                    }
                    while let Some(claimed) = next {
                        let (submitted, outcome) = store
                            .submit_and_claim(
                                worker,
                                &request(&claimed.task, claimed.lease.token(), "done", "ok"),
                                ns,
                                q,
                            )
                            .unwrap();
                        assert!(matches!(submitted, Submitted::Accepted(_)));
                        mine.push(claimed.task.clone());
                        next = outcome.unwrap().claimed().cloned();
                        if next.is_none() {
                            let ready = db.count_attempts_in("ready");
                            assert_eq!(ready, 0, "empty while work waits");
                        }
                    }
                    mine
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let all: Vec<&TaskRef> = done.iter().flatten().collect();
    let distinct: HashSet<&TaskRef> = all.iter().copied().collect();
    assert_eq!(all.len(), TASKS, "every task once");
    assert_eq!(distinct.len(), TASKS, "no task twice");
    assert_eq!(db.count_receipts(), TASKS as u64);
    assert_eq!(
        db.count_rows("access_audit"),
        events_before + 2 * TASKS as u64,
        "a claim and a submission row per task"
    );
    for task in &tasks {
        let view = f.store.read_task(&workers[0], task).unwrap();
        assert_eq!(view.record.attempts[0].state, TaskState::Done);
        assert_eq!(view.record.attempts[0].tries, 1, "leased once");
    }
}

/// Version 4 kept each receipt in a table of its own; an upgrade moves
/// each into the row of the attempt it ended, and every receipt still
/// answers: read back, replayed under its key, a conflict under its key
/// with another payload. A lease held across the upgrade still submits.
fn an_upgrade_from_version_four_moves_every_receipt_into_its_attempt(db: &TestDb) {
    let mut f = Fixture::new(db);
    let secret = f.full_worker(Grant::AllNamespaces);
    let worker = f.login(&secret);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks: Vec<TaskRef> = (0..3)
        .map(|n| {
            f.store
                .enqueue(&worker, &ns, &q, &json_brief(n), &EnqueueOptions::default())
                .unwrap()
        })
        .collect();
    let mut receipts = Vec::new();
    for (n, _) in tasks.iter().enumerate().take(2) {
        let claimed = f.claim(&worker, &ns, &q);
        let submitted = f
            .store
            .submit(
                &worker,
                &claimed.task,
                claimed.lease.token(),
                &key(&format!("k{n}")),
                &Output::bytes(format!("out {n}")),
            )
            .unwrap();
        receipts.push((claimed.task, submitted.receipt().clone()));
    }
    let held = f.claim(&worker, &ns, &q);
    assert_eq!(held.task, tasks[2]);
    let before: Vec<_> = tasks
        .iter()
        .map(|task| f.store.alternatives(&worker, task).unwrap())
        .collect();
    assert_eq!(before.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 0]);

    db.downgrade_receipts_to_version_four();
    assert_eq!(db.count_rows("receipts"), 2);
    f.reopen(f.config());
    let worker = f.login(&secret);
    assert_eq!(db.count_receipts(), 2);
    let after: Vec<_> = tasks
        .iter()
        .map(|task| f.store.alternatives(&worker, task).unwrap())
        .collect();
    assert_eq!(after, before, "every receipt reads back as it was");
    for (n, (task, receipt)) in receipts.iter().enumerate() {
        let token = receipt.token;
        let replayed = f
            .store
            .submit(
                &worker,
                task,
                token,
                &key(&format!("k{n}")),
                &Output::bytes(format!("out {n}")),
            )
            .unwrap();
        assert_eq!(replayed, Submitted::Replayed(receipt.clone()));
        let answer = f.store.submit(
            &worker,
            task,
            token,
            &key(&format!("k{n}")),
            &Output::bytes("other"),
        );
        assert_eq!(
            conflict_kind(&answer),
            Some(ConflictKind::IdempotencyConflict)
        );
    }
    let submitted = f
        .store
        .submit(
            &worker,
            &held.task,
            held.lease.token(),
            &key("k2"),
            &Output::bytes("out 2"),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    assert_eq!(db.count_receipts(), 3);
}

conformance! {
    an_upgrade_from_version_four_moves_every_receipt_into_its_attempt,
    a_submission_carries_the_next_claim_in_one_transaction,
    a_carried_claim_sees_the_task_its_submission_changed,
    threads_carrying_their_next_claims_do_each_task_once,
    a_batch_answers_each_submission_on_its_own,
    a_batch_is_checked_whole_before_anything_is_written,
    a_refused_commit_acknowledges_none_of_its_batch,
    threads_acknowledging_at_once_each_get_their_own_answers,
}
