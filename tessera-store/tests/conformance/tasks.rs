//! Tasks: enqueue, lease, heartbeat, idempotent
//! submission, failure, expiry, competing attempts and the reads.

use std::time::Duration;

use tessera_store::lease::StateName;
use tessera_store::{
    AttemptNumber, AuditQuery, Brief, BriefVersion, ClaimOutcome, EnqueueOptions, Grant,
    IdempotencyKey, Output, Retry, Scope, Submitted, TaskId, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, noon, queue};

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn claims_take_the_oldest_ready_task_with_its_brief_and_a_first_token(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, jobs) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &jobs, 3);
    // Another queue's task is never handed out here.
    f.enqueue(&worker, &ns, &queue("other"), 1);

    for (n, task) in tasks.iter().enumerate() {
        let claimed = f.claim(&worker, &ns, &jobs);
        assert_eq!(&claimed.task, task);
        assert_eq!(claimed.brief, json_brief(n));
        assert_eq!(claimed.lease.token().as_i64(), 1);
        assert_eq!(
            claimed.lease.holder().as_str(),
            worker.principal().to_string()
        );
        assert_eq!(
            claimed.lease.expires_at(),
            noon() + chrono::TimeDelta::seconds(60)
        );
    }
    assert!(matches!(
        f.store.claim(&worker, &ns, &jobs).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
}

fn enqueue_checks_scope_grant_size_and_duplicates(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("renders");
    let claimer = f.login(&f.worker(Grant::Namespace(ns.clone())));
    let brief = json_brief(0);
    let options = EnqueueOptions::default();
    let error = f
        .store
        .enqueue(&claimer, &ns, &queue("q"), &brief, &options)
        .unwrap_err();
    assert_eq!(error.status(), 403, "the claim scope does not enqueue");

    let writer = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let error = f
        .store
        .enqueue(&writer, &namespace("other"), &queue("q"), &brief, &options)
        .unwrap_err();
    assert_eq!(error.status(), 403);

    let huge = Brief::Bytes(vec![7; tessera_store::limits::MAX_BRIEF_BYTES + 1]);
    let error = f
        .store
        .enqueue(&writer, &ns, &queue("q"), &huge, &options)
        .unwrap_err();
    assert_eq!((error.status(), error.code()), (400, "invalid_input"));

    let named = options.with_task_id(TaskId::parse("render-42").unwrap());
    let task = f
        .store
        .enqueue(&writer, &ns, &queue("q"), &brief, &named)
        .unwrap();
    assert_eq!(task.to_string(), "renders/render-42@1");
    let error = f
        .store
        .enqueue(&writer, &ns, &queue("q"), &brief, &named)
        .unwrap_err();
    assert_eq!(error.status(), 409);
    // A new version of the same brief is its own task.
    let v2 = named.with_version(BriefVersion::new(2).unwrap());
    let second = f
        .store
        .enqueue(&writer, &ns, &queue("q"), &brief, &v2)
        .unwrap();
    assert_eq!(second.version.as_u32(), 2);
    let error = f
        .store
        .enqueue(
            &writer,
            &ns,
            &queue("q"),
            &brief,
            &EnqueueOptions::default().with_alternatives(0),
        )
        .unwrap_err();
    assert_eq!(error.status(), 400);
}

fn heartbeats_extend_the_lease_and_keep_others_out(db: &TestDb) {
    let f = Fixture::new(db);
    let alice = f.login(&f.full_worker(Grant::AllNamespaces));
    let bob = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&alice, &ns, &q, 1);
    let claimed = f.claim(&alice, &ns, &q);
    let token = claimed.lease.token();

    f.clock.advance(Duration::from_secs(40));
    let extended = f.store.heartbeat(&alice, &claimed.task, token).unwrap();
    assert_eq!(
        extended.expires_at(),
        noon() + chrono::TimeDelta::seconds(100)
    );
    // Past the first expiry, the lease still holds: nobody else gets it.
    f.clock.advance(Duration::from_secs(40));
    assert!(matches!(
        f.store.claim(&bob, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    let error = f.store.heartbeat(&bob, &claimed.task, token).unwrap_err();
    assert_eq!(error.status(), 409, "another holder's token");
    let submitted = f
        .store
        .submit(
            &alice,
            &claimed.task,
            token,
            &key("k1"),
            &Output::bytes("ok"),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

fn a_stale_token_after_expiry_and_reclaim_is_refused(db: &TestDb) {
    let f = Fixture::new(db);
    let alice = f.login(&f.full_worker(Grant::AllNamespaces));
    let bob = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&alice, &ns, &q, 1);
    let first = f.claim(&alice, &ns, &q);

    f.clock.advance(Duration::from_secs(61));
    // The lapsed lease is found by the claim index without any sweep.
    let second = f.claim(&bob, &ns, &q);
    assert_eq!(second.task, first.task);
    assert!(second.lease.token() > first.lease.token());
    assert_ne!(second.lease.artifact(), first.lease.artifact());

    let stale = f
        .store
        .heartbeat(&alice, &first.task, first.lease.token())
        .unwrap_err();
    assert_eq!((stale.status(), stale.code()), (409, "stale_token"));
    let stale = f
        .store
        .submit(
            &alice,
            &first.task,
            first.lease.token(),
            &key("late"),
            &Output::bytes("mine"),
        )
        .unwrap_err();
    assert_eq!(stale.status(), 409);
    let stale = f
        .store
        .fail(&alice, &first.task, first.lease.token(), Retry::Never)
        .unwrap_err();
    assert_eq!(stale.status(), 409);

    let receipt = f
        .store
        .submit(
            &bob,
            &second.task,
            second.lease.token(),
            &key("b1"),
            &Output::bytes("bob's"),
        )
        .unwrap();
    assert_eq!(receipt.receipt().token, second.lease.token());
    let view = f.store.read_task(&bob, &first.task).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Done);
    assert_eq!(view.record.attempts[0].tries, 2);
}

fn a_resubmission_replays_its_receipt_and_writes_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 1);
    let claimed = f.claim(&worker, &ns, &q);
    let token = claimed.lease.token();
    let output = Output::bytes("frame-0 rendered");

    let first = f
        .store
        .submit(&worker, &claimed.task, token, &key("upload-1"), &output)
        .unwrap();
    let Submitted::Accepted(receipt) = first else {
        panic!("a fresh submission is accepted");
    };
    assert_eq!(receipt.digest, output.payload_digest());

    // The response was lost; the worker retries, even after its lease ended.
    f.clock.advance(Duration::from_secs(120));
    let snapshot = db.table_snapshot();
    let (replay, cost) = f.store.measure(|s| {
        s.submit(&worker, &claimed.task, token, &key("upload-1"), &output)
            .unwrap()
    });
    assert_eq!(replay, Submitted::Replayed(receipt.clone()));
    if db.meters_rows() {
        assert_eq!(cost.rows_written, 0);
        assert_eq!(cost.write_transactions, 0);
    }
    assert_eq!(db.table_snapshot(), snapshot);

    let conflict = f
        .store
        .submit(
            &worker,
            &claimed.task,
            token,
            &key("upload-1"),
            &Output::bytes("something else"),
        )
        .unwrap_err();
    assert_eq!(
        (conflict.status(), conflict.code()),
        (409, "idempotency_conflict")
    );

    let stored = f
        .store
        .read_receipt(&worker, &claimed.task, AttemptNumber::FIRST)
        .unwrap();
    assert_eq!(stored.receipt, receipt);
    assert_eq!(stored.output.as_deref(), Some(&b"frame-0 rendered"[..]));
}

fn times_handed_out_read_back_unchanged_on_a_sub_millisecond_clock(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    let stored_lease = || {
        let view = f.store.read_task(&worker, &task).unwrap();
        view.record.attempts[0].lease.clone().unwrap()
    };

    // Stored times keep whole milliseconds; the clock has nanoseconds.
    f.clock
        .set_utc(noon() + chrono::TimeDelta::nanoseconds(123_456_789));
    let claimed = f.claim(&worker, &ns, &q);
    let granted_at = noon() + chrono::TimeDelta::milliseconds(123);
    assert_eq!(claimed.lease.granted_at(), granted_at);
    let lease = stored_lease();
    assert_eq!(
        (lease.granted_at, lease.expires_at),
        (claimed.lease.granted_at(), claimed.lease.expires_at())
    );

    f.clock.advance(Duration::from_nanos(1_234_567_891));
    let token = claimed.lease.token();
    let beat = f.store.heartbeat(&worker, &task, token).unwrap();
    let lease = stored_lease();
    assert_eq!(
        (lease.granted_at, lease.expires_at),
        (beat.granted_at(), beat.expires_at())
    );

    f.clock.advance(Duration::from_nanos(987_654));
    let output = Output::bytes("frame-0 rendered");
    let first = f
        .store
        .submit(&worker, &task, token, &key("upload-1"), &output)
        .unwrap();
    let replay = f
        .store
        .submit(&worker, &task, token, &key("upload-1"), &output)
        .unwrap();
    assert!(matches!(replay, Submitted::Replayed(_)));
    let json = |receipt| serde_json::to_string(receipt).unwrap();
    assert_eq!(json(replay.receipt()), json(first.receipt()));
    let stored = f
        .store
        .read_receipt(&worker, &task, AttemptNumber::FIRST)
        .unwrap();
    assert_eq!(json(&stored.receipt), json(first.receipt()));
}

fn a_backoff_reads_back_as_it_was_returned(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    f.clock
        .set_utc(noon() + chrono::TimeDelta::nanoseconds(123_456_789));
    let claimed = f.claim(&worker, &ns, &q);
    let backoff = Retry::After(Duration::from_micros(30_000_500));
    let state = f
        .store
        .fail(&worker, &task, claimed.lease.token(), backoff)
        .unwrap();
    let until = noon() + chrono::TimeDelta::milliseconds(30_123);
    assert_eq!(state, TaskState::Backoff { until });
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.record.attempts[0].state, state);
}

fn competing_attempts_each_get_a_lease_an_artifact_and_a_receipt(db: &TestDb) {
    let f = Fixture::new(db);
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let workers: Vec<_> = (0..3)
        .map(|_| f.login(&f.full_worker(Grant::AllNamespaces)))
        .collect();
    let options = EnqueueOptions::default()
        .with_task_id(TaskId::parse("logo").unwrap())
        .with_alternatives(3);
    let task = f
        .store
        .enqueue(&workers[0], &ns, &q, &json_brief(0), &options)
        .unwrap();

    let claims: Vec<_> = workers.iter().map(|w| f.claim(w, &ns, &q)).collect();
    let attempts: Vec<u16> = claims.iter().map(|c| c.lease.attempt().as_u16()).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert!(claims.iter().all(|c| c.task == task));
    let mut artifacts: Vec<_> = claims.iter().map(|c| c.lease.artifact()).collect();
    artifacts.dedup();
    assert_eq!(artifacts.len(), 3);
    assert!(matches!(
        f.store.claim(&workers[0], &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));

    for (n, (worker, claimed)) in workers.iter().zip(&claims).enumerate() {
        let submitted = f
            .store
            .submit(
                worker,
                &task,
                claimed.lease.token(),
                &key("result"),
                &Output::bytes(format!("design {n}")),
            )
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
    let alternatives = f.store.alternatives(&workers[0], &task).unwrap();
    let outputs: Vec<_> = alternatives
        .iter()
        .map(|a| String::from_utf8(a.output.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(outputs, ["design 0", "design 1", "design 2"]);
    let mut digests: Vec<_> = alternatives.iter().map(|a| a.receipt.digest).collect();
    digests.dedup();
    assert_eq!(digests.len(), 3);
    let view = f.store.read_task(&workers[0], &task).unwrap();
    assert!(
        view.record
            .attempts
            .iter()
            .all(|a| a.state == TaskState::Done)
    );
}

fn a_failure_retries_after_its_backoff_or_gives_up(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    let first = f.claim(&worker, &ns, &q);
    let state = f
        .store
        .fail(
            &worker,
            &task,
            first.lease.token(),
            Retry::After(Duration::from_secs(30)),
        )
        .unwrap();
    assert_eq!(state.name(), StateName::Backoff);
    assert!(matches!(
        f.store.claim(&worker, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    f.clock.advance(Duration::from_secs(30));
    let second = f.claim(&worker, &ns, &q);
    assert_eq!(second.task, task);
    let state = f
        .store
        .fail(&worker, &task, second.lease.token(), Retry::Never)
        .unwrap();
    assert_eq!(state, TaskState::Failed);
    f.clock.advance(Duration::from_secs(3600));
    assert!(matches!(
        f.store.claim(&worker, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
}

fn expiry_returns_lapsed_leases_to_ready_through_the_index(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = f.enqueue(&worker, &ns, &q, 3);
    let claims: Vec<_> = (0..3).map(|_| f.claim(&worker, &ns, &q)).collect();
    f.clock.advance(Duration::from_secs(30));
    f.store
        .heartbeat(&worker, &claims[2].task, claims[2].lease.token())
        .unwrap();
    assert!(f.store.expire_leases(&ns, 100).unwrap().is_empty());

    f.clock.advance(Duration::from_secs(31));
    let (expired, cost) = f.store.measure(|s| s.expire_leases(&ns, 100).unwrap());
    assert_eq!(expired, tasks[..2].to_vec());
    if db.meters_rows() {
        // Two index hits, then per task its row and its attempt.
        assert_eq!(cost.rows_read, 2 + 2 * 2);
    }
    let view = f.store.read_task(&worker, &tasks[0]).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Ready);
    // Expired tasks are claimed again, oldest first, under new tokens.
    let again = f.claim(&worker, &ns, &q);
    assert_eq!(again.task, tasks[0]);
    assert_eq!(again.lease.token().as_i64(), 2);
}

fn reads_need_the_read_scope_and_name_what_they_read(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("renders");
    let q = queue("jobs");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let task = f.enqueue(&worker, &ns, &q, 1).remove(0);
    let claimed = f.claim(&worker, &ns, &q);
    let submitted = f
        .store
        .submit(
            &worker,
            &task,
            claimed.lease.token(),
            &key("k"),
            &Output::bytes("x"),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));

    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.queue, q);
    assert_eq!(view.brief, json_brief(0));
    f.store
        .read_receipt(&worker, &task, AttemptNumber::FIRST)
        .unwrap();
    let missing = TaskRef::new(
        ns.clone(),
        TaskId::parse("nope").unwrap(),
        BriefVersion::FIRST,
    );
    assert_eq!(
        f.store.read_task(&worker, &missing).unwrap_err().status(),
        404
    );

    let events = f
        .store
        .audit(&worker, &AuditQuery::default())
        .unwrap()
        .events;
    let receipt_read = events
        .iter()
        .find(|e| e.action.as_str() == "read_receipt")
        .unwrap();
    assert_eq!(
        receipt_read.resource.as_ref().unwrap().as_str(),
        format!("task:{}@1/a1/t1", task.id)
    );

    let claim_only = f.login(
        &f.store
            .create_key(
                &f.admin,
                &tessera_store::KeySpec::keyed("acme")
                    .with_scopes([Scope::Claim])
                    .with_grant(Grant::Namespace(ns.clone())),
            )
            .unwrap(),
    );
    assert_eq!(
        f.store.read_task(&claim_only, &task).unwrap_err().status(),
        403
    );
}

conformance! {
    claims_take_the_oldest_ready_task_with_its_brief_and_a_first_token,
    enqueue_checks_scope_grant_size_and_duplicates,
    heartbeats_extend_the_lease_and_keep_others_out,
    a_stale_token_after_expiry_and_reclaim_is_refused,
    a_resubmission_replays_its_receipt_and_writes_nothing,
    times_handed_out_read_back_unchanged_on_a_sub_millisecond_clock,
    a_backoff_reads_back_as_it_was_returned,
    competing_attempts_each_get_a_lease_an_artifact_and_a_receipt,
    a_failure_retries_after_its_backoff_or_gives_up,
    expiry_returns_lapsed_leases_to_ready_through_the_index,
    reads_need_the_read_scope_and_name_what_they_read,
}
