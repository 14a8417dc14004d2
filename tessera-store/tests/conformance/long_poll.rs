//! The long-poll: woken by an enqueue, ended by its timeout, audited once.

use std::time::Duration;

use tessera_store::{AuditQuery, Grant, WaitOutcome};

use crate::harness::{Fixture, TestDb, namespace, queue};

fn wait_events(f: &Fixture<'_>, caller: &tessera_store::Caller) -> usize {
    f.store
        .audit(caller, &AuditQuery::default())
        .unwrap()
        .events
        .iter()
        .filter(|e| e.action.as_str() == "wait_for_work")
        .count()
}

fn an_enqueue_wakes_the_long_poll_and_it_is_audited_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    std::thread::scope(|scope| {
        let polling = scope.spawn(|| {
            f.store
                .wait_for_work(&worker, &ns, &q, Duration::from_secs(30))
        });
        // Another queue's enqueue does not end it.
        f.enqueue(&worker, &ns, &queue("other"), 1);
        f.enqueue(&worker, &ns, &q, 1);
        assert_eq!(polling.join().unwrap().unwrap(), WaitOutcome::WorkAvailable);
    });
    assert_eq!(wait_events(&f, &worker), 1);
    assert!(f.claim(&worker, &ns, &q).lease.token().as_i64() == 1);
}

fn the_long_poll_times_out_on_the_store_clock(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    // A first poll carries the worker's last_used_at; the measured one is
    // within its interval.
    let first = f.store.wait_for_work(&worker, &ns, &q, Duration::ZERO);
    assert_eq!(first.unwrap(), WaitOutcome::TimedOut);
    std::thread::scope(|scope| {
        let polling = scope.spawn(|| {
            f.store
                .measure(|s| s.wait_for_work(&worker, &ns, &q, Duration::from_secs(20)))
        });
        // Its deadline is fixed once it is registered.
        while f.store.long_polls_waiting() == 0 {
            std::thread::yield_now();
        }
        f.clock.advance(Duration::from_secs(21));
        let (outcome, cost) = polling.join().unwrap();
        assert_eq!(outcome.unwrap(), WaitOutcome::TimedOut);
        if db.meters_rows() {
            // However long it waited: its audit row and nothing else.
            assert_eq!(cost.rows_written, 2);
            assert_eq!(cost.write_transactions, 1);
        }
    });
    assert_eq!(wait_events(&f, &worker), 2);
}

fn work_already_waiting_answers_at_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.enqueue(&worker, &ns, &q, 1);
    let outcome = f
        .store
        .wait_for_work(&worker, &ns, &q, Duration::from_secs(30))
        .unwrap();
    assert_eq!(outcome, WaitOutcome::WorkAvailable);
    let outsider = f.login(&f.full_worker(Grant::Namespace(namespace("other"))));
    let error = f
        .store
        .wait_for_work(&outsider, &ns, &q, Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(error.status(), 403);
}

conformance! {
    an_enqueue_wakes_the_long_poll_and_it_is_audited_once,
    the_long_poll_times_out_on_the_store_clock,
    work_already_waiting_answers_at_once,
}
