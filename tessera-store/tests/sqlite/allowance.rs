//! The daily rows-written allowance: kept from the row meter, which SQLite
//! has, it refuses writes until the next 00:00 UTC.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, TimeZone, Utc};
use tessera_store::{
    ClaimOutcome, Grant, IssuedKey, KeyFilter, ManualClock, Namespace, QueueName, Store,
    StoreConfig,
};

use crate::assert_quota;
use crate::harness::{Fixture, TestDb, noon};

#[test]
fn a_due_last_used_write_past_the_daily_allowance_is_dropped_not_the_action() {
    fn setup(db: &TestDb, allowance: u64) -> (Fixture<'_>, IssuedKey) {
        let f = Fixture::with(db, |config| {
            config.with_daily_rows_written_allowance(allowance)
        });
        let key = f.worker(Grant::AllNamespaces);
        (f, key)
    }
    // The rows a fixture with one worker has written once its worker key
    // is made, measured on a store without an allowance.
    let used = {
        let db = TestDb::sqlite();
        let (f, _) = setup(&db, 0);
        f.store.rows_written_today()
    };
    // Room for exactly one more audit row (2 rows: its row and its
    // principal index entry) and not its observation.
    let db = TestDb::sqlite();
    let (f, key) = setup(&db, used + 2);
    assert_eq!(f.store.rows_written_today(), used);
    let worker = f.login(&key);
    let (listed, cost) = f
        .store
        .measure(|s| s.list_keys(&worker, &KeyFilter::default()));
    assert!(listed.is_ok(), "the action succeeds");
    assert_eq!((cost.rows_written, cost.refused_writes), (2, 0));
    assert_eq!(f.store.rows_written_today(), used + 2);
    // The next day the observation is still due and rides again.
    let midnight = tessera_store::admission::next_utc_midnight(noon());
    f.clock.set_utc(midnight);
    let (_, cost) = f
        .store
        .measure(|s| s.list_keys(&worker, &KeyFilter::default()).unwrap());
    assert_eq!(cost.rows_written, 2 + 1);
}

#[test]
fn the_daily_allowance_refuses_until_utc_midnight() {
    let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 10, 29, 23, 0, 0).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    // Measure what the schema and one admin key cost, on a scratch store.
    let (schema, admin_cost) = {
        let scratch = Store::open(dir.path().join("scratch.db"), StoreConfig::default()).unwrap();
        let schema = scratch.meter().rows_written;
        let (_, cost) = scratch.measure(|s| s.create_admin_key("ops").unwrap());
        (schema, cost.rows_written)
    };
    let store = Store::open(
        &path,
        StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_daily_rows_written_allowance(schema + admin_cost),
    )
    .unwrap();
    let key = store.create_admin_key("ops").unwrap();
    assert_eq!(store.rows_written_today(), schema + admin_cost);
    let admin = store.authenticate(Some(key.secret.expose())).unwrap();
    // The allowance is used up: the store says it refuses writes.
    assert!(store.is_refusing_writes());

    let error = store.create_admin_key("more").unwrap_err();
    let reset = Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap();
    assert_quota(&error, reset);
    assert_eq!(error.retry_after_seconds(), Some(3600));
    // Reads still answer; the refused write left nothing.
    assert_eq!(
        store
            .list_keys(&admin, &KeyFilter::default())
            .unwrap()
            .len(),
        1
    );
    // So does a claim that finds its queue empty: it writes nothing.
    let (ns, q) = (
        Namespace::parse("farm").unwrap(),
        QueueName::parse("empty").unwrap(),
    );
    assert!(matches!(
        store.claim(&admin, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));

    clock.advance(Duration::from_secs(3600));
    assert!(!store.is_refusing_writes(), "a new day, a new allowance");
    store.create_admin_key("more").unwrap();
    assert_eq!(
        store
            .list_keys(&admin, &KeyFilter::default())
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_transaction_that_would_pass_the_allowance_is_refused_whole() {
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
    let path = f.path();
    drop(f.store);
    let store = Store::open(
        path,
        StoreConfig::default()
            .with_clock(Arc::new(f.clock.clone()))
            // Room for part of a key creation, not all of it.
            .with_daily_rows_written_allowance(3),
    )
    .unwrap();
    assert_eq!(store.meter().rows_written, 0);
    let error = store.create_admin_key("ops").unwrap_err();
    assert!(error.is_quota_exhausted());
    assert_eq!(store.rows_written_today(), 0);
    assert_eq!(store.meter().refused_writes, 1);
}

#[test]
fn the_wall_clock_stepping_back_does_not_restart_the_daily_allowance() {
    let just_after_midnight = noon() + TimeDelta::hours(12) + TimeDelta::seconds(30);
    let db = TestDb::sqlite();
    let setup = Fixture::at(&db, just_after_midnight, |config| {
        config.with_daily_rows_written_allowance(200)
    });
    while setup.store.create_admin_key("operators").is_ok() {}
    let spent = setup.store.rows_written_today();
    let refused = setup.store.create_admin_key("operators").unwrap_err();
    assert!(refused.is_quota_exhausted());

    // Twenty seconds back, into the previous UTC day, then forward again.
    setup
        .clock
        .set_utc(just_after_midnight - TimeDelta::seconds(40));
    let _ = setup.store.create_admin_key("operators");
    setup
        .clock
        .set_utc(just_after_midnight + TimeDelta::seconds(10));
    assert!(
        setup.store.rows_written_today() >= spent,
        "{spent} rows were written today, the allowance says {}",
        setup.store.rows_written_today()
    );
    let error = setup
        .store
        .create_admin_key("operators")
        .expect_err("the day's allowance is still spent");
    assert!(error.is_quota_exhausted());
}
