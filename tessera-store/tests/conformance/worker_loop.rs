//! The worker loop: it claims ahead in batches (one admission offer a
//! refill), hands out buffered tasks in claim order, heartbeats its buffer
//! in one transaction, lets go of a buffered task whose lease runs short,
//! hands its buffer back on release, and acknowledges through the
//! completer, each submission carrying a claim while the buffer has room,
//! from threads and from an async host.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use tessera_store::{
    Claimed, EmptyReason, EnqueueOptions, Error, Grant, IdempotencyKey, Output, Retry, Submitted,
    TaskRef, TaskState, Worker, WorkerNext, WorkerOptions,
};

use crate::harness::{BackendKind, Fixture, TestDb, json_brief, namespace, queue};

/// Polls on this thread, parking between polls until the waker unparks it.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

fn task(next: WorkerNext) -> Claimed {
    match next {
        WorkerNext::Task(claimed) => *claimed,
        other => panic!("expected a task, got {other:?}"),
    }
}

fn done(worker: &Worker<&tessera_store::Store>, claimed: &Claimed) {
    let submitted = worker
        .submit(
            claimed,
            &IdempotencyKey::parse("done").unwrap(),
            &Output::bytes(claimed.task.id.as_str()),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

fn a_worker_claims_ahead_and_hands_out_in_claim_order(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks: Vec<TaskRef> = f.enqueue(&caller, &ns, &q, 5);
    let options = WorkerOptions::default().with_fetch(3);
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();

    let mut handed = Vec::new();
    for _ in 0..5 {
        let claimed = task(worker.next().unwrap());
        done(&worker, &claimed);
        handed.push(claimed.task);
    }
    assert_eq!(handed, tasks, "claim order, each once");
    let stats = worker.stats();
    assert_eq!((stats.claimed, stats.handed_out), (5, 5));
    // PostgreSQL: one batch of 3; the first three submissions each
    // carried a claim while the buffer had room (two leased the last
    // tasks, the third found the queue empty), the last two none.
    // SQLite: two batches, and no submission carries a claim.
    let carries = db.kind() == BackendKind::Postgres;
    let expected = if carries { (4, 3) } else { (2, 0) };
    assert_eq!((stats.claims, stats.carried), expected);
    assert_eq!(worker.buffered(), 0);
    match worker.next().unwrap() {
        WorkerNext::Empty { reason, .. } => assert_eq!(reason, EmptyReason::Empty),
        other => panic!("expected an empty queue, got {other:?}"),
    }
    // A carried claim's empty answer is given while its Retry-After
    // holds, with no claim of its own.
    let claims = if carries { 4 } else { 3 };
    assert_eq!(worker.stats().claims, claims);
}

/// One at a time on PostgreSQL, each submission carries the next claim:
/// one transaction a task after the first claim, and the task it leased
/// is the next one handed out. Its empty answer holds until an enqueue,
/// or until its Retry-After ends. On SQLite no submission carries one.
fn a_submission_carries_the_next_claim_into_the_buffer(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks: Vec<TaskRef> = f.enqueue(&caller, &ns, &q, 4);
    let options = WorkerOptions::default().with_fetch(1);
    let worker = Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap();
    let first = task(worker.next().unwrap());
    assert_eq!(worker.buffered(), 0, "fetch 1: nothing buffered ahead");
    done(&worker, &first);
    let health = f.store.health(&caller, &ns).unwrap();
    if db.kind() == BackendKind::Sqlite {
        assert_eq!((worker.buffered(), worker.stats().carried), (0, 0));
        assert_eq!((health.attempts.done, health.attempts.leased), (1, 0));
        return;
    }
    assert_eq!(worker.buffered(), 1, "the submission leased the next task");
    assert_eq!((health.attempts.done, health.attempts.leased), (1, 1));
    let mut handed = vec![first.task];
    while let WorkerNext::Task(claimed) = worker.next().unwrap() {
        done(&worker, &claimed);
        handed.push(claimed.task);
    }
    assert_eq!(handed, tasks, "claim order, each once");
    // The first claim, three carried that leased, one carried that found
    // the queue empty and answered the last `next`.
    let stats = worker.stats();
    assert_eq!((stats.claims, stats.claimed, stats.carried), (5, 4, 4));
    assert_eq!(f.store.health(&caller, &ns).unwrap().attempts.done, 4);

    // An enqueue ends that empty answer at once: the next `next` claims
    // the new task, and its submission carries a claim again.
    let late = f.enqueue(&caller, &ns, &q, 1);
    let claimed = task(worker.next().unwrap());
    assert_eq!(claimed.task, late[0]);
    assert_eq!(worker.stats().claims, 6);
    done(&worker, &claimed);
    assert_eq!(worker.stats().carried, 5);
    // That claim found the queue empty: while its Retry-After holds, the
    // next `next` answers it, with the time left of it, and no claim.
    match worker.next().unwrap() {
        WorkerNext::Empty {
            reason,
            retry_after,
        } => {
            assert_eq!(reason, EmptyReason::Empty);
            assert!(retry_after > Duration::ZERO);
        }
        other => panic!("expected an empty queue, got {other:?}"),
    }
    assert_eq!(worker.stats().claims, 7);
    // Once it no longer holds, `next` asks again.
    f.clock.advance(Duration::from_secs(60));
    assert!(matches!(worker.next().unwrap(), WorkerNext::Empty { .. }));
    assert_eq!(worker.stats().claims, 8);
}

fn a_worker_heartbeats_its_buffer_and_lets_go_of_short_leases(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_lease_duration(Duration::from_secs(60))
    });
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 3);
    let options = WorkerOptions::default()
        .with_fetch(3)
        .with_min_lease_left(Duration::from_secs(10));
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();
    let first = task(worker.next().unwrap());
    done(&worker, &first);
    assert_eq!(worker.buffered(), 2);

    // Half a lease later, one heartbeat extends both buffered leases to
    // 90 s; at 70 s the next still has 20 s left.
    f.clock.advance(Duration::from_secs(30));
    assert_eq!(worker.heartbeat().unwrap(), 2);
    assert_eq!(worker.stats().heartbeats, 1);
    f.clock.advance(Duration::from_secs(40));
    let second = task(worker.next().unwrap());
    assert_eq!(second.task, tasks[1], "its lease was extended in time");
    done(&worker, &second);

    // No heartbeat since: the last buffered lease ran out at 90 s. It is
    // let go rather than handed out, comes back to the queue as a lapse,
    // and the refill claims it again under the task's next token.
    f.clock.advance(Duration::from_secs(60));
    let again = task(worker.next().unwrap());
    assert_eq!(worker.stats().let_go, 1);
    assert_eq!(again.task, tasks[2]);
    assert_eq!(again.lease.token().as_i64(), 2);
    done(&worker, &again);
    assert_eq!(worker.heartbeat().unwrap(), 0, "nothing buffered");
}

fn release_hands_the_buffer_back_at_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 3);
    let options = WorkerOptions::default().with_fetch(3);
    let worker = Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap();
    let first = task(worker.next().unwrap());
    assert_eq!(worker.release().unwrap(), 2);
    assert_eq!(worker.buffered(), 0);
    // Claimable again at once, by anyone.
    let other = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let claimed = f.claim(&other, &ns, &q);
    assert_eq!(claimed.task, tasks[1]);
    // A released worker's submission carries no claim: the last task
    // stays claimable by anyone rather than leased into a buffer no one
    // reads.
    done(&worker, &first);
    assert_eq!((worker.stats().carried, worker.buffered()), (0, 0));
    assert_eq!(f.claim(&other, &ns, &q).task, tasks[2]);
}

/// A task handed back never ran, so it keeps its try: on its last try it
/// is claimable again, not discarded, and its new holder can finish it.
fn release_keeps_the_try_of_a_task_on_its_last_try(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let one_try = EnqueueOptions::default().with_max_tries(1);
    let tasks: Vec<TaskRef> = (0..3)
        .map(|n| {
            f.store
                .enqueue(&caller, &ns, &q, &json_brief(n), &one_try)
                .unwrap()
        })
        .collect();
    let options = WorkerOptions::default().with_fetch(3);
    let worker = Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap();
    let first = task(worker.next().unwrap());
    assert_eq!(worker.release().unwrap(), 2);
    let health = f.store.health(&caller, &ns).unwrap();
    assert_eq!(
        (
            health.attempts.discarded,
            health.attempts.ready,
            health.attempts.leased
        ),
        (0, 2, 1)
    );
    // Both are claimed again, and done.
    let other = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    for expected in &tasks[1..] {
        let claimed = f.claim(&other, &ns, &q);
        assert_eq!(&claimed.task, expected);
        let receipt = f
            .store
            .submit(
                &other,
                &claimed.task,
                claimed.lease.token(),
                &IdempotencyKey::parse("done").unwrap(),
                &Output::bytes("ok"),
            )
            .unwrap();
        assert!(matches!(receipt, Submitted::Accepted(_)));
    }
    done(&worker, &first);
    assert_eq!(f.store.health(&caller, &ns).unwrap().attempts.done, 3);
}

fn worker_threads_share_a_worker_and_each_task_is_done_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 40);
    let options = WorkerOptions::default().with_fetch(7);
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();
    let seen = four_threads_until_empty(&worker, |claimed| done(&worker, claimed));
    assert_eq!(
        sorted(seen.into_iter().map(|(task, ())| task)),
        sorted(tasks),
        "every task done once"
    );
}

/// Four threads sharing `worker`, each taking tasks until the queue is
/// empty and calling `act` on each; every task handed out, with what
/// `act` made of it.
fn four_threads_until_empty<R: Send>(
    worker: &Worker<&tessera_store::Store>,
    act: impl Fn(&Claimed) -> R + Sync,
) -> Vec<(TaskRef, R)> {
    thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let WorkerNext::Task(claimed) = worker.next().unwrap() {
                        let made = act(&claimed);
                        mine.push((claimed.task, made));
                    }
                    mine
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    })
}

fn sorted(tasks: impl IntoIterator<Item = TaskRef>) -> Vec<TaskRef> {
    let mut tasks: Vec<TaskRef> = tasks.into_iter().collect();
    tasks.sort();
    tasks
}

fn an_async_host_awaits_the_next_task(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 2);
    let options = WorkerOptions::default().with_fetch(2);
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();
    let first = task(block_on(worker.next_async()).unwrap());
    let second = task(block_on(worker.next_async()).unwrap());
    assert_eq!(vec![first.task.clone(), second.task.clone()], tasks);
    assert_eq!(worker.stats().claims, 1);
    done(&worker, &first);
    done(&worker, &second);
    assert!(matches!(
        block_on(worker.next_async()).unwrap(),
        WorkerNext::Empty { .. }
    ));
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

/// Later acknowledgements wait in the worker, uncommitted, until a flush
/// commits them together; each caller then gets its own answer, a
/// conflict among them answering that one alone.
fn held_acknowledgements_commit_together_and_each_gets_its_answer(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 3);
    let options = WorkerOptions::default().with_fetch(5);
    let worker = Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap();
    let (a, b, c) = (
        task(worker.next().unwrap()),
        task(worker.next().unwrap()),
        task(worker.next().unwrap()),
    );
    let accepted = worker
        .submit_later(&a, &key("done"), &Output::bytes("a"))
        .unwrap();
    // The same key with another output: a conflict once the first is in.
    let conflict = worker
        .submit_later(&a, &key("done"), &Output::bytes("other"))
        .unwrap();
    let second = worker
        .submit_later(&b, &key("done"), &Output::bytes("b"))
        .unwrap();
    let failed = worker.fail_later(&c, Retry::Never).unwrap();
    assert_eq!(worker.held(), 4);
    let state = |task: &TaskRef| f.store.read_task(&caller, task).unwrap().record.attempts[0].state;
    assert_eq!(state(&tasks[0]), TaskState::Leased, "held, not made");

    assert_eq!(worker.flush(), 4);
    assert_eq!(worker.held(), 0);
    assert_eq!((worker.stats().held, worker.stats().flushes), (4, 1));
    assert_eq!(
        tasks.iter().map(state).collect::<Vec<_>>(),
        [TaskState::Done, TaskState::Done, TaskState::Failed]
    );
    assert!(matches!(
        worker.answer(accepted).unwrap(),
        Submitted::Accepted(_)
    ));
    assert_eq!(worker.answer(conflict).unwrap_err().status(), 409);
    assert!(matches!(
        worker.answer(second).unwrap(),
        Submitted::Accepted(_)
    ));
    assert_eq!(worker.answer(failed).unwrap(), TaskState::Failed);
    assert_eq!(worker.flush(), 0, "nothing held");
}

/// What commits held acknowledgements without a flush: `fetch` of them,
/// `next` finding the oldest held for `max_hold`, `next` refilling an
/// empty buffer, an answer asked for while held, and the worker's drop.
fn held_acknowledgements_commit_when_due(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 8);
    let options = WorkerOptions::default()
        .with_fetch(3)
        .with_max_hold(Duration::from_secs(1));
    let worker = Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap();
    let done = |claimed: &Claimed| {
        worker
            .submit_later(claimed, &key("done"), &Output::bytes("ok"))
            .unwrap()
    };
    let mut pending = Vec::new();

    // Three held (the fetch): committed at once.
    for _ in 0..3 {
        pending.push(done(&task(worker.next().unwrap())));
    }
    assert_eq!((worker.held(), worker.stats().flushes), (0, 1));

    // One held a second (the max hold): the next `next` commits it.
    pending.push(done(&task(worker.next().unwrap())));
    assert_eq!(worker.held(), 1);
    f.clock.advance(Duration::from_secs(1));
    let fifth = task(worker.next().unwrap());
    assert_eq!((worker.held(), worker.stats().flushes), (0, 2));

    // One held while the buffer runs empty: the refill commits it first.
    pending.push(done(&fifth));
    let sixth = task(worker.next().unwrap());
    assert_eq!((worker.held(), worker.buffered()), (1, 0));
    let seventh = task(worker.next().unwrap());
    assert_eq!((worker.held(), worker.stats().flushes), (0, 3));

    // An answer asked for while held commits it.
    let asked = done(&sixth);
    assert!(matches!(
        worker.answer(asked).unwrap(),
        Submitted::Accepted(_)
    ));
    assert_eq!(worker.stats().flushes, 4);

    // The worker's drop commits what it holds.
    pending.push(done(&seventh));
    let eighth = task(worker.next().unwrap());
    pending.push(done(&eighth));
    assert_eq!(worker.held(), 2);
    let unanswered = pending.pop().unwrap().try_answer().unwrap_err();
    drop(worker);
    pending.push(unanswered);
    assert_eq!(pending.len(), 7);
    for pending in pending {
        let answer = pending.try_answer().expect("answered by the drop's commit");
        assert!(matches!(answer.unwrap(), Submitted::Accepted(_)));
    }
    let view = |task: &TaskRef| f.store.read_task(&caller, task).unwrap().record.attempts[0].state;
    assert!(
        tasks.iter().all(|task| view(task) == TaskState::Done),
        "every acknowledgement was made"
    );
}

/// A held acknowledgement is not made: a process that ends before the
/// flush (here, a worker never dropped) leaves the task leased, and it
/// comes back when the lease lapses.
fn a_held_acknowledgement_lost_with_its_process_leaves_the_task_to_lapse(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_lease_duration(Duration::from_secs(60))
    });
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 1);
    let worker = Worker::new(
        &f.store,
        caller.clone(),
        ns.clone(),
        q.clone(),
        WorkerOptions::default(),
    )
    .unwrap();
    let claimed = task(worker.next().unwrap());
    let pending = worker
        .submit_later(&claimed, &key("done"), &Output::bytes("ok"))
        .unwrap();
    std::mem::forget(pending);
    std::mem::forget(worker);
    let attempt = f
        .store
        .read_task(&caller, &tasks[0])
        .unwrap()
        .record
        .attempts[0]
        .clone();
    assert_eq!(attempt.state, TaskState::Leased);

    f.clock.advance(Duration::from_secs(61));
    let other = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let again = f.claim(&other, &ns, &q);
    assert_eq!(again.task, tasks[0]);
    assert_eq!(
        again.lease.token().as_i64(),
        2,
        "the next lease of the task"
    );
}

/// Threads sharing a worker and acknowledging later: every task is done
/// once, every answer is an acceptance, and flushes carry many at a time.
fn worker_threads_acknowledging_later_do_each_task_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 40);
    let options = WorkerOptions::default().with_fetch(7);
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();
    let seen = four_threads_until_empty(&worker, |claimed| {
        worker
            .submit_later(claimed, &key("done"), &Output::bytes("ok"))
            .unwrap()
    });
    let seen = seen.into_iter().map(|(task, pending)| {
        let answer = worker.answer(pending).unwrap();
        assert!(matches!(answer, Submitted::Accepted(_)), "{answer:?}");
        task
    });
    assert_eq!(sorted(seen), sorted(tasks), "every task done once");
    let stats = worker.stats();
    assert_eq!(stats.held, 40);
    assert!(stats.flushes < stats.held, "coalesced: {stats:?}");
}

fn bad_worker_options_are_invalid_input(db: &TestDb) {
    let (ns, q) = (namespace("farm"), queue("frames"));
    let lease = Duration::from_secs(300);
    let f = Fixture::with(db, |config| config.with_lease_duration(lease));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    for options in [
        WorkerOptions::default().with_fetch(0),
        WorkerOptions::default().with_fetch(101),
        WorkerOptions::default().with_min_lease_left(lease),
        WorkerOptions::default().with_max_hold(Duration::from_secs(10)),
    ] {
        let error =
            Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
    }
}

conformance!(
    a_worker_claims_ahead_and_hands_out_in_claim_order,
    a_submission_carries_the_next_claim_into_the_buffer,
    a_worker_heartbeats_its_buffer_and_lets_go_of_short_leases,
    release_hands_the_buffer_back_at_once,
    release_keeps_the_try_of_a_task_on_its_last_try,
    worker_threads_share_a_worker_and_each_task_is_done_once,
    an_async_host_awaits_the_next_task,
    held_acknowledgements_commit_together_and_each_gets_its_answer,
    held_acknowledgements_commit_when_due,
    a_held_acknowledgement_lost_with_its_process_leaves_the_task_to_lapse,
    worker_threads_acknowledging_later_do_each_task_once,
    bad_worker_options_are_invalid_input,
);
