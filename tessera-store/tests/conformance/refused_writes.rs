//! With every write refused, as a provider whose daily allowance is spent:
//! health and reads answer; every write is `503 storage_quota_exhausted`
//! resetting at the next 00:00 UTC, and nothing is half-written.

use std::net::IpAddr;
use std::time::Duration;

use tessera_store::{
    AttemptNumber, ClaimOutcome, EnqueueOptions, Error, Grant, IdempotencyKey, Output, Retry,
    WaitOutcome,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

fn assert_refused(error: Error) {
    assert_eq!(
        (error.status(), error.code()),
        (503, "storage_quota_exhausted")
    );
    assert_eq!(
        error.reset_at(),
        Some("2026-10-30T00:00:00Z".parse().unwrap())
    );
    // Refused at 12:00:20.
    assert_eq!(error.retry_after_seconds(), Some(12 * 3600 - 20));
}

fn reads_answer_and_writes_are_503_until_midnight(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_public_namespace(namespace("renders"))
    });
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let tasks = f.enqueue(&worker, &ns, &q, 3);
    let leased = f.claim(&worker, &ns, &q);
    let done = f.claim(&worker, &ns, &q);
    let submitted = f
        .store
        .submit(
            &worker,
            &done.task,
            done.lease.token(),
            &IdempotencyKey::parse("k").unwrap(),
            &Output::bytes("out"),
        )
        .unwrap();
    let before = f.store.health(&worker, &ns).unwrap();

    f.store.refuse_writes(true);
    let written = f.store.meter().rows_written;
    let snapshot = db.table_snapshot();

    // Reads, health and an empty claim answer.
    assert_eq!(f.store.health(&worker, &ns).unwrap(), before);
    assert_eq!(f.store.public_health(&ns).unwrap(), before);
    f.clock.advance(Duration::from_secs(20));
    assert_eq!(
        f.store.health(&worker, &ns).unwrap().attempts,
        before.attempts,
        "a refresh reads while writes are refused"
    );
    let view = f.store.read_task(&worker, &tasks[2]).unwrap();
    assert_eq!(view.brief, json_brief(2));
    let receipt = f
        .store
        .read_receipt(&worker, &done.task, AttemptNumber::FIRST)
        .unwrap();
    assert_eq!(&receipt.receipt, submitted.receipt());
    assert_eq!(f.store.alternatives(&worker, &done.task).unwrap().len(), 1);
    assert!(matches!(
        f.store.claim(&worker, &ns, &queue("empty")).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    assert_eq!(
        f.store
            .wait_for_work(&worker, &ns, &q, Duration::from_secs(1))
            .unwrap(),
        WaitOutcome::WorkAvailable
    );
    // A replayed submission is a read too.
    let replay = f
        .store
        .submit(
            &worker,
            &done.task,
            done.lease.token(),
            &IdempotencyKey::parse("k").unwrap(),
            &Output::bytes("out"),
        )
        .unwrap();
    assert_eq!(replay.receipt(), submitted.receipt());

    // Every write is refused, whole.
    assert_refused(
        f.store
            .enqueue(&worker, &ns, &q, &json_brief(9), &EnqueueOptions::default())
            .unwrap_err(),
    );
    assert_refused(f.store.claim(&worker, &ns, &q).unwrap_err());
    assert_refused(
        f.store
            .heartbeat(&worker, &leased.task, leased.lease.token())
            .unwrap_err(),
    );
    assert_refused(
        f.store
            .submit(
                &worker,
                &leased.task,
                leased.lease.token(),
                &IdempotencyKey::parse("k2").unwrap(),
                &Output::bytes("x"),
            )
            .unwrap_err(),
    );
    assert_refused(
        f.store
            .fail(&worker, &leased.task, leased.lease.token(), Retry::Never)
            .unwrap_err(),
    );
    assert_refused(
        f.store
            .mint_session("192.0.2.1".parse::<IpAddr>().unwrap())
            .unwrap_err(),
    );
    if db.meters_rows() {
        assert_eq!(
            f.store.meter().rows_written,
            written,
            "nothing half-written"
        );
    }
    assert_eq!(db.table_snapshot(), snapshot, "nothing half-written");
    assert_eq!(f.store.claim_stats().in_flight, 0);

    // The allowance is back: the refused work can be done, nothing lost.
    f.store.refuse_writes(false);
    let third = f.claim(&worker, &ns, &q);
    assert_eq!(third.task, tasks[2]);
    let view = f.store.read_task(&worker, &leased.task).unwrap();
    assert_eq!(
        view.record.attempts[0].state,
        tessera_store::TaskState::Leased
    );
}

conformance! {
    reads_answer_and_writes_are_503_until_midnight,
}
