//! Counter flushes that happen whatever else happens, and a maintenance
//! time a host can set a timer on. On the embedded SQLite store.
#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_store::{
    AuditQuery, Grant, KeySpec, ManualClock, Namespace, Outcome, QueueName, Scope, Store,
    StoreConfig,
};

fn noon() -> DateTime<Utc> {
    "2026-10-29T12:00:10Z".parse().unwrap()
}

fn store(clock: &ManualClock) -> Store {
    Store::open_in_memory(StoreConfig::default().with_clock(Arc::new(clock.clone()))).unwrap()
}

#[test]
fn a_stream_of_denials_that_writes_nothing_still_flushes_at_1024_counters() {
    let clock = ManualClock::new(noon());
    let store = store(&clock);
    let admin_key = store.create_admin_key("ops").unwrap();
    let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    let key = store
        .create_key(
            &admin,
            &KeySpec::keyed("acme")
                .with_scopes([Scope::Claim])
                .with_grant(Grant::Namespace(Namespace::parse("mine").unwrap())),
        )
        .unwrap();
    let worker = store.authenticate(Some(key.secret.expose())).unwrap();
    let queue = QueueName::parse("jobs").unwrap();
    let mut most_waiting = 0;
    for n in 0..3_000 {
        // Each a distinct counter: another namespace, all in one minute.
        let namespace = Namespace::parse(&format!("other-{n}")).unwrap();
        let denied = store.claim(&worker, &namespace, &queue).unwrap_err();
        assert_eq!(denied.status(), 403);
        most_waiting = most_waiting.max(store.pending_counters());
    }
    assert!(most_waiting <= 1_024, "{most_waiting} counters waited");
    assert!(store.pending_counters() < 3_000, "nothing was flushed");
    // Every denial is counted once, written or still waiting.
    store.flush_counters().unwrap();
    let page = store
        .audit(
            &admin,
            &AuditQuery {
                principal: Some(worker.principal()),
                limit: 1_000,
                ..AuditQuery::default()
            },
        )
        .unwrap();
    assert_eq!(
        page.counters.len(),
        1_000,
        "the read is capped, the rows are there"
    );
    assert!(
        page.counters
            .iter()
            .all(|counter| counter.key.outcome() == Outcome::Forbidden && counter.count == 1)
    );
}

#[test]
fn next_maintenance_is_never_in_the_past() {
    let clock = ManualClock::new(noon());
    let store = store(&clock);
    // Retention has never run: due now, answered as now.
    assert_eq!(store.next_maintenance(), Some(noon()));
    assert!(store.maintain().unwrap().retention_ran);
    let retention = noon() + TimeDelta::minutes(5);
    assert_eq!(store.next_maintenance(), Some(retention));
    // A counter waits for the end of its minute.
    assert!(store.authenticate(Some("tsk_not_a_key")).is_err());
    let minute_end: DateTime<Utc> = "2026-10-29T12:01:00Z".parse().unwrap();
    assert_eq!(store.next_maintenance(), Some(minute_end));
    // Past it, the answer is now, not the minute's end.
    clock.advance(Duration::from_secs(90));
    assert_eq!(
        store.next_maintenance(),
        Some(noon() + TimeDelta::seconds(90))
    );
    store.maintain().unwrap();
    assert_eq!(store.pending_counters(), 0);
    assert_eq!(store.next_maintenance(), Some(retention));
}
