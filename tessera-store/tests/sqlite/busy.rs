//! Another connection holding SQLite's write lock: past the busy timeout a
//! write is a retryable storage error, not a hang, unless a host
//! classifier calls it a quota refusal.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    AuditQuery, Brief, ClaimOutcome, EnqueueOptions, Error, Grant, KeySpec, ManualClock, Output,
    Retry, Scope, StorageError, StorageErrorKind, Store, StoreConfig, Submitted, TaskState,
};

use crate::harness::{Fixture, TestDb, namespace, noon, queue, task_id};
use crate::{assert_quota, claimed, key, midnight};

#[test]
fn a_host_classifier_turns_its_errors_into_quota_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let clock = ManualClock::new(noon());
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
        StoreConfig::default().with_clock(Arc::new(ManualClock::new(noon()))),
    )
    .unwrap_err();
    assert_quota(&error, midnight());
}

/// Runs `work` and fails the test (ending the process, since a hung thread
/// cannot be joined) if it has not returned within a minute.
fn without_hanging<T>(what: &str, work: impl FnOnce() -> T) -> T {
    let (done, finished) = mpsc::channel::<()>();
    let what = what.to_owned();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(60)) == Err(mpsc::RecvTimeoutError::Timeout) {
            eprintln!("{what} hung behind the write lock");
            std::process::exit(1);
        }
    });
    let value = work();
    drop(done);
    watchdog.join().unwrap();
    value
}

fn assert_busy<T: std::fmt::Debug>(result: Result<T, Error>) {
    let error = result.unwrap_err();
    assert_eq!(
        (error.status(), error.code()),
        (500, "storage_error"),
        "{error:?}"
    );
    // The client sees no SQLite text; the host's log has it as the source.
    assert_eq!(error.body().error.message, "storage error");
    let source = std::error::Error::source(&error).expect("the SQLite error");
    let storage = source.downcast_ref::<StorageError>().unwrap();
    assert_eq!(storage.code(), Some("SQLITE_BUSY"));
    assert_eq!(storage.kind(), StorageErrorKind::Retryable);
    assert!(error.is_retryable());
}

#[test]
fn a_write_lock_held_past_the_busy_timeout_is_a_storage_error_not_a_hang() {
    let db = TestDb::sqlite();
    let mut setup = Fixture::new(&db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let worker_key = setup.key(Scope::ALL, Grant::Namespace(ns.clone()));
    let spare_key = setup.key(&[Scope::Read], Grant::Namespace(ns.clone()));
    let worker = setup.login(&worker_key);
    setup.enqueue_range(&worker, &ns, &q, 0, 3);
    let live = claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    let token = live.lease.token();
    setup.reopen_with(
        SqliteOptions::file(setup.path()).with_busy_timeout(Duration::from_millis(100)),
        setup.config(),
    );
    let worker = setup.login(&worker_key);
    // The worker finds this queue empty: its next claim there, with no
    // grant or enqueue since, is answered from a read connection.
    assert!(matches!(
        setup.store.claim(&worker, &ns, &queue("idle")).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    let before = db.table_snapshot();

    // Another process's connection takes the write lock and keeps it.
    let blocker = rusqlite::Connection::open(setup.path()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (store, admin) = (&setup.store, &setup.admin);
    without_hanging("the writes", || {
        let options = EnqueueOptions::default().with_task_id(task_id(7));
        assert_busy(store.enqueue(&worker, &ns, &q, &Brief::Bytes(vec![1]), &options));
        assert_busy(store.claim(&worker, &ns, &q));
        // A queue this key never found empty is searched by the lease
        // transaction itself, behind the lock.
        assert_busy(store.claim(&worker, &ns, &queue("unpolled")));
        assert_busy(store.heartbeat(&worker, &live.task, token));
        assert_busy(store.submit(&worker, &live.task, token, &key("k"), &Output::bytes("x")));
        assert_busy(store.fail(&worker, &live.task, token, Retry::Never));
        assert_busy(store.create_key(admin, &KeySpec::keyed("acme")));
        assert_busy(store.revoke_key(admin, &spare_key.info.key_id));
        // A read's audit row is a write too: waiting behind the lock, it
        // fails the same clear way.
        assert_busy(store.read_task(&worker, &live.task));
    });
    without_hanging("the reads that write nothing", || {
        // Authentication (its observation write fails quietly), a queue
        // the key found empty and public health answer from the read
        // connections.
        let again = store
            .authenticate(Some(worker_key.secret.expose()))
            .unwrap();
        assert_eq!(again.principal(), worker.principal());
        assert!(matches!(
            store.claim(&worker, &ns, &queue("idle")).unwrap(),
            ClaimOutcome::Empty { .. }
        ));
    });
    assert_eq!(
        store.claim_stats().in_flight,
        0,
        "the failed claim gave its capacity back"
    );

    // Released: nothing was half-written, and the same work succeeds.
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(db.table_snapshot(), before);
    setup.store.heartbeat(&worker, &live.task, token).unwrap();
    let submitted = setup
        .store
        .submit(&worker, &live.task, token, &key("k"), &Output::bytes("x"))
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    let next = claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    assert_eq!(next.lease.token().as_i64(), 1);
    let view = setup.store.read_task(&worker, &live.task).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Done);
    // The failures were counted, as storage errors.
    let page = setup
        .store
        .audit(&setup.admin, &AuditQuery::default())
        .unwrap();
    let storage_errors: u64 = page
        .counters
        .iter()
        .filter(|c| c.key.outcome().as_str() == "storage_error")
        .map(|c| c.count)
        .sum();
    assert!(storage_errors >= 8, "{:?}", page.counters);
}
