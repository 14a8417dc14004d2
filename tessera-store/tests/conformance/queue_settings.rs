//! Pausing and resuming a queue, and its concurrency limits, through the
//! public API.

use std::num::NonZeroU32;
use std::time::Duration;

use tessera_store::limits::LIMITED_RETRY_AFTER;
use tessera_store::{
    AuditQuery, Brief, Caller, ClaimOutcome, Clock, ConcurrencyLimit, EmptyReason, EnqueueOptions,
    Grant, IdempotencyKey, Namespace, Output, PartitionKey, QueueName, Retry, Scope, Submitted,
    TaskRef,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

/// A claim's empty reason, `None` if it granted a lease.
fn empty_reason(
    f: &Fixture<'_>,
    caller: &Caller,
    ns: &Namespace,
    q: &QueueName,
) -> Option<EmptyReason> {
    f.store.claim(caller, ns, q).unwrap().empty_reason()
}

fn limit(queue: Option<u32>, per_partition: Option<u32>) -> ConcurrencyLimit {
    ConcurrencyLimit {
        queue: queue.and_then(NonZeroU32::new),
        per_partition: per_partition.and_then(NonZeroU32::new),
    }
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::parse(name).unwrap()
}

fn a_paused_queue_takes_enqueues_refuses_claims_and_lets_live_leases_finish(db: &TestDb) {
    let mut f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let other = queue("other");
    f.enqueue(&worker, &ns, &q, 2);
    f.enqueue(&worker, &ns, &other, 1);
    let live = f.claim(&worker, &ns, &q);

    let paused = f.store.pause_queue(&worker, &ns, &q).unwrap();
    assert_eq!(paused.paused_at, Some(f.clock.now_utc()));
    // Pausing again keeps the first pause time.
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(f.store.pause_queue(&worker, &ns, &q).unwrap(), paused);

    // Enqueues go on; claims are empty, saying why, with a Retry-After.
    f.enqueue(&worker, &ns, &q, 1);
    let outcome = f.store.claim(&worker, &ns, &q).unwrap();
    assert_eq!(outcome.empty_reason(), Some(EmptyReason::Paused));
    assert!(outcome.retry_after().is_some_and(|wait| !wait.is_zero()));
    // Answered again, from the read path this time.
    assert_eq!(
        empty_reason(&f, &worker, &ns, &q),
        Some(EmptyReason::Paused)
    );
    let batch = f.store.claim_batch(&worker, &ns, &q, 5).unwrap();
    assert_eq!(
        (batch.claimed.len(), batch.reason),
        (0, Some(EmptyReason::Paused))
    );
    assert!(batch.retry_after.is_some());
    // Another queue of the namespace is not paused.
    assert_eq!(empty_reason(&f, &worker, &ns, &other), None);

    // The live lease heartbeats and submits.
    let (task, token) = (live.task.clone(), live.lease.token());
    f.store.heartbeat(&worker, &task, token).unwrap();
    let submitted = f
        .store
        .submit(&worker, &task, token, &key("done-1"), &Output::bytes("ok"))
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));

    // Health shows it; the pause survives a restart.
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(health.queues, vec![paused.clone()]);
    let config = f.config();
    f.reopen(config);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    assert_eq!(f.store.queue_settings(&worker, &ns, &q).unwrap(), paused);
    assert_eq!(
        empty_reason(&f, &worker, &ns, &q),
        Some(EmptyReason::Paused)
    );

    // Resumed, its tasks are claimed again, and the row is gone.
    let resumed = f.store.resume_queue(&worker, &ns, &q).unwrap();
    assert!(!resumed.is_paused());
    assert_eq!(empty_reason(&f, &worker, &ns, &q), None);
    assert_eq!(empty_reason(&f, &worker, &ns, &q), None);
    assert_eq!(empty_reason(&f, &worker, &ns, &q), Some(EmptyReason::Empty));
    assert!(f.store.health(&worker, &ns).unwrap().queues.is_empty());

    // Each change is audited once, naming the queue.
    let events = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    for (action, times) in [
        ("pause_queue", 2),
        ("resume_queue", 1),
        ("read_queue_settings", 1),
    ] {
        let found: Vec<_> = events
            .events
            .iter()
            .filter(|event| event.action.as_str() == action)
            .collect();
        assert_eq!(found.len(), times, "{action}");
        assert!(found.iter().all(|event| {
            event.resource.as_ref().map(|resource| resource.as_str()) == Some("queue:jobs")
        }));
    }
}

fn pausing_needs_the_enqueue_scope_and_the_grant(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let claimer = f.login(&f.worker(Grant::AllNamespaces));
    assert_eq!(
        f.store.pause_queue(&claimer, &ns, &q).unwrap_err().status(),
        403
    );
    assert_eq!(
        f.store
            .set_queue_limits(&claimer, &ns, &q, limit(Some(1), None))
            .unwrap_err()
            .status(),
        403
    );
    let elsewhere = f.login(&f.full_worker(Grant::Namespace(namespace("billing"))));
    assert_eq!(
        f.store
            .resume_queue(&elsewhere, &ns, &q)
            .unwrap_err()
            .status(),
        403
    );
    assert_eq!(
        f.store
            .queue_settings(&elsewhere, &ns, &q)
            .unwrap_err()
            .status(),
        403
    );
    let reader = f.login(&f.key(&[Scope::Read], Grant::AllNamespaces));
    let unset = f.store.queue_settings(&reader, &ns, &q).unwrap();
    assert_eq!(
        (unset.paused_at, unset.limit),
        (None, ConcurrencyLimit::NONE)
    );
}

fn a_queue_limit_caps_its_leases_and_a_submit_frees_a_slot(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 5);
    let settings = f
        .store
        .set_queue_limits(&worker, &ns, &q, limit(Some(2), None))
        .unwrap();
    assert_eq!(settings.limit, limit(Some(2), None));
    let first = f.claim(&worker, &ns, &q);
    let _second = f.claim(&worker, &ns, &q);
    let full = f.store.claim(&worker, &ns, &q).unwrap();
    assert_eq!(full.empty_reason(), Some(EmptyReason::Limited));
    assert_eq!(full.retry_after(), Some(LIMITED_RETRY_AFTER));
    let batch = f.store.claim_batch(&worker, &ns, &q, 5).unwrap();
    assert_eq!(
        (batch.claimed.len(), batch.reason),
        (0, Some(EmptyReason::Limited))
    );

    // A submit frees one slot; a batch takes just that one.
    let _ = f
        .store
        .submit(
            &worker,
            &first.task,
            first.lease.token(),
            &key("k-1"),
            &Output::bytes("ok"),
        )
        .unwrap();
    let batch = f.store.claim_batch(&worker, &ns, &q, 5).unwrap();
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(
        empty_reason(&f, &worker, &ns, &q),
        Some(EmptyReason::Limited)
    );

    // Raising the limit lets more through; removing it, all.
    f.store
        .set_queue_limits(&worker, &ns, &q, limit(Some(3), None))
        .unwrap();
    assert_eq!(empty_reason(&f, &worker, &ns, &q), None);
    assert_eq!(
        empty_reason(&f, &worker, &ns, &q),
        Some(EmptyReason::Limited)
    );
    f.store
        .set_queue_limits(&worker, &ns, &q, ConcurrencyLimit::NONE)
        .unwrap();
    assert_eq!(empty_reason(&f, &worker, &ns, &q), None);
    assert_eq!(empty_reason(&f, &worker, &ns, &q), Some(EmptyReason::Empty));
    assert!(f.store.health(&worker, &ns).unwrap().queues.is_empty());
}

fn a_lapsed_lease_frees_its_slot_once_when_the_lapse_is_recorded(db: &TestDb) {
    let f = Fixture::new(db);
    let old = f.login(&f.full_worker(Grant::AllNamespaces));
    let new = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&old, &ns, &q, 3);
    f.store
        .set_queue_limits(&old, &ns, &q, limit(Some(1), None))
        .unwrap();
    let first = f.claim(&old, &ns, &q);
    assert_eq!(empty_reason(&f, &new, &ns, &q), Some(EmptyReason::Limited));

    // The lease lapses: its heartbeat fails, and the next claim records
    // the lapse and takes the slot.
    f.clock.advance(Duration::from_secs(3600));
    let error = f
        .store
        .heartbeat(&old, &first.task, first.lease.token())
        .unwrap_err();
    assert_eq!(error.status(), 409);
    let second = f.claim(&new, &ns, &q);
    assert!(second.lease.token() > first.lease.token() || second.task != first.task);

    // The old holder's submit is refused and frees nothing.
    let late = f
        .store
        .submit(
            &old,
            &first.task,
            first.lease.token(),
            &key("late"),
            &Output::bytes("late"),
        )
        .unwrap_err();
    assert_eq!(late.status(), 409);
    assert_eq!(empty_reason(&f, &new, &ns, &q), Some(EmptyReason::Limited));
    assert_eq!(empty_reason(&f, &old, &ns, &q), Some(EmptyReason::Limited));
    assert_eq!(f.store.health(&new, &ns).unwrap().attempts.leased, 1);

    // The new holder's submit frees it.
    let _ = f
        .store
        .submit(
            &new,
            &second.task,
            second.lease.token(),
            &key("k-2"),
            &Output::bytes("ok"),
        )
        .unwrap();
    assert_eq!(empty_reason(&f, &new, &ns, &q), None);
}

/// A limited queue's claim records its own lapsed leases, however many
/// other queues of the namespace hold: 999 abandoned leases in `a` never
/// hide the one lapsed lease of `b` (limit 1), nor of `c` (one per
/// partition).
fn a_limited_queue_records_its_own_lapse_behind_many_of_other_queues(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let (a, b, c) = (queue("a"), queue("b"), queue("c"));
    let batch: Vec<(Brief, EnqueueOptions)> = (0..999)
        .map(|n| {
            (
                Brief::Json(serde_json::json!({ "n": n })),
                EnqueueOptions::default(),
            )
        })
        .collect();
    f.store.enqueue_batch(&worker, &ns, &a, &batch).unwrap();
    let mut abandoned = 0;
    while abandoned < 999 {
        abandoned += f
            .store
            .claim_batch(&worker, &ns, &a, 100)
            .unwrap()
            .claimed
            .len();
    }
    f.enqueue(&worker, &ns, &b, 2);
    let partitioned = PartitionKey::parse("p").unwrap();
    for n in 0..2 {
        f.store
            .enqueue(
                &worker,
                &ns,
                &c,
                &json_brief(n),
                &EnqueueOptions::default().with_partition_key(partitioned.clone()),
            )
            .unwrap();
    }
    f.store
        .set_queue_limits(&worker, &ns, &b, limit(Some(1), None))
        .unwrap();
    f.store
        .set_queue_limits(&worker, &ns, &c, limit(None, Some(1)))
        .unwrap();
    let first_b = f.claim(&worker, &ns, &b);
    let first_c = f.claim(&worker, &ns, &c);
    assert_eq!(
        empty_reason(&f, &worker, &ns, &b),
        Some(EmptyReason::Limited)
    );
    assert_eq!(
        empty_reason(&f, &worker, &ns, &c),
        Some(EmptyReason::Limited)
    );

    // Every lease lapses; `a`'s lapsed first, so an unordered or unfiltered
    // search of the namespace meets only them.
    f.clock.advance(Duration::from_secs(3600));
    let second_b = f.claim(&worker, &ns, &b);
    let second_c = f.claim(&worker, &ns, &c);
    for (first, second) in [(&first_b, &second_b), (&first_c, &second_c)] {
        assert!(second.task != first.task || second.lease.token() > first.lease.token());
    }
    // And the limits hold again.
    assert_eq!(
        empty_reason(&f, &worker, &ns, &b),
        Some(EmptyReason::Limited)
    );
    assert_eq!(
        empty_reason(&f, &worker, &ns, &c),
        Some(EmptyReason::Limited)
    );
}

/// Enqueues a task into `renders/jobs` with partition key `key` (none for
/// `None`).
fn enqueue_in(f: &Fixture<'_>, caller: &Caller, key: Option<&str>, n: usize) -> TaskRef {
    let mut options = EnqueueOptions::default();
    if let Some(key) = key {
        options = options.with_partition_key(PartitionKey::parse(key).unwrap());
    }
    f.store
        .enqueue(
            caller,
            &namespace("renders"),
            &queue("jobs"),
            &Brief::Json(serde_json::json!({ "n": n })),
            &options,
        )
        .unwrap()
}

fn a_partition_limit_skips_full_partitions_and_takes_the_next_task(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let a1 = enqueue_in(&f, &worker, Some("customer-a"), 1);
    let a2 = enqueue_in(&f, &worker, Some("customer-a"), 2);
    let b1 = enqueue_in(&f, &worker, Some("customer-b"), 3);
    let loose = enqueue_in(&f, &worker, None, 4);
    f.store
        .set_queue_limits(&worker, &ns, &q, limit(None, Some(1)))
        .unwrap();
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(first.task, a1);
    // a2 waits behind a1; b1 and the task without a key go on.
    assert_eq!(f.claim(&worker, &ns, &q).task, b1);
    assert_eq!(f.claim(&worker, &ns, &q).task, loose);
    let full = f.store.claim(&worker, &ns, &q).unwrap();
    assert_eq!(full.empty_reason(), Some(EmptyReason::Limited));
    assert_eq!(full.retry_after(), Some(LIMITED_RETRY_AFTER));
    let _ = f
        .store
        .submit(
            &worker,
            &first.task,
            first.lease.token(),
            &key("a-1"),
            &Output::bytes("ok"),
        )
        .unwrap();
    assert_eq!(f.claim(&worker, &ns, &q).task, a2);
    assert_eq!(empty_reason(&f, &worker, &ns, &q), Some(EmptyReason::Empty));

    // A batch takes one per partition, and the queue limit still holds.
    for n in 10..13 {
        enqueue_in(&f, &worker, Some("customer-c"), n);
        enqueue_in(&f, &worker, Some("customer-d"), n + 10);
    }
    f.store
        .set_queue_limits(&worker, &ns, &q, limit(Some(4), Some(1)))
        .unwrap();
    let batch = f.store.claim_batch(&worker, &ns, &q, 10).unwrap();
    assert_eq!(
        batch.claimed.len(),
        1,
        "three held already, the queue takes four"
    );
    let partitions: Vec<_> = batch
        .claimed
        .iter()
        .map(|claimed| {
            f.store
                .read_task(&worker, &claimed.task)
                .unwrap()
                .partition_key
        })
        .collect();
    assert_eq!(
        partitions,
        [Some(PartitionKey::parse("customer-c").unwrap())]
    );
    f.store
        .set_queue_limits(&worker, &ns, &q, limit(None, Some(1)))
        .unwrap();
    let batch = f.store.claim_batch(&worker, &ns, &q, 10).unwrap();
    assert_eq!(batch.claimed.len(), 1, "customer-d only");
    assert_eq!(batch.reason, None);
    let batch = f.store.claim_batch(&worker, &ns, &q, 10).unwrap();
    assert_eq!(
        (batch.claimed.len(), batch.reason),
        (0, Some(EmptyReason::Limited))
    );
}

/// Solid Queue's failure: a "limit 1" job ran many times at once after a
/// heartbeat failed, because the stale holder's release freed the
/// semaphore a second time.
fn a_stale_holder_cannot_free_a_partition_slot_twice(db: &TestDb) {
    let f = Fixture::new(db);
    let old = f.login(&f.full_worker(Grant::AllNamespaces));
    let new = f.login(&f.full_worker(Grant::AllNamespaces));
    let third = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let first = enqueue_in(&f, &old, Some("customer-a"), 1);
    enqueue_in(&f, &old, Some("customer-a"), 2);
    f.store
        .set_queue_limits(&old, &ns, &q, limit(None, Some(1)))
        .unwrap();
    let held = f.claim(&old, &ns, &q);
    assert_eq!(held.task, first);

    // The heartbeat fails: the lease lapsed.
    f.clock.advance(Duration::from_secs(3600));
    let error = f
        .store
        .heartbeat(&old, &held.task, held.lease.token())
        .unwrap_err();
    assert_eq!(error.status(), 409);
    // The lapse is recorded and the slot granted to another worker.
    let regranted = f.claim(&new, &ns, &q);
    assert!(regranted.lease.token() > held.lease.token() || regranted.task != held.task);

    // The old holder's submit is stale, and frees nothing.
    let late = f
        .store
        .submit(
            &old,
            &held.task,
            held.lease.token(),
            &key("late"),
            &Output::bytes("late"),
        )
        .unwrap_err();
    assert_eq!(late.status(), 409);
    let stale_fail = f
        .store
        .fail(&old, &held.task, held.lease.token(), Retry::Never)
        .unwrap_err();
    assert_eq!(stale_fail.status(), 409);
    // The new holder still holds the slot: a third claim gets nothing.
    f.store
        .heartbeat(&new, &regranted.task, regranted.lease.token())
        .unwrap();
    let nothing = f.store.claim(&third, &ns, &q).unwrap();
    assert_eq!(nothing.empty_reason(), Some(EmptyReason::Limited));
    assert_eq!(f.store.health(&third, &ns).unwrap().attempts.leased, 1);
}

/// A small seeded generator, so a failing run can be replayed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// One grant in the history: its partition, when it was granted, and when
/// it ended (its last expiry, or an accepted submit before it).
#[derive(Debug, Clone)]
struct Granted {
    partition: String,
    task: TaskRef,
    token: tessera_store::FencingToken,
    holder: usize,
    from: chrono::DateTime<chrono::Utc>,
    until: chrono::DateTime<chrono::Utc>,
}

fn with_a_per_key_limit_of_one_two_live_leases_of_a_key_never_overlap(db: &TestDb) {
    let f = Fixture::new(db);
    let workers: Vec<Caller> = (0..3)
        .map(|_| f.login(&f.full_worker(Grant::AllNamespaces)))
        .collect();
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let partitions = ["p-0", "p-1", "p-2"];
    let mut partition_of = std::collections::HashMap::new();
    for n in 0..24 {
        let partition = partitions[n % partitions.len()];
        let task = enqueue_in(&f, &workers[0], Some(partition), n);
        partition_of.insert(task, partition.to_owned());
    }
    f.store
        .set_queue_limits(&workers[0], &ns, &q, limit(None, Some(1)))
        .unwrap();
    for seed in [7_u64, 1_234, 99_991] {
        let mut rng = Lcg(seed);
        let mut history: Vec<Granted> = Vec::new();
        // Indexes into `history` of grants whose holder has not let go.
        let mut held: Vec<usize> = Vec::new();
        for step in 0..150 {
            let now = f.clock.now_utc();
            match rng.below(10) {
                0..=3 => {
                    let holder = rng.below(3) as usize;
                    if let ClaimOutcome::Granted(claimed) =
                        f.store.claim(&workers[holder], &ns, &q).unwrap()
                    {
                        history.push(Granted {
                            partition: partition_of[&claimed.task].clone(),
                            task: claimed.task.clone(),
                            token: claimed.lease.token(),
                            holder,
                            from: now,
                            until: claimed.lease.expires_at(),
                        });
                        held.push(history.len() - 1);
                    }
                }
                4..=5 if !held.is_empty() => {
                    // A heartbeat, on time or late.
                    let index = held[rng.below(held.len() as u64) as usize];
                    let grant = history[index].clone();
                    let live = now < grant.until;
                    match f
                        .store
                        .heartbeat(&workers[grant.holder], &grant.task, grant.token)
                    {
                        Ok(lease) => {
                            assert!(live, "seed {seed} step {step}: a lapsed lease heartbeat");
                            history[index].until = lease.expires_at();
                        }
                        Err(error) => {
                            assert!(
                                !live,
                                "seed {seed} step {step}: live lease refused: {error}"
                            );
                            assert_eq!(error.status(), 409);
                        }
                    }
                }
                6..=7 if !held.is_empty() => {
                    // A submit, on time or late; either way the holder lets go.
                    let at = rng.below(held.len() as u64) as usize;
                    let index = held.swap_remove(at);
                    let grant = history[index].clone();
                    let live = now < grant.until;
                    let idempotency = key(&format!("s-{seed}-{step}"));
                    match f.store.submit(
                        &workers[grant.holder],
                        &grant.task,
                        grant.token,
                        &idempotency,
                        &Output::bytes("ok"),
                    ) {
                        Ok(_) => {
                            assert!(live, "seed {seed} step {step}: a lapsed lease submitted");
                            history[index].until = now;
                        }
                        Err(error) => {
                            assert!(
                                !live,
                                "seed {seed} step {step}: live lease refused: {error}"
                            );
                            assert_eq!(error.status(), 409);
                        }
                    }
                }
                _ => f.clock.advance(Duration::from_secs(rng.below(90))),
            }
        }
        // Two live leases of one key never overlap.
        for (i, a) in history.iter().enumerate() {
            for b in &history[i + 1..] {
                if a.partition == b.partition {
                    assert!(
                        a.until <= b.from || b.until <= a.from,
                        "seed {seed}: {a:?} overlaps {b:?}"
                    );
                }
            }
        }
        assert!(history.len() > 5, "seed {seed}: the run granted leases");
        // Let everything lapse before the next seed.
        f.clock.advance(Duration::from_secs(3600));
        for n in 0..6 {
            let partition = partitions[n % partitions.len()];
            let task = enqueue_in(&f, &workers[0], Some(partition), 100 + n);
            partition_of.insert(task, partition.to_owned());
        }
    }
}

conformance! {
    a_paused_queue_takes_enqueues_refuses_claims_and_lets_live_leases_finish,
    pausing_needs_the_enqueue_scope_and_the_grant,
    a_queue_limit_caps_its_leases_and_a_submit_frees_a_slot,
    a_lapsed_lease_frees_its_slot_once_when_the_lapse_is_recorded,
    a_limited_queue_records_its_own_lapse_behind_many_of_other_queues,
    a_partition_limit_skips_full_partitions_and_takes_the_next_task,
    a_stale_holder_cannot_free_a_partition_slot_twice,
    with_a_per_key_limit_of_one_two_live_leases_of_a_key_never_overlap,
}
