//! The async claim: admission awaited through a `Waker`, on tokio and on a
//! bare executor made of `std::task` and a parked thread.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use tessera_store::{ClaimOutcome, ClaimStart, Error, Grant};

use crate::harness::{Fixture, TestDb, namespace, queue};

/// The second executor: polls on this thread, parking between polls until
/// the future's waker unparks it.
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

/// A waker that counts its wakes.
struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn assert_send<T: Send>(_: &T) {}

/// Takes the one unit of `f`'s window for `worker` in `renders/jobs`.
fn hold(f: &Fixture<'_>, worker: &tessera_store::Caller) -> tessera_store::ClaimPermit {
    match f
        .store
        .begin_claim(worker, &namespace("renders"), &queue("jobs"))
        .unwrap()
    {
        ClaimStart::Admitted(permit) => permit,
        ClaimStart::Queued(_) => panic!("the window has room for one"),
    }
}

fn a_waiting_async_claim_is_woken_when_capacity_frees(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(30));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    let held = hold(&f, &worker);

    // Polled by hand: pending, with nothing offered before the first poll.
    let future = f.store.claim_async(&worker, &ns, &q);
    assert_send(&future);
    let mut future = Box::pin(future);
    assert_eq!(
        f.store.claim_stats().pending,
        0,
        "not offered before a poll"
    );
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&count));
    let mut cx = Context::from_waker(&waker);
    assert!(future.as_mut().poll(&mut cx).is_pending());
    assert_eq!(f.store.claim_stats().pending, 1);
    f.clock.advance(Duration::from_millis(40));
    // Capacity frees on another path: the future's waker is called.
    drop(held);
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(outcome) = future.as_mut().poll(&mut cx) else {
        panic!("woken with its turn");
    };
    let ClaimOutcome::Granted(claimed) = outcome.unwrap() else {
        panic!("a lease");
    };
    assert_eq!(claimed.task, task);
    assert_eq!(claimed.waited, Duration::from_millis(40));
    assert_eq!(f.store.claim_stats().in_flight, 0);
}

fn an_async_claim_runs_on_a_bare_executor_and_on_tokio(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(30));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let tasks = f.enqueue(&worker, &ns, &q, 2);

    // A parked thread's executor: the claim waits while another holds the
    // window, and completes when it is handed back.
    let held = hold(&f, &worker);
    let outcome = thread::scope(|scope| {
        let claimer = scope.spawn(|| block_on(f.store.claim_async(&worker, &ns, &q)));
        while f.store.claim_stats().pending == 0 {
            thread::yield_now();
        }
        drop(held);
        claimer.join().unwrap()
    });
    assert_eq!(outcome.unwrap().claimed().unwrap().task, tasks[0]);

    // Tokio: the permit is awaited on the runtime, the lease transaction
    // run off it (as a host on PostgreSQL must).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let held = hold(&f, &worker);
    let permit = runtime.block_on(async {
        let waiting = f.store.claim_permit(&worker, &ns, &q);
        // Handed back once the claim waits for it.
        let release = async {
            while f.store.claim_stats().pending == 0 {
                tokio::task::yield_now().await;
            }
            drop(held);
        };
        let (permit, ()) = tokio::join!(waiting, release);
        permit
    });
    let outcome = f.store.finish_claim(permit.unwrap()).unwrap();
    assert_eq!(outcome.claimed().unwrap().task, tasks[1]);

    // Dropped while it waits (a client that left), it leaves the room and
    // never takes a turn.
    let held = hold(&f, &worker);
    let timed_out = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(20),
            f.store.claim_permit(&worker, &ns, &q),
        )
        .await
    });
    assert!(timed_out.is_err(), "still waiting when it was dropped");
    assert_eq!(f.store.claim_stats().pending, 0);
    drop(held);
    let stats = f.store.claim_stats();
    assert_eq!(
        (stats.pending, stats.in_flight),
        (0, 0),
        "no turn went to it"
    );
}

fn an_async_claim_past_its_deadline_is_429_without_a_host_timer(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(2));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    f.enqueue(&worker, &ns, &q, 1);
    let held = hold(&f, &worker);
    let outcome = thread::scope(|scope| {
        let claimer = scope.spawn(|| block_on(f.store.claim_async(&worker, &ns, &q)));
        while f.store.claim_stats().pending == 0 {
            thread::yield_now();
        }
        // Nothing else happens at the gate: only the store's deadline
        // thread sees the deadline pass.
        f.clock.advance(Duration::from_secs(3));
        claimer.join().unwrap()
    });
    let error = outcome.unwrap_err();
    assert!(matches!(error, Error::RateLimited { .. }), "{error:?}");
    assert_eq!(error.status(), 429);
    drop(held);
    assert_eq!(f.store.claim_stats().pending, 0);
}

conformance! {
    a_waiting_async_claim_is_woken_when_capacity_frees,
    an_async_claim_runs_on_a_bare_executor_and_on_tokio,
    an_async_claim_past_its_deadline_is_429_without_a_host_timer,
}
