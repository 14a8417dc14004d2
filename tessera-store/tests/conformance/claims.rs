//! Claims through admission: real threads on the blocking gate, the sans-IO
//! steps, fairness, re-checks after waiting, deadlines, cancellation, idle
//! pacing, and capacity that is never leaked.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use tessera_store::{
    AdmissionConfig, Caller, ClaimEvent, ClaimOutcome, ClaimStart, EnqueueOptions, Error, Grant,
    Namespace, QueueName, Retry, Store,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

/// Spins (yielding) until `condition` holds; used only to wait for real
/// threads to reach their park, never to let time pass.
fn until(mut condition: impl FnMut() -> bool) {
    while !condition() {
        std::thread::yield_now();
    }
}

fn secs(outcome: &ClaimOutcome) -> u64 {
    outcome.retry_after().expect("an empty claim").as_secs()
}

fn one_hundred_simultaneous_claims_get_one_hundred_distinct_leases(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let keys: Vec<Caller> = (0..10)
        .map(|_| f.login(&f.full_worker(Grant::Namespace(ns.clone()))))
        .collect();
    let tasks: HashSet<_> = f.enqueue(&keys[0], &ns, &q, 100).into_iter().collect();

    let barrier = Barrier::new(100);
    let claims: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..100)
            .map(|n| {
                let (store, caller, barrier) = (&f.store, &keys[n % 10], &barrier);
                let (ns, q) = (&ns, &q);
                scope.spawn(move || {
                    barrier.wait();
                    store.claim(caller, ns, q)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut leased = HashSet::new();
    for claim in claims {
        let claimed = match claim {
            Ok(ClaimOutcome::Granted(claimed)) => claimed,
            other => panic!("every claim gets a lease, got {other:?}"),
        };
        assert_eq!(claimed.lease.token().as_i64(), 1);
        assert!(leased.insert(claimed.task), "a task was leased twice");
    }
    assert_eq!(leased, tasks);
    let stats = f.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));
}

fn a_burst_of_a_thousand_claims_from_one_key_waits_instead_of_429(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &q, 1000);

    // The burst arrives at once; the default window admits 32.
    let mut running = Vec::new();
    let mut queued = HashSet::new();
    for _ in 0..1000 {
        match f.store.begin_claim(&worker, &ns, &q).unwrap() {
            ClaimStart::Admitted(permit) => running.push(permit),
            ClaimStart::Queued(ticket) => {
                queued.insert(ticket);
            }
        }
    }
    assert_eq!((running.len(), queued.len()), (32, 968));

    let mut leased = HashSet::new();
    let mut max_wait = Duration::ZERO;
    while let Some(permit) = running.pop() {
        f.clock.advance(Duration::from_millis(5));
        let outcome = f.store.finish_claim(permit).unwrap();
        max_wait = max_wait.max(outcome.waited());
        let claimed = outcome.claimed().expect("a lease").clone();
        assert!(leased.insert(claimed.task));
        while let Some(event) = f.store.poll_claim_event() {
            match event {
                ClaimEvent::Granted { ticket, permit } => {
                    assert!(queued.remove(&ticket));
                    running.push(permit);
                }
                ClaimEvent::Rejected { error, .. } => panic!("a burst got {error:?}"),
            }
        }
    }
    assert_eq!(leased.len(), 1000);
    assert!(queued.is_empty());
    assert!(max_wait > Duration::ZERO, "later claims waited their turn");
    assert_eq!(f.store.claim_stats().in_flight, 0);
}

fn waiting_principals_take_turns(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(10));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let heavy = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let light = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&heavy, &ns, &q, 10);

    let mut running = Vec::new();
    for _ in 0..6 {
        if let ClaimStart::Admitted(permit) = f.store.begin_claim(&heavy, &ns, &q).unwrap() {
            running.push(permit);
        }
    }
    for _ in 0..2 {
        assert!(matches!(
            f.store.begin_claim(&light, &ns, &q).unwrap(),
            ClaimStart::Queued(_)
        ));
    }
    let mut order = Vec::new();
    while let Some(permit) = running.pop() {
        let outcome = f.store.finish_claim(permit).unwrap();
        let holder = outcome.claimed().unwrap().lease.holder().to_string();
        order.push(if holder == heavy.principal().to_string() {
            'H'
        } else {
            'L'
        });
        while let Some(event) = f.store.poll_claim_event() {
            let ClaimEvent::Granted { permit, .. } = event else {
                panic!("no rejection expected");
            };
            running.push(permit);
        }
    }
    // FIFO would serve the light key last; turns serve it second and fourth.
    assert_eq!(order.iter().collect::<String>(), "HHLHLHHH");
}

fn a_key_revoked_while_waiting_gets_401_and_the_task_stays_ready(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(10));
    let ns = namespace("renders");
    let holder = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let waiter_key = f.full_worker(Grant::Namespace(ns.clone()));
    let waiter = f.login(&waiter_key);
    let task = f.enqueue(&holder, &ns, &queue("jobs"), 1).remove(0);

    // The holder occupies the only slot, on an empty queue.
    let ClaimStart::Admitted(permit) = f.store.begin_claim(&holder, &ns, &queue("idle")).unwrap()
    else {
        panic!("the first claim is admitted");
    };
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| f.store.claim(&waiter, &ns, &queue("jobs")));
        until(|| f.store.claim_stats().pending == 1);
        f.store.revoke_key(&f.admin, waiter.key_id()).unwrap();
        assert!(f.store.finish_claim(permit).unwrap().claimed().is_none());
        let error = blocked.join().unwrap().unwrap_err();
        assert_eq!((error.status(), error.code()), (401, "unauthorized"));
    });
    let view = f.store.read_task(&holder, &task).unwrap();
    assert_eq!(
        view.record.attempts[0].state,
        tessera_store::TaskState::Ready
    );
    assert_eq!(view.record.last_token, None, "no token was spent");
    assert_eq!(f.store.claim_stats().in_flight, 0);
}

fn a_waiting_claim_past_its_deadline_is_429_and_never_granted(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(2));
    let ns = namespace("renders");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &queue("jobs"), 1);
    let ClaimStart::Admitted(permit) = f.store.begin_claim(&worker, &ns, &queue("idle")).unwrap()
    else {
        panic!("the first claim is admitted");
    };
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| f.store.claim(&worker, &ns, &queue("jobs")));
        until(|| f.store.claim_stats().pending == 1);
        f.clock.advance(Duration::from_secs(3));
        let error = blocked.join().unwrap().unwrap_err();
        assert_eq!((error.status(), error.code()), (429, "rate_limited"));
        assert!(error.retry_after().unwrap() >= Duration::from_secs(1));
        assert!(error.to_string().contains("wait"), "{error}");
    });
    drop(permit);
    let stats = f.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));
    assert!(f.claim(&worker, &ns, &queue("jobs")).lease.token().as_i64() == 1);
}

fn a_cancelled_waiting_claim_leaves_the_queue(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(10));
    let ns = namespace("renders");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &queue("jobs"), 1);
    let ClaimStart::Admitted(permit) = f.store.begin_claim(&worker, &ns, &queue("idle")).unwrap()
    else {
        panic!("the first claim is admitted");
    };
    let token = f.store.cancel_token();
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| {
            f.store
                .claim_cancellable(&worker, &ns, &queue("jobs"), &token)
        });
        until(|| f.store.claim_stats().pending == 1);
        token.cancel();
        let error = blocked.join().unwrap().unwrap_err();
        assert!(matches!(error, Error::Cancelled), "{error:?}");
    });
    assert_eq!(f.store.claim_stats().pending, 0);
    drop(permit);
    assert_eq!(f.store.claim_stats().in_flight, 0);
    // The task is still there for the next claim.
    f.claim(&worker, &ns, &queue("jobs"));
}

fn capacity_comes_back_after_a_panic_or_a_failed_transaction(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(10));
    let ns = namespace("renders");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &queue("jobs"), 2);

    std::thread::scope(|scope| {
        // A request handler panics while it holds the only slot; a claim
        // waiting behind it is granted all the same.
        let panicked = scope.spawn(|| {
            let _permit = match f.store.begin_claim(&worker, &ns, &queue("jobs")).unwrap() {
                ClaimStart::Admitted(permit) => permit,
                ClaimStart::Queued(_) => panic!("the slot was free"),
            };
            until(|| f.store.claim_stats().pending == 1);
            panic!("handler bug");
        });
        until(|| f.store.claim_stats().in_flight == 1);
        let waiting = scope.spawn(|| f.store.claim(&worker, &ns, &queue("jobs")));
        assert!(panicked.join().is_err());
        assert!(waiting.join().unwrap().unwrap().claimed().is_some());
    });
    assert_eq!(f.store.claim_stats().in_flight, 0);

    // A lease transaction the storage refuses.
    f.store.refuse_writes(true);
    let error = f.store.claim(&worker, &ns, &queue("jobs")).unwrap_err();
    assert_eq!(error.code(), "storage_quota_exhausted");
    f.store.refuse_writes(false);
    let stats = f.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));
    f.claim(&worker, &ns, &queue("jobs"));
}

fn a_full_waiting_room_is_429_with_a_reason(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_admission(AdmissionConfig {
            initial_concurrency: 1,
            max_pending: 2,
            ..AdmissionConfig::default()
        })
    });
    let ns = namespace("renders");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let mut starts = Vec::new();
    for _ in 0..3 {
        starts.push(f.store.begin_claim(&worker, &ns, &queue("q")).unwrap());
    }
    let error = f.store.begin_claim(&worker, &ns, &queue("q")).unwrap_err();
    assert_eq!((error.status(), error.code()), (429, "rate_limited"));
    assert!(error.retry_after_seconds().unwrap() >= 1);
    // A queued claim withdrawn by its host frees its slot.
    let ClaimStart::Queued(ticket) = starts.pop().unwrap() else {
        panic!("queued");
    };
    assert!(f.store.cancel_claim(ticket));
    assert!(!f.store.cancel_claim(ticket));
    assert!(matches!(
        f.store.begin_claim(&worker, &ns, &queue("q")).unwrap(),
        ClaimStart::Queued(_)
    ));
}

fn empty_claims_pace_five_to_sixty_and_restart_on_enqueue_and_grant(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let idle = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let other = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let empty = |caller: &Caller, queue: &QueueName| {
        let (outcome, cost) = f.store.measure(|s| s.claim(caller, &ns, queue).unwrap());
        if db.meters_rows() {
            assert_eq!(cost.rows_written, 0, "an empty claim writes nothing");
        }
        secs(&outcome)
    };
    let ladder: Vec<u64> = (0..6).map(|_| empty(&idle, &q)).collect();
    assert_eq!(ladder, [5, 10, 20, 40, 60, 60]);

    // An enqueue restarts the queue for every key, even if another key
    // takes the task.
    f.enqueue(&other, &ns, &q, 1);
    f.claim(&other, &ns, &q);
    assert_eq!(empty(&idle, &q), 5);
    assert_eq!(empty(&idle, &q), 10);

    // A grant on any queue restarts the key.
    f.enqueue(&other, &ns, &queue("elsewhere"), 1);
    f.claim(&idle, &ns, &queue("elsewhere"));
    assert_eq!(empty(&idle, &q), 5);
    // The hints are per key: the other key is at its own step.
    assert_eq!(empty(&other, &q), 5);
}

/// A host driving claims the async way, on one thread with virtual time.
fn drive_async(store: &Store, claims: &[(Caller, Namespace, QueueName)]) -> Vec<ClaimOutcome> {
    let mut running = Vec::new();
    let mut waiting = HashMap::new();
    for (n, (caller, ns, q)) in claims.iter().enumerate() {
        match store.begin_claim(caller, ns, q).unwrap() {
            ClaimStart::Admitted(permit) => running.push((n, permit)),
            ClaimStart::Queued(ticket) => {
                waiting.insert(ticket, n);
            }
        }
    }
    let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None; claims.len()];
    while let Some((n, permit)) = running.pop() {
        outcomes[n] = Some(store.finish_claim(permit).unwrap());
        while let Some(event) = store.poll_claim_event() {
            let n = waiting.remove(&event.ticket()).unwrap();
            match event {
                ClaimEvent::Granted { permit, .. } => running.push((n, permit)),
                ClaimEvent::Rejected { error, .. } => panic!("{error:?}"),
            }
        }
    }
    outcomes.into_iter().map(Option::unwrap).collect()
}

fn async_steps_report_the_wait_and_the_limit_and_wake_the_host(db: &TestDb) {
    let f = Fixture::with_capacity(db, 2, Duration::from_secs(10));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &q, 4);
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    f.store.set_claim_waker(Some(Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })));

    // Two admitted at once; the third waits until one is dropped elsewhere.
    let first = f.store.begin_claim(&worker, &ns, &q).unwrap();
    let second = f.store.begin_claim(&worker, &ns, &q).unwrap();
    let ClaimStart::Queued(ticket) = f.store.begin_claim(&worker, &ns, &q).unwrap() else {
        panic!("the window is full");
    };
    assert!(f.store.poll_claim_timeout().is_some());
    f.clock.advance(Duration::from_millis(250));
    drop(first);
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    let Some(ClaimEvent::Granted {
        ticket: granted,
        permit,
    }) = f.store.poll_claim_event()
    else {
        panic!("the dropped permit's capacity went to the waiter");
    };
    assert_eq!(granted, ticket);
    assert_eq!(permit.waited(), Duration::from_millis(250));
    let outcome = f.store.finish_claim(permit).unwrap();
    assert_eq!(outcome.wait_ms(), 250);
    assert_eq!(outcome.concurrency_limit(), 2);
    let ClaimStart::Admitted(second) = second else {
        panic!("admitted");
    };
    assert_eq!(f.store.finish_claim(second).unwrap().wait_ms(), 0);
    assert_eq!(f.store.poll_claim_timeout(), None);

    let rest = drive_async(&f.store, &vec![(worker.clone(), ns.clone(), q.clone()); 3]);
    let granted = rest.iter().filter(|o| o.claimed().is_some()).count();
    assert_eq!(granted, 2, "four tasks, two claimed before");
    assert_eq!(f.store.claim_stats().in_flight, 0);
}

fn claims_without_the_scope_or_grant_never_enter_admission(db: &TestDb) {
    let f = Fixture::with_capacity(db, 1, Duration::from_secs(10));
    let ns = namespace("renders");
    let reader = f.login(
        &f.store
            .create_key(
                &f.admin,
                &tessera_store::KeySpec::keyed("acme")
                    .with_scopes([tessera_store::Scope::Read])
                    .with_grant(Grant::Namespace(ns.clone())),
            )
            .unwrap(),
    );
    let outsider = f.login(&f.full_worker(Grant::Namespace(namespace("other"))));
    for caller in [&reader, &outsider] {
        let error = f.store.claim(caller, &ns, &queue("q")).unwrap_err();
        assert_eq!(error.status(), 403);
    }
    let stats = f.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));
}

fn a_granted_claim_serializes_its_artifact_key_with_the_lease(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("frames"));
    f.enqueue(&worker, &ns, &q, 1);
    let claimed = f.claim(&worker, &ns, &q);
    let json = serde_json::to_value(&claimed).unwrap();
    let expected = format!("{}.a1.t1", claimed.task.id);
    assert_eq!(json["lease"]["artifact"], expected.as_str());
    assert_eq!(claimed.lease.artifact().as_str(), expected);
    // The key is derived from the lease; reading it back checks it.
    let back: tessera_store::Claimed = serde_json::from_value(json).unwrap();
    assert_eq!(back, claimed);
    let outcome = serde_json::to_value(ClaimOutcome::Granted(claimed.clone())).unwrap();
    assert_eq!(outcome["lease"]["artifact"], expected.as_str());
    // An extended lease names the same key.
    let extended = f
        .store
        .heartbeat(&worker, &claimed.task, claimed.lease.token())
        .unwrap();
    let json = serde_json::to_value(&extended).unwrap();
    assert_eq!(json["artifact"], expected.as_str());
}

/// Threads race to claim one task, each failing it back at once: every
/// claim sees the task as the last commit left it, so each grant carries
/// the next token and none reads a record torn between two commits.
fn threads_racing_for_one_task_get_every_token_in_turn(db: &TestDb) {
    const THREADS: usize = 4;
    const GRANTS: usize = 400;
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    // Enough tries for every grant: each failure here asks for a retry.
    let options = EnqueueOptions::default().with_max_tries(GRANTS as u32);
    let task = f
        .store
        .enqueue(&worker, &ns, &q, &json_brief(0), &options)
        .unwrap();
    let granted = AtomicUsize::new(0);
    let mut tokens: Vec<i64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (f, worker, granted, ns, q, task) = (&f, &worker, &granted, &ns, &q, &task);
                scope.spawn(move || {
                    let mut tokens = Vec::new();
                    while granted.load(Ordering::SeqCst) < GRANTS {
                        let ClaimOutcome::Granted(claimed) = f.store.claim(worker, ns, q).unwrap()
                        else {
                            continue;
                        };
                        assert_eq!(&claimed.task, task);
                        let token = claimed.lease.token();
                        tokens.push(token.as_i64());
                        granted.fetch_add(1, Ordering::SeqCst);
                        f.store
                            .fail(worker, &claimed.task, token, Retry::After(Duration::ZERO))
                            .unwrap();
                    }
                    tokens
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    tokens.sort_unstable();
    let expected: Vec<i64> = (1..=i64::try_from(tokens.len()).unwrap()).collect();
    assert_eq!(tokens, expected);
}

/// Two claims at once on a queue whose one task has two alternatives:
/// each gets one, round after round. Where a claim passes over a task
/// another transaction holds (PostgreSQL), the one that found the task
/// locked looks again rather than answer empty while its second
/// alternative waits.
fn two_claims_at_once_take_both_alternatives_of_one_task(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("renders");
    let workers: Vec<Caller> = (0..2)
        .map(|_| f.login(&f.full_worker(Grant::Namespace(ns.clone()))))
        .collect();
    for round in 0..20 {
        let q = queue(&format!("pairs{round}"));
        let task = f
            .store
            .enqueue(
                &workers[0],
                &ns,
                &q,
                &json_brief(round),
                &EnqueueOptions::default().with_alternatives(2),
            )
            .unwrap();
        let barrier = Barrier::new(2);
        let outcomes: Vec<ClaimOutcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = workers
                .iter()
                .map(|worker| {
                    let (store, barrier, ns, q) = (&f.store, &barrier, &ns, &q);
                    scope.spawn(move || {
                        barrier.wait();
                        store.claim(worker, ns, q).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let attempts: HashSet<u16> = outcomes
            .iter()
            .map(|outcome| match outcome {
                ClaimOutcome::Granted(claimed) => {
                    assert_eq!(claimed.task, task);
                    claimed.lease.attempt().as_u16()
                }
                other => panic!("round {round}: {other:?} while an alternative waits"),
            })
            .collect();
        assert_eq!(attempts, HashSet::from([1, 2]), "round {round}");
    }
}

conformance! {
    two_claims_at_once_take_both_alternatives_of_one_task,
    one_hundred_simultaneous_claims_get_one_hundred_distinct_leases,
    a_burst_of_a_thousand_claims_from_one_key_waits_instead_of_429,
    waiting_principals_take_turns,
    a_key_revoked_while_waiting_gets_401_and_the_task_stays_ready,
    a_waiting_claim_past_its_deadline_is_429_and_never_granted,
    a_cancelled_waiting_claim_leaves_the_queue,
    capacity_comes_back_after_a_panic_or_a_failed_transaction,
    a_full_waiting_room_is_429_with_a_reason,
    empty_claims_pace_five_to_sixty_and_restart_on_enqueue_and_grant,
    async_steps_report_the_wait_and_the_limit_and_wake_the_host,
    claims_without_the_scope_or_grant_never_enter_admission,
    a_granted_claim_serializes_its_artifact_key_with_the_lease,
    threads_racing_for_one_task_get_every_token_in_turn,
}
