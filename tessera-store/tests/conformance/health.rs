//! Health snapshots: counts, lapsed leases, the 15 s cache, invalidation by
//! state changes, and public namespaces read without a key.

use std::time::Duration;

use tessera_store::limits::HEALTH_SNAPSHOT_TTL;
use tessera_store::{Grant, Output, StateCounts};

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
        assert!(cost.rows_read > 0 && cost.rows_read <= 3, "{cost:?}");
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
        // Only the snapshot's own reads: one state group and the lapse
        // count. No key, principal or namespace row is looked at, nothing
        // is written.
        assert_eq!(cost.rows_read, 2);
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

conformance! {
    health_counts_states_and_lapsed_leases_and_is_cached_until_a_change,
    health_is_not_audited_but_its_denials_are_counted,
    a_public_namespace_answers_without_a_key_or_any_lookup,
}
