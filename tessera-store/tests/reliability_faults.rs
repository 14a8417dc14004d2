//! Storage faults: a provider refusing every write from a warm start, a
//! disk that fills up mid-workload, and another connection holding the
//! write lock past the busy timeout.

mod reliability_support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use reliability_support::{
    Setup, integrity_check, namespace, noon, queue, table_snapshot, task_id,
};
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    AttemptNumber, AuditQuery, Brief, BriefVersion, ClaimOutcome, EnqueueOptions, Error,
    FencingToken, Grant, IdempotencyKey, KeyFilter, KeySpec, Output, Retry, Scope, Submitted,
    TaskRef, TaskState, WaitOutcome,
};
use tessera_store::{StorageError, StorageErrorKind};

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn claimed(outcome: ClaimOutcome) -> tessera_store::Claimed {
    match outcome {
        ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>, reset_at: DateTime<Utc>) {
    let error = result.unwrap_err();
    assert_eq!(
        (error.status(), error.code()),
        (503, "storage_quota_exhausted"),
        "{error:?}"
    );
    assert_eq!(error.reset_at(), Some(reset_at));
    let body = serde_json::to_value(error.body()).unwrap();
    assert_eq!(
        body["error"]["reset_at"],
        serde_json::to_value(reset_at).unwrap()
    );
}

#[test]
fn a_warm_start_refusing_every_write_answers_reads_and_changes_no_row() {
    // New Year's Eve, half an hour before the reset.
    let at = |h, m| Utc.with_ymd_and_hms(2026, 12, 31, h, m, 0).unwrap();
    let new_year = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
    let (ns, q) = (namespace("farm"), queue("frames"));
    let mut setup = Setup::at(at(23, 28), |config| {
        config.with_public_namespace(namespace("farm"))
    });
    let worker_key = setup.key(Scope::ALL, Grant::Namespace(ns.clone()));
    let spare_key = setup.key(&[Scope::Read], Grant::Namespace(ns.clone()));
    let worker = setup.login(&worker_key);
    let tasks: Vec<TaskRef> = (0..5)
        .map(|n| {
            setup
                .store
                .enqueue(
                    &worker,
                    &ns,
                    &q,
                    &Brief::Bytes(vec![n; 64]),
                    &EnqueueOptions::default().with_task_id(task_id(usize::from(n))),
                )
                .unwrap()
        })
        .collect();
    // Task 0's lease lapses at 23:29; task 1's lives past the restart; task 2
    // is done; task 3 waits out a backoff; task 4 is ready.
    claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    setup
        .clock
        .set_utc(at(23, 29) + chrono::TimeDelta::seconds(30));
    let live = claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    let done = claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    let output = Output::bytes("frame 2");
    let receipt = setup
        .store
        .submit(&worker, &done.task, done.lease.token(), &key("k"), &output)
        .unwrap();
    let backoff = claimed(setup.store.claim(&worker, &ns, &q).unwrap());
    setup
        .store
        .fail(
            &worker,
            &backoff.task,
            backoff.lease.token(),
            Retry::After(Duration::from_secs(3600)),
        )
        .unwrap();
    let address: IpAddr = "192.0.2.7".parse().unwrap();
    let hash = setup.store.hash_address(address).unwrap();
    assert!(setup.store.authenticate(Some("tsk_unknown")).is_err());
    setup.store.flush_counters().unwrap();
    let health = setup.store.health(&worker, &ns).unwrap();

    // The provider's allowance is spent; the store restarts.
    setup.clock.set_utc(at(23, 30));
    setup.reopen(
        setup
            .config()
            .with_public_namespace(ns.clone())
            .with_refuse_writes(true),
    );
    let before = table_snapshot(&setup.path());
    let counted = setup.store.pending_counters();

    // Authentication, every read and the no-op paths answer.
    let worker = setup
        .store
        .authenticate(Some(worker_key.secret.expose()))
        .unwrap();
    setup.store.recheck(&worker).unwrap();
    assert_eq!(
        setup.store.public_health(&ns).unwrap().attempts,
        health.attempts
    );
    assert_eq!(
        setup.store.health(&worker, &ns).unwrap().attempts,
        health.attempts
    );
    let view = setup.store.read_task(&worker, &tasks[4]).unwrap();
    assert_eq!(view.brief, Brief::Bytes(vec![4; 64]));
    let stored = setup
        .store
        .read_receipt(&worker, &done.task, AttemptNumber::FIRST)
        .unwrap();
    assert_eq!(&stored.receipt, receipt.receipt());
    assert_eq!(
        setup.store.alternatives(&worker, &done.task).unwrap().len(),
        1
    );
    assert_eq!(
        setup
            .store
            .list_keys(&worker, &KeyFilter::default())
            .unwrap()
            .len(),
        1
    );
    let page = setup
        .store
        .audit(&setup.admin, &AuditQuery::default())
        .unwrap();
    assert!(page.events.iter().any(|e| e.action.as_str() == "submit"));
    assert!(
        page.counters
            .iter()
            .any(|c| c.key.outcome().as_str() == "unauthorized")
    );
    let own = setup.store.audit(&worker, &AuditQuery::default()).unwrap();
    assert!(own.events.iter().any(|e| e.action.as_str() == "enqueue"));
    assert_eq!(
        setup
            .store
            .wait_for_work(&worker, &ns, &q, Duration::ZERO)
            .unwrap(),
        WaitOutcome::WorkAvailable
    );
    assert!(matches!(
        setup.store.claim(&worker, &ns, &queue("idle")).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    let replay = setup
        .store
        .submit(&worker, &done.task, done.lease.token(), &key("k"), &output)
        .unwrap();
    assert_eq!(replay, Submitted::Replayed(receipt.receipt().clone()));
    // The address secret kept before the restart is read, not written.
    assert_eq!(setup.store.hash_address(address).unwrap(), hash);

    // Every write is refused with the next UTC midnight.
    let admin = setup.admin.clone();
    let store = &setup.store;
    let brief = Brief::Bytes(vec![9; 64]);
    let options = EnqueueOptions::default().with_task_id(task_id(99));
    assert_refused(store.enqueue(&worker, &ns, &q, &brief, &options), new_year);
    assert_refused(store.claim(&worker, &ns, &q), new_year);
    assert_refused(
        store.heartbeat(&worker, &live.task, live.lease.token()),
        new_year,
    );
    let fresh = Output::bytes("frame 1");
    assert_refused(
        store.submit(&worker, &live.task, live.lease.token(), &key("k1"), &fresh),
        new_year,
    );
    assert_refused(
        store.fail(&worker, &live.task, live.lease.token(), Retry::Never),
        new_year,
    );
    assert_refused(store.expire_leases(&ns, 10), new_year);
    assert_refused(store.create_key(&admin, &KeySpec::keyed("acme")), new_year);
    assert_refused(store.create_admin_key("operators"), new_year);
    assert_refused(store.revoke_key(&admin, &spare_key.info.key_id), new_year);
    assert_refused(
        store.expire_key(&admin, &spare_key.info.key_id, at(23, 45)),
        new_year,
    );
    assert_refused(store.mint_session(address), new_year);
    assert!(
        store.pending_counters() > counted,
        "refusals and lost audit rows are counted"
    );
    assert_refused(store.flush_counters(), new_year);
    assert_refused(store.maintain(), new_year);

    // Not one row changed, and the store wrote nothing.
    assert_eq!(table_snapshot(&setup.path()), before);
    let meter = setup.store.meter();
    assert_eq!((meter.rows_written, meter.write_transactions), (0, 0));
    assert_eq!(setup.store.claim_stats().in_flight, 0);

    // Writes accepted again: the refused work goes through, nothing lost.
    setup.store.refuse_writes(false);
    setup
        .store
        .heartbeat(&worker, &live.task, live.lease.token())
        .unwrap();
    let submitted = setup
        .store
        .submit(&worker, &live.task, live.lease.token(), &key("k1"), &fresh)
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    setup
        .store
        .enqueue(&worker, &ns, &q, &brief, &options)
        .unwrap();
    setup
        .store
        .revoke_key(&admin, &spare_key.info.key_id)
        .unwrap();
    assert!(setup.store.flush_counters().unwrap() > 0);
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
    let mut setup = Setup::new();
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
        let task = reliability_support::task_number(lease.task.id.as_str());
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
    assert_eq!(integrity_check(&setup.path()), "ok");
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
        let n = reliability_support::task_number(lease.task.id.as_str());
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
    let mut setup = Setup::new();
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
    let before = table_snapshot(&setup.path());

    // Another process's connection takes the write lock and keeps it.
    let blocker = rusqlite::Connection::open(setup.path()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (store, admin) = (&setup.store, &setup.admin);
    without_hanging("the writes", || {
        let options = EnqueueOptions::default().with_task_id(task_id(7));
        assert_busy(store.enqueue(&worker, &ns, &q, &Brief::Bytes(vec![1]), &options));
        assert_busy(store.claim(&worker, &ns, &q));
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
        // Authentication (its observation write fails quietly), an empty
        // queue and public health answer from the read connections.
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
    assert_eq!(table_snapshot(&setup.path()), before);
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
