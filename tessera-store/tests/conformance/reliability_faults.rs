//! Storage faults: a provider refusing every write from a warm start. (A
//! disk filling up under SQLite's page cap, and another connection holding
//! SQLite's write lock past the busy timeout, are in `tests/sqlite/`.)

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tessera_store::{
    AttemptNumber, AuditQuery, Brief, ClaimOutcome, EnqueueOptions, Error, Grant, IdempotencyKey,
    KeyFilter, KeySpec, Output, Retry, Scope, Submitted, TaskRef, WaitOutcome,
};

use crate::harness::{Fixture, TestDb, assert_quota, namespace, queue, task_id};

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
    assert_quota(&result.unwrap_err(), reset_at);
}

fn a_warm_start_refusing_every_write_answers_reads_and_changes_no_row(db: &TestDb) {
    // New Year's Eve, half an hour before the reset.
    let at = |h, m| Utc.with_ymd_and_hms(2026, 12, 31, h, m, 0).unwrap();
    let new_year = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
    let (ns, q) = (namespace("farm"), queue("frames"));
    let mut setup = Fixture::at(db, at(23, 28), |config| {
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
    let before = db.table_snapshot();
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
    assert_eq!(db.table_snapshot(), before);
    if db.meters_rows() {
        let meter = setup.store.meter();
        assert_eq!((meter.rows_written, meter.write_transactions), (0, 0));
    }
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

conformance! {
    a_warm_start_refusing_every_write_answers_reads_and_changes_no_row,
}
