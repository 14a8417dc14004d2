//! Pausing and resuming a queue, and its concurrency limits, through the
//! public API.

use std::num::NonZeroU32;
use std::time::Duration;

use tessera_store::limits::LIMITED_RETRY_AFTER;
use tessera_store::{
    AuditQuery, Caller, Clock, ConcurrencyLimit, EmptyReason, Grant, IdempotencyKey, Namespace,
    Output, QueueName, Scope, Submitted,
};

use crate::harness::{Fixture, TestDb, namespace, queue};

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

conformance! {
    a_paused_queue_takes_enqueues_refuses_claims_and_lets_live_leases_finish,
    pausing_needs_the_enqueue_scope_and_the_grant,
    a_queue_limit_caps_its_leases_and_a_submit_frees_a_slot,
    a_lapsed_lease_frees_its_slot_once_when_the_lapse_is_recorded,
}
