//! Health snapshots: counts, lapsed leases, the 15 s cache, invalidation by
//! state changes, and public namespaces read without a key.

use std::time::Duration;

use tessera_store::limits::HEALTH_SNAPSHOT_TTL;
use tessera_store::{Brief, EnqueueOptions, Grant, Output, QueueDepth, StateCounts};

use crate::harness::{Fixture, TestDb, namespace, noon, queue};

fn health_counts_states_and_lapsed_leases_and_is_cached_until_a_change(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &q, 5);
    let claimed = f.claim(&worker, &ns, &q);

    let (first, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    assert_eq!(
        first.attempts,
        StateCounts {
            ready: 4,
            leased: 1,
            ..StateCounts::default()
        }
    );
    assert_eq!(first.expired_leases, 0);
    assert_eq!(first.taken_at, noon());
    if db.meters_rows() {
        // Two states, the lapsed count, one queue's depth in two reads,
        // and its oldest ready task's row.
        assert!(cost.rows_read > 0 && cost.rows_read <= 6, "{cost:?}");
        // Not audited: the first read wrote nothing...
        assert_eq!(cost.rows_written, 0);
    }
    // ...and counted nothing.
    assert_eq!(f.store.pending_counters(), 0);

    // Within 15 s: the same snapshot, zero rows read, nothing written.
    f.clock.advance(Duration::from_secs(10));
    let (repeat, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    assert_eq!(repeat, first);
    if db.meters_rows() {
        assert_eq!((cost.rows_read, cost.rows_written), (0, 0));
    }

    // A successful state change drops it at once.
    let submitted = f
        .store
        .submit(
            &worker,
            &claimed.task,
            claimed.lease.token(),
            &tessera_store::IdempotencyKey::parse("k").unwrap(),
            &Output::bytes("x"),
        )
        .unwrap();
    assert!(matches!(submitted, tessera_store::Submitted::Accepted(_)));
    let (after, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    assert_eq!(after.attempts.done, 1);
    assert_eq!(after.taken_at, noon() + chrono::TimeDelta::seconds(10));
    if db.meters_rows() {
        assert!(cost.rows_read > 0);
    }

    // A lease lapses: time alone changes nothing stored, so the snapshot
    // stands until it is 15 s old, then shows the lapse.
    f.claim(&worker, &ns, &q);
    f.store.health(&worker, &ns).unwrap();
    f.clock.advance(Duration::from_secs(61));
    let lapsed = f.store.health(&worker, &ns).unwrap();
    assert_eq!(lapsed.expired_leases, 1);
    assert_eq!(lapsed.attempts.leased, 1);
    f.clock
        .advance(HEALTH_SNAPSHOT_TTL - Duration::from_secs(1));
    let (cached, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    assert_eq!(cached, lapsed);
    if db.meters_rows() {
        assert_eq!(cost.rows_read, 0);
    }
}

fn health_is_not_audited_but_its_denials_are_counted(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &q, 1);
    f.store.flush_counters().unwrap();
    // Due for its last_used_at, which a health read still does not write.
    f.clock.advance(Duration::from_secs(120));
    let audit_rows = |f: &Fixture<'_>| {
        let page = f
            .store
            .audit(&f.admin, &tessera_store::AuditQuery::default())
            .unwrap();
        page.events
            .iter()
            .filter(|event| event.action == tessera_store::Action::ReadHealth)
            .count()
    };
    let (_, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    if db.meters_rows() {
        assert_eq!((cost.rows_written, cost.write_transactions), (0, 0));
    }
    assert_eq!(audit_rows(&f), 0);
    // It answers while writes are refused.
    f.store.refuse_writes(true);
    f.clock.advance(HEALTH_SNAPSHOT_TTL);
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 1);
    f.store.refuse_writes(false);
    // A denial is counted under read_health.
    let error = f.store.health(&worker, &namespace("billing")).unwrap_err();
    assert_eq!(error.status(), 403);
    let page = f
        .store
        .audit(&f.admin, &tessera_store::AuditQuery::default())
        .unwrap();
    let denied: Vec<_> = page
        .counters
        .iter()
        .filter(|c| c.key.action() == tessera_store::Action::ReadHealth)
        .collect();
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].key.outcome(), tessera_store::Outcome::Forbidden);
    assert_eq!(denied[0].count, 1);
}

fn a_public_namespace_answers_without_a_key_or_any_lookup(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_public_namespace(namespace("main")));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    f.enqueue(&worker, &namespace("main"), &queue("q"), 3);

    let (health, cost) = f
        .store
        .measure(|s| s.public_health(&namespace("main")).unwrap());
    assert_eq!(health.attempts.ready, 3);
    if db.meters_rows() {
        // Only the snapshot's own reads: one state group, the lapse count
        // and one queue's depth with its oldest ready task's row. No key,
        // principal or namespace row is looked at, nothing is written.
        assert_eq!(cost.rows_read, 4);
        assert_eq!(cost.rows_written, 0);
    }
    let (_, cost) = f
        .store
        .measure(|s| s.public_health(&namespace("main")).unwrap());
    if db.meters_rows() {
        assert_eq!(cost.rows_read, 0);
    }

    let (error, cost) = f
        .store
        .measure(|s| s.public_health(&namespace("private")).unwrap_err());
    assert_eq!(error.status(), 401);
    if db.meters_rows() {
        assert_eq!(cost.rows_read, 0);
    }
    // The keyed route still works for a non-public namespace.
    assert_eq!(
        f.store
            .health(&worker, &namespace("private"))
            .unwrap()
            .attempts
            .total(),
        0
    );
}

fn health_has_each_queues_depth_from_its_unfinished_tasks(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("renders");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let (frames, emails, reports) = (queue("frames"), queue("emails"), queue("reports"));
    f.enqueue(&worker, &ns, &frames, 3);
    f.enqueue(&worker, &ns, &emails, 2);
    // Two tasks for later in `emails`; one done in `reports`.
    for n in 0..2 {
        f.store
            .enqueue(
                &worker,
                &ns,
                &emails,
                &Brief::Json(serde_json::json!({ "later": n })),
                &EnqueueOptions::default().with_not_before(noon() + chrono::TimeDelta::hours(1)),
            )
            .unwrap();
    }
    f.enqueue(&worker, &ns, &reports, 1);
    let report = f.claim(&worker, &ns, &reports);
    let submitted = f
        .store
        .submit(
            &worker,
            &report.task,
            report.lease.token(),
            &tessera_store::IdempotencyKey::parse("k").unwrap(),
            &Output::bytes("x"),
        )
        .unwrap();
    assert!(matches!(submitted, tessera_store::Submitted::Accepted(_)));
    f.claim(&worker, &ns, &frames);
    f.claim(&worker, &ns, &emails);

    // Every ready task here became claimable when it was enqueued.
    let enqueued = Some(tessera_store::Clock::now_utc(&f.clock));
    let depth = |queue, ready, delayed, leased| QueueDepth {
        queue,
        ready,
        delayed,
        leased,
        oldest_ready_at: enqueued,
    };
    let health = f.store.health(&worker, &ns).unwrap();
    // By name; a queue with nothing unfinished is not listed.
    assert_eq!(
        health.depths,
        vec![
            depth(emails.clone(), 1, 2, 1),
            depth(frames.clone(), 2, 0, 1)
        ]
    );
    // The namespace's counts agree with the depths.
    assert_eq!(health.attempts.ready, 3);
    assert_eq!(health.attempts.scheduled, 2);
    assert_eq!(health.attempts.leased, 2);

    // Once their time has come, tasks for later are ready (the oldest
    // ready task is still the one enqueued first), and a lapsed lease
    // still counts as leased until it is taken over.
    f.clock.advance(Duration::from_secs(2 * 3600));
    let later = f.store.health(&worker, &ns).unwrap();
    assert_eq!(
        later.depths,
        vec![depth(emails, 3, 0, 1), depth(frames, 2, 0, 1)]
    );
    assert_eq!(later.expired_leases, 2);
}

conformance! {
    health_has_each_queues_depth_from_its_unfinished_tasks,
    health_counts_states_and_lapsed_leases_and_is_cached_until_a_change,
    health_is_not_audited_but_its_denials_are_counted,
    a_public_namespace_answers_without_a_key_or_any_lookup,
}
