//! Retention of finished work: finished tasks are purged with every row
//! of their own once their state's keep time has passed, in batches, with
//! an audit row per queue and batch; keep-forever keeps them.

use std::time::Duration;

use tessera_store::{
    AuditQuery, Brief, Caller, Claimed, EnqueueOptions, Grant, IdempotencyKey, Namespace, Output,
    QueueName, Retention, Retry, SubmitRequest, Submitted, TaskRef, UniqueKey, UniqueStates,
    Uniqueness,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

const MINUTE: Duration = Duration::from_secs(60);

/// Keeps done tasks ten minutes, discarded and failed ones two hours,
/// and cancelled ones for good.
fn short() -> Retention {
    Retention {
        done: Some(10 * MINUTE),
        discarded: Some(120 * MINUTE),
        cancelled: None,
    }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn done(f: &Fixture<'_>, caller: &Caller, claimed: &Claimed) {
    let submitted = f
        .store
        .submit(
            caller,
            &claimed.task,
            claimed.lease.token(),
            &key("done"),
            &Output::bytes("ok"),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

/// The rows a task keeps: its task row, attempts and receipts.
fn task_rows(db: &TestDb) -> (u64, u64, u64) {
    (
        db.count_rows("tasks"),
        db.count_rows("attempts"),
        db.count_receipts(),
    )
}

/// Runs retention five minutes on (the store runs it after a write, at
/// most once every five minutes).
fn retention_run(f: &Fixture<'_>) -> tessera_store::Maintenance {
    f.clock.advance(5 * MINUTE);
    let report = f.store.maintain().unwrap();
    assert!(report.retention_ran);
    report
}

/// The store's audit rows, newest first (`purge_tasks` among them).
fn purges(f: &Fixture<'_>) -> tessera_store::AuditPage {
    f.store
        .audit(
            &f.admin,
            &AuditQuery {
                limit: 100,
                ..AuditQuery::default()
            },
        )
        .unwrap()
}

fn exists(f: &Fixture<'_>, caller: &Caller, task: &TaskRef) -> bool {
    match f.store.read_task(caller, task) {
        Ok(_) => true,
        Err(error) => {
            assert_eq!(error.status(), 404, "{error}");
            false
        }
    }
}

fn finished_work_is_purged_by_state_and_age_and_cancelled_is_kept(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(short()));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let one_try = EnqueueOptions::default().with_max_tries(1);
    let enqueue = |n: usize, options: &EnqueueOptions| {
        f.store
            .enqueue(&worker, &ns, &q, &json_brief(n), options)
            .unwrap()
    };
    let (done_task, discarded, failed, cancelled, waiting) = (
        enqueue(0, &EnqueueOptions::default()),
        enqueue(1, &one_try),
        enqueue(2, &EnqueueOptions::default()),
        enqueue(3, &EnqueueOptions::default()),
        enqueue(4, &EnqueueOptions::default()),
    );
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(first.task, done_task);
    done(&f, &worker, &first);
    let second = f.claim(&worker, &ns, &q);
    f.store
        .fail(&worker, &second.task, second.lease.token(), Retry::Backoff)
        .unwrap();
    let third = f.claim(&worker, &ns, &q);
    f.store
        .fail(&worker, &third.task, third.lease.token(), Retry::Never)
        .unwrap();
    f.store.cancel_task(&worker, &cancelled).unwrap();
    let all = [&done_task, &discarded, &failed, &cancelled, &waiting];
    let before = task_rows(db);
    assert_eq!(before, (5, 5, 1));

    // Nothing is due five minutes on.
    assert_eq!(retention_run(&f).tasks_purged, 0);
    assert!(all.iter().all(|task| exists(&f, &worker, task)));

    // Ten minutes on, the done task is gone with its attempt and receipt.
    let report = retention_run(&f);
    assert_eq!(report.tasks_purged, 1);
    // Two rows: the task and its attempt, which keeps the receipt.
    assert_eq!(report.rows_deleted, 2, "{report:?}");
    assert!(!exists(&f, &worker, &done_task));
    assert_eq!(task_rows(db), (4, 4, 0));

    // Two hours on, the discarded and the failed ones.
    f.clock.advance(120 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 2);
    assert!(!exists(&f, &worker, &discarded));
    assert!(!exists(&f, &worker, &failed));
    // Each purge is audited by the store, naming the queue and the count.
    let events = purges(&f);
    let mut purges: Vec<String> = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "purge_tasks")
        .map(|event| event.resource.as_ref().unwrap().as_str().to_owned())
        .collect();
    purges.sort();
    // One row per batch and queue: the failed and the discarded task
    // are found in the searches of their own states.
    assert_eq!(purges, ["queue:jobs/n1", "queue:jobs/n1", "queue:jobs/n1"]);
    // The cancelled task is kept for good, and the waiting one is
    // unfinished.
    f.clock.advance(365 * 24 * 60 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 0);
    assert!(exists(&f, &worker, &cancelled));
    assert!(exists(&f, &worker, &waiting));
}

fn keep_forever_keeps_every_finished_task(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(Retention::FOREVER));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 2);
    let claimed = f.claim(&worker, &ns, &q);
    done(&f, &worker, &claimed);
    f.clock.advance(400 * 24 * 60 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 0);
    assert!(exists(&f, &worker, &claimed.task));
}

/// Enqueues, claims and submits `count` tasks of `q` a hundred at a time.
fn finish_many(f: &Fixture<'_>, caller: &Caller, ns: &Namespace, q: &QueueName, count: usize) {
    let mut left = count;
    while left > 0 {
        let n = left.min(100);
        let batch: Vec<(Brief, EnqueueOptions)> = (0..n)
            .map(|i| (json_brief(i), EnqueueOptions::default()))
            .collect();
        f.store.enqueue_batch(caller, ns, q, &batch).unwrap();
        let claimed = f.store.claim_batch(caller, ns, q, n).unwrap().claimed;
        assert_eq!(claimed.len(), n);
        let requests: Vec<SubmitRequest> = claimed
            .iter()
            .map(|c| SubmitRequest {
                task: c.task.clone(),
                token: c.lease.token(),
                key: key("done"),
                output: Output::bytes("ok"),
            })
            .collect();
        for answer in f.store.submit_batch(caller, &requests).unwrap() {
            assert!(matches!(answer, Ok(Submitted::Accepted(_))));
        }
        left -= n;
    }
}

fn a_purge_runs_in_batches_of_500_each_audited_and_metered(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(short()));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    finish_many(&f, &worker, &ns, &queue("a"), 1_001);
    finish_many(&f, &worker, &ns, &queue("b"), 10);
    assert_eq!(task_rows(db), (1_011, 1_011, 1_011));
    f.clock.advance(10 * MINUTE);
    let written = f.store.rows_written_today();
    let report = retention_run(&f);
    assert_eq!(report.tasks_purged, 1_011);
    assert_eq!(task_rows(db), (0, 0, 0));
    if db.meters_rows() {
        // Deletes count as rows written, as the storage provider counts
        // them: three rows a task, and the audit rows.
        assert!(
            f.store.rows_written_today() >= written + 3 * 1_011,
            "{written} then {}",
            f.store.rows_written_today()
        );
    }
    let events = purges(&f);
    let mut counts: Vec<u64> = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "purge_tasks")
        .map(|event| {
            let resource = event.resource.as_ref().unwrap().as_str();
            resource.rsplit_once("/n").unwrap().1.parse().unwrap()
        })
        .collect();
    counts.sort_unstable();
    // No batch holds more than 500; every task is in one.
    assert!(counts.iter().all(|count| *count <= 500), "{counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), 1_011);
    assert!(counts.len() >= 3, "{counts:?}");
}

fn a_unique_key_held_for_good_is_free_again_after_its_purge(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(short()));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let mut unique = Uniqueness::new(UniqueKey::parse("report-7").unwrap());
    unique.states = UniqueStates::ANY;
    let options = EnqueueOptions::default().with_unique(unique);
    let first = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(0), &options)
        .unwrap();
    assert!(first.created);
    let claimed = f.claim(&worker, &ns, &q);
    done(&f, &worker, &claimed);
    let again = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(1), &options)
        .unwrap();
    assert_eq!((again.task, again.created), (first.task.clone(), false));
    f.clock.advance(10 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 1);
    assert_eq!(db.count_rows("unique_slots"), 0);
    let after = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(2), &options)
        .unwrap();
    assert!(after.created, "the key is free once its holder is purged");
}

fn a_queue_keeps_its_finished_work_by_its_own_keep_times(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(short()));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let (fast, kept, plain) = (queue("fast"), queue("kept"), queue("plain"));
    // Unset, a queue keeps what the store keeps.
    let read = f.store.queue_retention(&worker, &ns, &fast).unwrap();
    assert_eq!((read.retention, read.own), (short(), false));
    let one_minute = Retention {
        done: Some(MINUTE),
        ..short()
    };
    let set = f
        .store
        .set_queue_retention(&worker, &ns, &fast, Some(one_minute))
        .unwrap();
    assert_eq!((set.retention, set.own), (one_minute, true));
    f.store
        .set_queue_retention(&worker, &ns, &kept, Some(Retention::FOREVER))
        .unwrap();
    // A keep time past the bound is refused and changes nothing.
    let too_long = Retention {
        done: Some(Retention::MAX + MINUTE),
        ..short()
    };
    let refused = f
        .store
        .set_queue_retention(&worker, &ns, &plain, Some(too_long))
        .unwrap_err();
    assert_eq!(refused.status(), 400, "{refused}");
    assert!(!f.store.queue_retention(&worker, &ns, &plain).unwrap().own);
    // Each queue's done task, two minutes old.
    let mut tasks = Vec::new();
    for q in [&fast, &kept, &plain] {
        f.enqueue(&worker, &ns, q, 1);
        let claimed = f.claim(&worker, &ns, q);
        done(&f, &worker, &claimed);
        tasks.push(claimed.task);
    }
    f.clock.advance(2 * MINUTE);
    f.store.maintain().unwrap();
    // Retention last ran when the first write of the fixture did; five
    // minutes on it runs again: only the one-minute queue's task is due.
    assert_eq!(retention_run(&f).tasks_purged, 1);
    assert!(!exists(&f, &worker, &tasks[0]));
    assert!(exists(&f, &worker, &tasks[1]) && exists(&f, &worker, &tasks[2]));
    // Ten minutes on, the store's keep time takes the plain queue's;
    // the queue kept forever keeps its own.
    f.clock.advance(10 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 1);
    assert!(!exists(&f, &worker, &tasks[2]));
    assert!(exists(&f, &worker, &tasks[1]));
    // Handed back to the store's keep times, it is purged by them.
    let back = f
        .store
        .set_queue_retention(&worker, &ns, &kept, None)
        .unwrap();
    assert_eq!((back.retention, back.own), (short(), false));
    assert_eq!(retention_run(&f).tasks_purged, 1);
    assert!(!exists(&f, &worker, &tasks[1]));
    assert_eq!(db.count_rows("queue_retention"), 1);
}

fn a_windowed_slot_goes_once_its_window_has_ended(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let mut unique = Uniqueness::new(UniqueKey::parse("hourly").unwrap());
    unique.states = UniqueStates::ANY;
    unique.window = Some(10 * MINUTE);
    let options = EnqueueOptions::default().with_unique(unique);
    let first = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(0), &options)
        .unwrap();
    let claimed = f.claim(&worker, &ns, &q);
    done(&f, &worker, &claimed);
    assert_eq!(db.count_rows("unique_slots"), 1);
    // Its window ends within ten minutes; a minute after that the slot
    // goes, while the done task is kept for its day.
    f.clock.advance(7 * MINUTE);
    retention_run(&f);
    assert_eq!(db.count_rows("unique_slots"), 0, "the ended window's slot");
    assert!(exists(&f, &worker, &first.task));
    // A new window takes a new slot, which holds.
    let second = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(1), &options)
        .unwrap();
    assert!(second.created);
    let third = f
        .store
        .enqueue_one(&worker, &ns, &q, &json_brief(2), &options)
        .unwrap();
    assert_eq!((third.task, third.created), (second.task, false));
}

fn a_replay_after_the_purge_is_410_task_purged_and_runs_nothing(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_retention(short()));
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 1);
    let claimed = f.claim(&worker, &ns, &q);
    done(&f, &worker, &claimed);
    let replay = || {
        f.store.submit(
            &worker,
            &claimed.task,
            claimed.lease.token(),
            &key("done"),
            &Output::bytes("ok"),
        )
    };
    // Within the keep time, the receipt answers again.
    assert!(matches!(replay().unwrap(), Submitted::Replayed(_)));
    f.clock.advance(10 * MINUTE);
    assert_eq!(retention_run(&f).tasks_purged, 1);
    let written = db.count_receipts() + db.count_rows("tasks");
    for error in [
        replay().unwrap_err(),
        f.store
            .heartbeat(&worker, &claimed.task, claimed.lease.token())
            .unwrap_err(),
        f.store
            .fail(
                &worker,
                &claimed.task,
                claimed.lease.token(),
                Retry::Backoff,
            )
            .unwrap_err(),
        f.store
            .snooze(&worker, &claimed.task, claimed.lease.token(), MINUTE)
            .unwrap_err(),
    ] {
        assert_eq!(
            (error.status(), error.code()),
            (410, "task_purged"),
            "{error}"
        );
    }
    assert_eq!(db.count_receipts() + db.count_rows("tasks"), written);
}

conformance! {
    a_replay_after_the_purge_is_410_task_purged_and_runs_nothing,
    a_windowed_slot_goes_once_its_window_has_ended,
    a_queue_keeps_its_finished_work_by_its_own_keep_times,
    finished_work_is_purged_by_state_and_age_and_cancelled_is_kept,
    keep_forever_keeps_every_finished_task,
    a_purge_runs_in_batches_of_500_each_audited_and_metered,
    a_unique_key_held_for_good_is_free_again_after_its_purge,
}
