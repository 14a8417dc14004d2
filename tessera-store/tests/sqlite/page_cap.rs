//! SQLite's page cap (`SqliteOptions::with_max_page_count`): writes past
//! it are quota refusals, at open and mid-workload, and an invalid cap is
//! refused before the file is touched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    AttemptNumber, Brief, BriefVersion, ClaimOutcome, EnqueueOptions, Error, FencingToken, Grant,
    KeyFilter, KeySpec, ManualClock, Output, Scope, Store, StoreConfig, Submitted, TaskRef,
};

use crate::harness::{Fixture, TestDb, namespace, noon, queue, task_id, task_number};
use crate::{assert_quota, key, midnight};

fn assert_invalid(error: &Error) {
    assert_eq!(
        (error.status(), error.code()),
        (400, "invalid_input"),
        "{error:?}"
    );
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>, reset_at: DateTime<Utc>) {
    assert_quota(&result.unwrap_err(), reset_at);
}

#[test]
fn sqlite_full_under_max_page_count_is_a_quota_refusal() {
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
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
    // Until a write succeeds again, the store says it refuses writes.
    assert!(store.is_refusing_writes());
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
    let clock = ManualClock::new(noon());
    let error = Store::open_sqlite(
        SqliteOptions::file(dir.path().join("t.db")).with_max_page_count(2),
        StoreConfig::default().with_clock(Arc::new(clock)),
    )
    .unwrap_err();
    assert_quota(&error, midnight());
}

#[test]
fn a_page_cap_of_zero_is_refused_when_the_store_opens() {
    // SQLite reads `max_page_count = 0` as "leave the cap as it is".
    for pages in [0, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let options = SqliteOptions::file(&path).with_max_page_count(pages);
        let result = Store::open_sqlite(options, StoreConfig::default());
        assert!(
            !path.exists(),
            "settings are checked before the file is touched"
        );
        let error = result.expect_err("an invalid page cap opens a store");
        assert_invalid(&error);
        assert!(error.to_string().contains("max page count"), "{error}");
    }
}

/// `PRAGMA page_count` through a connection of its own.
fn page_count(path: &std::path::Path) -> u64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA page_count", [], |row| row.get(0))
        .unwrap()
}

#[test]
fn a_full_disk_mid_workload_refuses_cleanly_and_work_resumes_with_more_room() {
    // Besides enqueues, the refusals fall on claims with 4 KiB outputs, and
    // on a submission whose lease stays open with 12 KiB ones.
    for output_kib in [4, 12] {
        fill_the_disk(output_kib * 1024);
    }
}

/// Runs enqueue, claim and submit with 8 KiB briefs and `output_len`-byte
/// outputs until the page cap has refused 30 writes, then checks the file,
/// reopens it without the cap and finishes the work.
fn fill_the_disk(output_len: usize) {
    let db = TestDb::sqlite();
    let mut setup = Fixture::new(&db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let worker_key = setup.key(Scope::ALL, Grant::Namespace(ns.clone()));
    let pages = page_count(&setup.path());
    // About 40 pages (160 KiB) of room: a few tasks.
    setup.reopen_with(
        SqliteOptions::file(setup.path()).with_max_page_count(pages + 40),
        setup.config(),
    );
    let worker = setup.login(&worker_key);
    let midnight = noon() + chrono::TimeDelta::hours(12);
    let reference = |n| TaskRef::new(ns.clone(), task_id(n), BriefVersion::FIRST);
    let brief = |n: usize| Brief::Bytes(vec![u8::try_from(n % 251).unwrap(); 8 * 1024]);
    let output = |n: usize| Output::bytes(vec![u8::try_from(n % 241).unwrap(); output_len]);

    let mut enqueued = Vec::new();
    let mut refused_enqueues = Vec::new();
    // Leases whose submission was refused, and acknowledged receipts.
    let mut open_leases: HashMap<usize, FencingToken> = HashMap::new();
    let mut receipts = HashMap::new();
    let mut refusals = 0;
    for n in 0..400 {
        if refusals >= 30 {
            break;
        }
        let options = EnqueueOptions::default().with_task_id(task_id(n));
        match setup.store.enqueue(&worker, &ns, &q, &brief(n), &options) {
            Ok(_) => enqueued.push(n),
            Err(error) => {
                assert_refused::<()>(Err(error), midnight);
                refused_enqueues.push(n);
                refusals += 1;
            }
        }
        let lease = match setup.store.claim(&worker, &ns, &q) {
            Ok(ClaimOutcome::Granted(lease)) => lease,
            // Nothing ready: the last enqueue was refused.
            Ok(ClaimOutcome::Empty { .. }) => continue,
            Err(error) => {
                assert_refused::<()>(Err(error), midnight);
                refusals += 1;
                continue;
            }
        };
        let task = task_number(lease.task.id.as_str());
        let token = lease.lease.token();
        let submitted = setup
            .store
            .submit(&worker, &lease.task, token, &key("out"), &output(task));
        match submitted {
            Ok(submitted) => {
                receipts.insert(task, submitted.receipt().clone());
            }
            Err(error) => {
                assert_refused::<()>(Err(error), midnight);
                open_leases.insert(task, token);
                refusals += 1;
            }
        }
        // Reads answer throughout.
        setup.store.health(&worker, &ns).unwrap();
    }
    assert!(refusals >= 30, "the page cap was never reached");
    assert!(!refused_enqueues.is_empty() && !receipts.is_empty());
    let claim_stats = setup.store.claim_stats();
    assert_eq!(claim_stats.in_flight, 0);

    // The file is sound; it opens again with a higher cap.
    let pages = page_count(&setup.path());
    setup.reopen_with(
        SqliteOptions::file(setup.path()).with_max_page_count(pages + 1000),
        setup.config(),
    );
    assert_eq!(db.integrity_check(), "ok");
    let worker = setup.login(&worker_key);
    for &n in &enqueued {
        let view = setup.store.read_task(&worker, &reference(n)).unwrap();
        assert_eq!(view.brief, brief(n), "task {n} kept its brief");
    }
    for n in &refused_enqueues {
        let error = setup.store.read_task(&worker, &reference(*n)).unwrap_err();
        assert_eq!(
            error.status(),
            404,
            "a refused enqueue left task {n} behind"
        );
    }
    for (&n, receipt) in &receipts {
        let stored = setup
            .store
            .read_receipt(&worker, &reference(n), AttemptNumber::FIRST)
            .unwrap();
        assert_eq!(&stored.receipt, receipt);
        assert_eq!(
            stored.output.as_deref(),
            Some(&vec![u8::try_from(n % 241).unwrap(); output_len][..])
        );
    }
    // Work continues: the leases whose submission was refused are still
    // live, and the ready tasks are claimed.
    for (&n, &token) in &open_leases {
        let submitted = setup
            .store
            .submit(&worker, &reference(n), token, &key("out"), &output(n))
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
    while let ClaimOutcome::Granted(lease) = setup.store.claim(&worker, &ns, &q).unwrap() {
        let n = task_number(lease.task.id.as_str());
        let token = lease.lease.token();
        let submitted = setup
            .store
            .submit(&worker, &lease.task, token, &key("out"), &output(n))
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
    let health = setup.store.health(&worker, &ns).unwrap();
    assert_eq!(health.attempts.done, enqueued.len() as u64);
    assert_eq!(health.attempts.total(), enqueued.len() as u64);
}
