//! Storage quota refusals: SQLITE_FULL, the daily allowance, a host
//! classifier, and a provider refusing every write.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use common::{Fixture, namespace};
use tessera_store::StorageError;
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    Action, AuditQuery, Error, Grant, KeyFilter, KeySpec, ManualClock, Scope, Store, StoreConfig,
};

fn assert_quota(error: &Error, reset_at: chrono::DateTime<Utc>) {
    assert!(error.is_quota_exhausted(), "{error:?}");
    assert_eq!(error.status(), 503);
    assert_eq!(error.code(), "storage_quota_exhausted");
    assert_eq!(error.reset_at(), Some(reset_at));
    let body = serde_json::to_value(error.body()).unwrap();
    assert_eq!(
        body["error"]["reset_at"],
        serde_json::to_value(reset_at).unwrap()
    );
}

fn midnight() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap()
}

#[test]
fn sqlite_full_under_max_page_count_is_a_quota_refusal() {
    let f = Fixture::new();
    let path = f.path();
    let admin_key = f.admin_key.secret.expose().to_owned();
    let clock = f.clock.clone();
    drop(f.store);

    // Capped at its current size: any write that needs a new page fails.
    let store = Store::open_sqlite(
        SqliteOptions::file(&path).with_max_page_count(1),
        StoreConfig::default().with_clock(Arc::new(clock.clone())),
    )
    .unwrap();
    let admin = store.authenticate(Some(&admin_key)).unwrap();
    let count_keys = || {
        store
            .list_keys(&admin, &KeyFilter::default())
            .unwrap()
            .len()
    };
    let mut refusal = None;
    for _ in 0..1000 {
        let keys = count_keys();
        let spec = KeySpec::keyed(&"a".repeat(100)).with_label(&"l".repeat(100));
        if let Err(error) = store.create_key(&admin, &spec) {
            refusal = Some((error, keys));
            break;
        }
    }
    let (error, keys) = refusal.expect("the page cap is reached");
    assert_quota(&error, midnight());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(12 * 3600)));
    // The refused key (principal, key, audit row) left no row behind, and
    // reads still answer.
    assert_eq!(count_keys(), keys);
    assert!(store.authenticate(Some(&admin_key)).is_ok());
}

#[test]
fn a_new_file_too_big_for_its_cap_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::noon());
    let error = Store::open_sqlite(
        SqliteOptions::file(dir.path().join("t.db")).with_max_page_count(2),
        StoreConfig::default().with_clock(Arc::new(clock)),
    )
    .unwrap_err();
    assert_quota(&error, midnight());
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

    clock.advance(Duration::from_secs(3600));
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
    let f = Fixture::new();
    drop(f.store);
    let store = Store::open(
        f.dir.path().join("tessera.db"),
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
fn a_host_classifier_turns_its_errors_into_quota_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let clock = ManualClock::new(common::noon());
    drop(Store::open(&path, StoreConfig::default()).unwrap());

    // Another connection holds the write lock; with no busy wait the store's
    // write fails with SQLITE_BUSY.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let plain = Store::open_sqlite(
        SqliteOptions::file(&path).with_busy_timeout(Duration::ZERO),
        StoreConfig::default().with_clock(Arc::new(clock.clone())),
    )
    .unwrap();
    let error = plain.create_admin_key("ops").unwrap_err();
    assert_eq!((error.status(), error.code()), (500, "storage_error"));

    let classified = Store::open_sqlite(
        SqliteOptions::file(&path)
            .with_busy_timeout(Duration::ZERO)
            .with_quota_classifier(Arc::new(|error: &StorageError| {
                error.code() == Some("SQLITE_BUSY")
            })),
        StoreConfig::default().with_clock(Arc::new(clock)),
    )
    .unwrap();
    let error = classified.create_admin_key("ops").unwrap_err();
    assert_quota(&error, midnight());
    blocker.execute_batch("ROLLBACK").unwrap();
    assert!(classified.create_admin_key("ops").is_ok());
}

#[test]
fn a_host_classifier_is_applied_while_opening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker
        .execute_batch("CREATE TABLE host_things (id INTEGER PRIMARY KEY); BEGIN IMMEDIATE")
        .unwrap();
    let error = Store::open_sqlite(
        SqliteOptions::file(&path)
            .with_busy_timeout(Duration::ZERO)
            .with_quota_classifier(Arc::new(|error: &StorageError| {
                error.code() == Some("SQLITE_BUSY")
            })),
        StoreConfig::default().with_clock(Arc::new(ManualClock::new(common::noon()))),
    )
    .unwrap_err();
    assert_quota(&error, midnight());
}

#[test]
fn reads_answer_while_every_write_is_refused() {
    let f = Fixture::new();
    let key = f.worker(Grant::Namespace(namespace("renders")));
    let worker = f.login(&key);
    f.store.refuse_writes(true);
    assert!(f.store.is_refusing_writes());
    let before = f.store.meter();

    // Authentication, authorization, listing and audit reads answer.
    let again = f.store.authenticate(Some(key.secret.expose())).unwrap();
    assert_eq!(again.principal(), worker.principal());
    f.store
        .authorize(&again, &namespace("renders"), Scope::Read, Action::ReadTask)
        .unwrap();
    assert_eq!(
        f.store
            .list_keys(&worker, &KeyFilter::default())
            .unwrap()
            .len(),
        1
    );
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert!(!page.events.is_empty());

    // Writes are refused with the next UTC midnight, and leave nothing.
    let error = f
        .store
        .create_key(&f.admin, &KeySpec::keyed("acme"))
        .unwrap_err();
    assert_quota(&error, midnight());
    let error = f.store.revoke_key(&f.admin, worker.key_id()).unwrap_err();
    assert_quota(&error, midnight());
    assert!(f.store.authenticate(Some(key.secret.expose())).is_ok());

    let cost = f.store.meter().since(&before);
    assert_eq!(cost.rows_written, 0);
    assert!(cost.refused_writes >= 2);

    // Nothing was reset or deleted to get around it: once the provider
    // accepts writes again, everything is as it was.
    f.store.refuse_writes(false);
    assert_eq!(
        f.store
            .list_keys(&f.admin, &KeyFilter::default())
            .unwrap()
            .len(),
        2
    );
    f.store.revoke_key(&f.admin, worker.key_id()).unwrap();
}

#[test]
fn strict_read_audit_fails_reads_whose_audit_row_is_refused() {
    let f = Fixture::with(|config| config.with_strict_read_audit(true));
    f.store.refuse_writes(true);
    let error = f
        .store
        .list_keys(&f.admin, &KeyFilter::default())
        .unwrap_err();
    assert!(error.is_quota_exhausted());
}
