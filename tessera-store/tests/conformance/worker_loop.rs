//! The worker loop: it claims ahead in batches (one admission offer a
//! refill), hands out buffered tasks in claim order, heartbeats its buffer
//! in one transaction, lets go of a buffered task whose lease runs short,
//! hands its buffer back on release, and acknowledges through the
//! completer, from threads and from an async host.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use tessera_store::{
    Claimed, EmptyReason, Error, Grant, IdempotencyKey, Output, Submitted, TaskRef, Worker,
    WorkerNext, WorkerOptions,
};

use crate::harness::{Fixture, TestDb, namespace, queue};

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
    assert_eq!((stats.claims, stats.claimed, stats.handed_out), (2, 5, 5));
    assert_eq!(worker.buffered(), 0);
    match worker.next().unwrap() {
        WorkerNext::Empty { reason, .. } => assert_eq!(reason, EmptyReason::Empty),
        other => panic!("expected an empty queue, got {other:?}"),
    }
    assert_eq!(worker.stats().claims, 3);
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
    done(&worker, &first);
}

fn worker_threads_share_a_worker_and_each_task_is_done_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&caller, &ns, &q, 40);
    let options = WorkerOptions::default().with_fetch(7);
    let worker = Worker::new(&f.store, caller, ns.clone(), q.clone(), options).unwrap();
    let mut seen: Vec<TaskRef> = thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let WorkerNext::Task(claimed) = worker.next().unwrap() {
                        done(&worker, &claimed);
                        mine.push(claimed.task);
                    }
                    mine
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    });
    seen.sort();
    let mut expected = tasks;
    expected.sort();
    assert_eq!(seen, expected, "every task done once");
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

fn bad_worker_options_are_invalid_input(db: &TestDb) {
    let (ns, q) = (namespace("farm"), queue("frames"));
    let lease = Duration::from_secs(300);
    let f = Fixture::with(db, |config| config.with_lease_duration(lease));
    let caller = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    for options in [
        WorkerOptions::default().with_fetch(0),
        WorkerOptions::default().with_fetch(101),
        WorkerOptions::default().with_min_lease_left(lease),
    ] {
        let error =
            Worker::new(&f.store, caller.clone(), ns.clone(), q.clone(), options).unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
    }
}

conformance!(
    a_worker_claims_ahead_and_hands_out_in_claim_order,
    a_worker_heartbeats_its_buffer_and_lets_go_of_short_leases,
    release_hands_the_buffer_back_at_once,
    worker_threads_share_a_worker_and_each_task_is_done_once,
    an_async_host_awaits_the_next_task,
    bad_worker_options_are_invalid_input,
);
