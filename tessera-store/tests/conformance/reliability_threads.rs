//! Two hundred threads hammer claim, heartbeat and submit against a claim
//! capacity of 32, with a latency target so low that the adaptive limit
//! comes down: nothing deadlocks, no capacity leaks, and the only `429`s are
//! the overload ones.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tessera_store::{
    AdmissionConfig, Brief, ClaimOutcome, EnqueueOptions, Error, Grant, IdempotencyKey, KeySpec,
    Output, Scope, Store, StoreConfig, Submitted, TaskRef,
};

use crate::harness::{TestDb, namespace, queue};

const THREADS: usize = 200;
/// Threads per key: principals take turns in admission, so several share
/// one.
const THREADS_PER_KEY: usize = 10;

/// What one hammering thread saw.
#[derive(Debug, Default)]
struct Seen {
    leased: Vec<TaskRef>,
    lowest_limit: u32,
    rejections: Vec<String>,
}

/// Runs `THREADS` threads through `cycles` claim, heartbeat and submit
/// cycles each with `max_pending` waiting slots, checks that every granted
/// claim got its own task, that every unit of capacity came back and that a
/// task whose claim was refused stays ready, and returns the lowest
/// admission limit seen and the reasons of every `429`. A refused claim is
/// retried at once if `retry`, given up otherwise.
fn hammer(db: &TestDb, cycles: usize, max_pending: usize, retry: bool) -> (u32, Vec<String>) {
    // The system clock: admission measures real service times, and any
    // claim transaction takes longer than the 10 µs target.
    let store: Arc<Store> = Arc::new(
        db.open(
            StoreConfig::default()
                .with_lease_duration(Duration::from_secs(3600))
                .with_admission(AdmissionConfig {
                    initial_concurrency: 32,
                    max_concurrency: 32,
                    min_concurrency: 1,
                    max_pending,
                    max_wait: Duration::from_secs(30),
                    target: Duration::from_micros(10),
                    ..AdmissionConfig::default()
                }),
        ),
    );
    let (ns, q) = (namespace("farm"), queue("frames"));
    let admin_key = store.create_admin_key("operators").unwrap();
    let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    for n in 0..THREADS * cycles {
        store
            .enqueue(
                &admin,
                &ns,
                &q,
                &Brief::Json(serde_json::json!({ "n": n })),
                &EnqueueOptions::default(),
            )
            .unwrap();
    }
    let workers: Vec<_> = (0..THREADS / THREADS_PER_KEY)
        .map(|_| {
            let key = store
                .create_key(
                    &admin,
                    &KeySpec::keyed("acme")
                        .with_scopes([Scope::Claim])
                        .with_grant(Grant::Namespace(ns.clone())),
                )
                .unwrap();
            store.authenticate(Some(key.secret.expose())).unwrap()
        })
        .collect();

    // Threads are detached, so a deadlocked one cannot hang the test: the
    // watchdog below gives up on it and fails.
    let (done, finished) = mpsc::channel();
    // All threads offer their first claim at once.
    let start = Arc::new(Barrier::new(THREADS));
    for n in 0..THREADS {
        let start = Arc::clone(&start);
        let (store, caller) = (Arc::clone(&store), workers[n / THREADS_PER_KEY].clone());
        let (ns, q, done) = (ns.clone(), q.clone(), done.clone());
        std::thread::spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(|| {
                start.wait();
                let mut seen = Seen {
                    lowest_limit: u32::MAX,
                    ..Seen::default()
                };
                for cycle in 0..cycles {
                    let claimed = loop {
                        match store.claim(&caller, &ns, &q) {
                            Ok(ClaimOutcome::Granted(claimed)) => break Some(claimed),
                            Ok(empty) => panic!("a task waits for every claim: {empty:?}"),
                            // Retried at once: the test is about the store,
                            // not about honouring Retry-After.
                            Err(Error::RateLimited { reason, .. }) => {
                                seen.rejections.push(reason);
                                if !retry {
                                    break None;
                                }
                            }
                            Err(error) => panic!("claim: {error:?}"),
                        }
                    };
                    let Some(claimed) = claimed else {
                        continue;
                    };
                    seen.lowest_limit = seen.lowest_limit.min(claimed.concurrency_limit);
                    let token = claimed.lease.token();
                    store.heartbeat(&caller, &claimed.task, token).unwrap();
                    let key = IdempotencyKey::parse(&format!("t{n}c{cycle}")).unwrap();
                    let output = Output::bytes(format!("{n}/{cycle}"));
                    let submitted = store
                        .submit(&caller, &claimed.task, token, &key, &output)
                        .unwrap();
                    assert!(matches!(submitted, Submitted::Accepted(_)));
                    seen.leased.push(claimed.task);
                }
                seen
            }));
            let _ = done.send(result);
        });
    }

    let deadline = Instant::now() + Duration::from_secs(300);
    let mut leased = HashSet::new();
    let mut lowest_limit = u32::MAX;
    let mut rejections = Vec::new();
    for _ in 0..THREADS {
        let wait = deadline.saturating_duration_since(Instant::now());
        let result = finished.recv_timeout(wait).unwrap_or_else(|_| {
            panic!(
                "threads still running after the watchdog's limit: {:?}",
                store.claim_stats()
            )
        });
        let seen = match result {
            Ok(seen) => seen,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        for task in seen.leased {
            assert!(leased.insert(task), "a task was leased twice");
        }
        lowest_limit = lowest_limit.min(seen.lowest_limit);
        rejections.extend(seen.rejections);
    }

    // Every granted claim got its own task, every refused one left its task
    // ready, and every capacity unit came back.
    let refused = if retry { 0 } else { rejections.len() };
    assert_eq!(leased.len() + refused, THREADS * cycles);
    let stats = store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0), "{stats:?}");
    let health = store.health(&admin, &ns).unwrap();
    assert_eq!(health.attempts.done, leased.len() as u64);
    assert_eq!(health.attempts.ready, refused as u64);
    assert_eq!(health.attempts.total(), (THREADS * cycles) as u64);
    eprintln!(
        "lowest limit {lowest_limit}, {} rejections, {stats:?}",
        rejections.len()
    );
    (lowest_limit, rejections)
}

const WAIT_EXCEEDED: &str = "maximum claim wait exceeded";

fn two_hundred_threads_hammer_a_capacity_of_thirty_two(db: &TestDb) {
    let (lowest_limit, rejections) = hammer(db, 5, 2048, true);
    // The latency target was missed, so the limit came down from 32.
    assert!(
        lowest_limit < 32,
        "the limit never decreased: {lowest_limit}"
    );
    // The waiting room outnumbers the threads, so the only `429` admission
    // may give is a claim that waited past its 30 s limit.
    for reason in &rejections {
        assert_eq!(reason, WAIT_EXCEEDED);
    }
}

fn a_full_waiting_room_is_the_only_other_429(db: &TestDb) {
    // Fewer waiting slots than threads: the queue bound is reached.
    let (_, rejections) = hammer(db, 5, 64, false);
    assert!(!rejections.is_empty(), "200 threads never filled 64 slots");
    for reason in &rejections {
        assert!(
            [
                "pending claim queue is full",
                "fair share of waiting slots",
                WAIT_EXCEEDED
            ]
            .contains(&reason.as_str()),
            "{reason}"
        );
    }
}

fn two_hundred_threads_hammer_for_ten_thousand_cycles(db: &TestDb) {
    let (lowest_limit, rejections) = hammer(db, 50, 2048, true);
    assert!(
        lowest_limit < 32,
        "the limit never decreased: {lowest_limit}"
    );
    for reason in &rejections {
        assert_eq!(reason, WAIT_EXCEEDED);
    }
}

fn assert_send_sync<T: Send + Sync>() {}

/// No database: runs once, not per backend.
#[test]
fn the_store_is_shared_between_threads() {
    assert_send_sync::<Store>();
}

conformance! {
    two_hundred_threads_hammer_a_capacity_of_thirty_two,
    a_full_waiting_room_is_the_only_other_429,
    #[ignore = "long: run by .ci/run"]
    two_hundred_threads_hammer_for_ten_thousand_cycles,
}
