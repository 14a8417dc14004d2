//! Bulk cancel and retry by filter, and heartbeat progress, through the
//! public API.

use std::time::Duration;

use tessera_store::limits::{BULK_BATCH, MAX_PROGRESS_BYTES};
use tessera_store::{
    AuditQuery, Brief, BulkFilter, Caller, Clock, EnqueueOptions, Grant, PartitionKey, Retry,
    StateName, TaskQuery, TaskRef, TaskState,
};

use crate::harness::TestDb;
use crate::harness::{Fixture, json_brief, namespace, queue, task_id};

/// Enqueues tasks `from..to` into `renders/<q>` with `options`, in one
/// batch.
fn enqueue(
    f: &Fixture<'_>,
    caller: &Caller,
    q: &str,
    from: usize,
    to: usize,
    options: EnqueueOptions,
) -> Vec<TaskRef> {
    let batch: Vec<(Brief, EnqueueOptions)> = (from..to)
        .map(|n| (json_brief(n), options.clone().with_task_id(task_id(n))))
        .collect();
    f.store
        .enqueue_batch(caller, &namespace("renders"), &queue(q), &batch)
        .unwrap()
        .into_iter()
        .map(|e| e.task)
        .collect()
}

/// The resources of the audit rows of `action`, newest first.
fn audited(f: &Fixture<'_>, action: &str) -> Vec<String> {
    f.store
        .audit(&f.admin, &AuditQuery::default())
        .unwrap()
        .events
        .iter()
        .filter(|event| event.action.as_str() == action)
        .map(|event| {
            event
                .resource
                .as_ref()
                .map(|r| r.as_str().to_owned())
                .unwrap_or_default()
        })
        .collect()
}

fn state(f: &Fixture<'_>, task: &TaskRef) -> TaskState {
    f.store.read_task(&f.admin, task).unwrap().record.attempts[0].state
}

fn bulk_cancel_takes_a_queue_and_state(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let reader = f.login(&f.worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let jobs = enqueue(&f, &worker, "jobs", 0, 5, EnqueueOptions::default());
    let others = enqueue(&f, &worker, "other", 10, 13, EnqueueOptions::default());
    let claimed = f.claim(&worker, &ns, &queue("jobs"));
    assert_eq!(claimed.task, jobs[0]);

    let ready = BulkFilter::default()
        .with_queue(queue("jobs"))
        .with_state(StateName::Ready);
    // The enqueue scope is needed, as for one task's cancel.
    assert_eq!(
        f.store
            .cancel_tasks(&reader, &ns, &ready)
            .unwrap_err()
            .status(),
        403
    );
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &ready).unwrap(), 4);
    for task in &jobs[1..] {
        assert_eq!(state(&f, task), TaskState::Cancelled);
    }
    assert_eq!(state(&f, &jobs[0]), TaskState::Leased, "not ready: kept");
    for task in &others {
        assert_eq!(state(&f, task), TaskState::Ready, "another queue: kept");
    }
    assert_eq!(
        f.store.cancel_tasks(&worker, &ns, &ready).unwrap(),
        0,
        "done already"
    );

    // A leased attempt's holder learns of the cancel at its next call.
    let leased = BulkFilter::default()
        .with_queue(queue("jobs"))
        .with_state(StateName::Leased);
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &leased).unwrap(), 1);
    let late = f
        .store
        .heartbeat(&worker, &claimed.task, claimed.lease.token())
        .unwrap_err();
    assert_eq!((late.status(), late.code()), (409, "task_cancelled"));
    assert_eq!(
        audited(&f, "cancel_tasks"),
        [
            "filter:queue=jobs,state=leased/n1",
            "filter:queue=jobs,state=ready/n4"
        ]
    );
}

fn bulk_cancel_takes_a_partition_key(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let customer =
        |key: &str| EnqueueOptions::default().with_partition_key(PartitionKey::parse(key).unwrap());
    let acme = enqueue(&f, &worker, "jobs", 0, 3, customer("acme"));
    let globex = enqueue(&f, &worker, "jobs", 10, 12, customer("globex"));
    let plain = enqueue(&f, &worker, "jobs", 20, 21, EnqueueOptions::default());

    let filter = BulkFilter::default()
        .with_queue(queue("jobs"))
        .with_partition_key(PartitionKey::parse("acme").unwrap());
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &filter).unwrap(), 3);
    for task in &acme {
        assert_eq!(state(&f, task), TaskState::Cancelled);
    }
    for task in globex.iter().chain(&plain) {
        assert_eq!(state(&f, task), TaskState::Ready, "another partition: kept");
    }
    assert_eq!(
        audited(&f, "cancel_tasks"),
        ["filter:queue=jobs,partition=acme/n3"]
    );
    assert_eq!(f.store.retry_tasks(&worker, &ns, &filter).unwrap(), 3);
    for task in &acme {
        assert_eq!(state(&f, task), TaskState::Ready);
    }
}

fn bulk_retry_takes_discarded_tasks_since_a_time(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let one_try = EnqueueOptions::default().with_max_tries(1);
    let tasks = enqueue(&f, &worker, "jobs", 0, 6, one_try);
    // Discards three, then later three more: a retry asked for on the
    // last try discards the attempt.
    let discard = |count: usize| {
        for _ in 0..count {
            let claimed = f.claim(&worker, &ns, &queue("jobs"));
            let state = f
                .store
                .fail(
                    &worker,
                    &claimed.task,
                    claimed.lease.token(),
                    Retry::Backoff,
                )
                .unwrap();
            assert!(matches!(state, TaskState::Discarded { .. }), "{state:?}");
        }
    };
    discard(3);
    f.clock.advance(Duration::from_secs(600));
    let noon_and_ten = f.clock.now_utc();
    f.clock.advance(Duration::from_secs(60));
    discard(3);

    let since = BulkFilter::default()
        .with_state(StateName::Discarded)
        .changed_since(noon_and_ten);
    assert_eq!(f.store.retry_tasks(&worker, &ns, &since).unwrap(), 3);
    for task in &tasks[..3] {
        assert!(matches!(state(&f, task), TaskState::Discarded { .. }));
    }
    for task in &tasks[3..] {
        assert_eq!(state(&f, task), TaskState::Ready, "retried");
    }
    // The earlier ones by a range that ends before the later time.
    let before = BulkFilter::default()
        .with_state(StateName::Discarded)
        .changed_before(noon_and_ten);
    assert_eq!(f.store.retry_tasks(&worker, &ns, &before).unwrap(), 3);
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!((health.attempts.ready, health.attempts.discarded), (6, 0));
    // A retried task takes a fresh try and a fresh token.
    let claimed = f.claim(&worker, &ns, &queue("jobs"));
    assert_eq!(claimed.lease.token().as_i64(), 2);

    // A range that ends before it starts matches nothing.
    let backwards = BulkFilter::default()
        .changed_since(noon_and_ten)
        .changed_before(noon_and_ten - Duration::from_secs(1));
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &backwards).unwrap(), 0);
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!((health.attempts.ready, health.attempts.cancelled), (5, 0));
}

fn bulk_actions_page_in_batches_with_an_audit_row_each(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let total = 2 * BULK_BATCH + 50;
    enqueue(&f, &worker, "jobs", 0, total, EnqueueOptions::default());
    let filter = BulkFilter::default().with_queue(queue("jobs"));
    assert_eq!(
        f.store.cancel_tasks(&worker, &ns, &filter).unwrap(),
        total as u64
    );
    let rows = audited(&f, "cancel_tasks");
    assert_eq!(
        rows,
        [
            "filter:queue=jobs/n50".to_owned(),
            format!("filter:queue=jobs/n{BULK_BATCH}"),
            format!("filter:queue=jobs/n{BULK_BATCH}"),
        ],
        "one row per batch"
    );
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(
        (health.attempts.cancelled, health.attempts.ready),
        (total as u64, 0)
    );
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(
        f.store.retry_tasks(&worker, &ns, &filter).unwrap(),
        total as u64
    );
    assert_eq!(audited(&f, "retry_tasks").len(), 3);
}

/// A filter without a state takes the tasks at rest and then the leases
/// in flight, however the backend indexes them, each once.
fn a_filter_without_a_state_takes_the_leases_in_flight_too(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let jobs = enqueue(&f, &worker, "jobs", 0, 5, EnqueueOptions::default());
    let first = f.claim(&worker, &ns, &queue("jobs"));
    let second = f.claim(&worker, &ns, &queue("jobs"));
    assert_eq!((&first.task, &second.task), (&jobs[0], &jobs[1]));
    let all = BulkFilter::default();
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &all).unwrap(), 5);
    for task in &jobs {
        assert_eq!(state(&f, task), TaskState::Cancelled, "{task:?}");
    }
    assert_eq!(audited(&f, "cancel_tasks").len(), 2, "one row a batch");
    assert_eq!(f.store.cancel_tasks(&worker, &ns, &all).unwrap(), 0);
}

/// A bulk retry changes each task at most once in one call, even while
/// another process whose clock runs a second behind this one's claims
/// and fails the tasks it retried: those come back into the scan stamped
/// before the call began, ahead of its position.
fn a_bulk_action_changes_a_task_once_beside_a_process_whose_clock_is_behind(db: &TestDb) {
    const TASKS: usize = 2 * BULK_BATCH;
    let f = Fixture::new(db);
    let secret = f.full_worker(Grant::AllNamespaces);
    let worker = f.login(&secret);
    let behind =
        tessera_store::ManualClock::new(crate::harness::noon() - chrono::TimeDelta::seconds(1));
    let other = db.open_shared(
        tessera_store::StoreConfig::default().with_clock(std::sync::Arc::new(behind.clone())),
    );
    let other_worker = other.authenticate(Some(secret.secret.expose())).unwrap();
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let tasks = enqueue(&f, &worker, "jobs", 0, TASKS, EnqueueOptions::default());
    let fail_one = || match other.claim(&other_worker, &ns, &q).unwrap() {
        tessera_store::ClaimOutcome::Granted(claimed) => {
            other
                .fail(
                    &other_worker,
                    &claimed.task,
                    claimed.lease.token(),
                    Retry::Never,
                )
                .unwrap();
            true
        }
        _ => false,
    };
    for _ in 0..TASKS {
        assert!(fail_one());
    }
    behind.advance(Duration::from_millis(10));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let retried = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if !fail_one() {
                    std::thread::yield_now();
                }
            }
        });
        let filter = BulkFilter::default()
            .with_queue(q.clone())
            .with_state(StateName::Failed);
        let retried = f.store.retry_tasks(&worker, &ns, &filter).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        retried
    });
    assert!(
        retried as usize <= TASKS,
        "{retried} changes of {TASKS} tasks"
    );
    let counted: u64 = audited(&f, "retry_tasks")
        .iter()
        .map(|resource| {
            resource
                .rsplit("/n")
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(counted, retried, "the audit rows add up to the answer");
    assert_eq!(tasks.len(), TASKS);
}

fn a_filter_that_matches_nothing_changes_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    enqueue(&f, &worker, "jobs", 0, 3, EnqueueOptions::default());
    let filters = [
        BulkFilter::default().with_queue(queue("elsewhere")),
        BulkFilter::default().with_state(StateName::Failed),
        BulkFilter::default().changed_since(f.clock.now_utc() + Duration::from_secs(1)),
        BulkFilter::default().changed_before(f.clock.now_utc()),
    ];
    for filter in &filters {
        assert_eq!(f.store.cancel_tasks(&worker, &ns, filter).unwrap(), 0);
        assert_eq!(f.store.retry_tasks(&worker, &ns, filter).unwrap(), 0);
    }
    // Nothing to retry among ready tasks.
    let all = BulkFilter::default();
    assert_eq!(f.store.retry_tasks(&worker, &ns, &all).unwrap(), 0);
    assert_eq!(
        f.store
            .cancel_tasks(&worker, &namespace("empty"), &all)
            .unwrap(),
        0
    );
    assert!(audited(&f, "cancel_tasks").is_empty());
    assert!(audited(&f, "retry_tasks").is_empty());
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 3);
}

fn heartbeat_progress_is_stored_shown_and_capped(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let ns = namespace("renders");
    let task = enqueue(&f, &worker, "jobs", 0, 1, EnqueueOptions::default())[0].clone();
    let first = f.claim(&worker, &ns, &queue("jobs"));
    let view = f.store.read_task(&worker, &task).unwrap();
    assert!(view.progress.is_empty());

    let progress = serde_json::json!({ "stage": "render", "done": 3, "of": 10 });
    f.store
        .heartbeat_with_progress(&worker, &task, first.lease.token(), &progress)
        .unwrap();
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.progress.len(), 1);
    assert_eq!(view.progress[0].attempt, first.lease.attempt());
    assert_eq!(view.progress[0].progress, progress);
    let listed = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Leased))
        .unwrap();
    assert_eq!(listed.tasks[0].progress.as_ref(), Some(&progress));

    // Over the cap: refused before anything is written.
    let big = serde_json::Value::String("x".repeat(MAX_PROGRESS_BYTES));
    let error = f
        .store
        .heartbeat_with_progress(&worker, &task, first.lease.token(), &big)
        .unwrap_err();
    assert_eq!(error.status(), 400, "{error}");
    // A plain heartbeat keeps the last progress.
    f.store
        .heartbeat(&worker, &task, first.lease.token())
        .unwrap();
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.progress[0].progress, progress);

    // The lease lapses and is granted again: the old token's progress is
    // refused, the new holder's stored.
    f.clock.advance(Duration::from_secs(3600));
    let second = f.claim(&worker, &ns, &queue("jobs"));
    assert_eq!(second.task, task);
    let stale = serde_json::json!({ "done": 9 });
    let error = f
        .store
        .heartbeat_with_progress(&worker, &task, first.lease.token(), &stale)
        .unwrap_err();
    assert_eq!(error.status(), 409);
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.progress[0].progress, progress, "nothing stored");
    let fresh = serde_json::json!({ "done": 1 });
    f.store
        .heartbeat_with_progress(&worker, &task, second.lease.token(), &fresh)
        .unwrap();
    let view = f.store.read_task(&worker, &task).unwrap();
    assert_eq!(view.progress[0].progress, fresh);
}

conformance!(
    bulk_cancel_takes_a_queue_and_state,
    bulk_cancel_takes_a_partition_key,
    bulk_retry_takes_discarded_tasks_since_a_time,
    bulk_actions_page_in_batches_with_an_audit_row_each,
    a_filter_that_matches_nothing_changes_nothing,
    a_filter_without_a_state_takes_the_leases_in_flight_too,
    a_bulk_action_changes_a_task_once_beside_a_process_whose_clock_is_behind,
    heartbeat_progress_is_stored_shown_and_capped,
);
