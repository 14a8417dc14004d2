//! Partition keys and unique tasks, through the public API.

use std::collections::BTreeSet;
use std::time::Duration;

use tessera_store::lease::StateName;
use tessera_store::{
    Brief, Caller, Clock, EnqueueOptions, Enqueued, Grant, IdempotencyKey, Output, PartitionKey,
    Retry, TaskQuery, TaskRef, TaskState, UniqueKey, UniqueMode, UniqueStates, Uniqueness,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue, task_id};

fn unique(key: &str) -> Uniqueness {
    Uniqueness::new(UniqueKey::parse(key).expect("a valid unique key"))
}

/// Enqueues brief `n` into `renders/jobs` with `options`.
fn put(f: &Fixture<'_>, caller: &Caller, n: usize, options: EnqueueOptions) -> Enqueued {
    f.store
        .enqueue_one(
            caller,
            &namespace("renders"),
            &queue("jobs"),
            &json_brief(n),
            &options,
        )
        .unwrap()
}

fn keyed(key: &str) -> EnqueueOptions {
    EnqueueOptions::default().with_unique(unique(key))
}

/// Claims `renders/jobs` and submits the lease.
fn claim_and_submit(f: &Fixture<'_>, caller: &Caller, expected: &TaskRef) {
    let claimed = f.claim(caller, &namespace("renders"), &queue("jobs"));
    assert_eq!(&claimed.task, expected);
    let _ = f
        .store
        .submit(
            caller,
            &claimed.task,
            claimed.lease.token(),
            &IdempotencyKey::parse("done").unwrap(),
            &Output::bytes("ok"),
        )
        .unwrap();
}

fn a_duplicate_while_unfinished_returns_the_task_writes_nothing_and_done_frees_the_key(
    db: &TestDb,
) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let first = put(&f, &worker, 1, keyed("report-7"));
    assert!(first.created);
    let view = f.store.read_task(&worker, &first.task).unwrap();
    assert_eq!(view.unique_key, Some(UniqueKey::parse("report-7").unwrap()));

    // A duplicate, ready or leased: the same task, created false, and not
    // one row written (no task, no audit row).
    let before = db.table_snapshot();
    let (again, cost) = f.store.measure(|_| put(&f, &worker, 2, keyed("report-7")));
    assert_eq!(
        again,
        Enqueued {
            task: first.task.clone(),
            created: false
        }
    );
    assert_eq!(db.table_snapshot(), before, "a duplicate writes nothing");
    if db.meters_rows() {
        assert_eq!(cost.rows_written, 0);
    }
    // `enqueue` answers with the task already there too.
    let plain = f
        .store
        .enqueue(
            &worker,
            &namespace("renders"),
            &queue("jobs"),
            &json_brief(3),
            &keyed("report-7"),
        )
        .unwrap();
    assert_eq!(plain, first.task);
    // Another key, or another queue, is another slot.
    assert!(put(&f, &worker, 4, keyed("report-8")).created);
    let other_queue = f
        .store
        .enqueue_one(
            &worker,
            &namespace("renders"),
            &queue("other"),
            &json_brief(5),
            &keyed("report-7"),
        )
        .unwrap();
    assert!(other_queue.created);

    let claimed = f.claim(&worker, &namespace("renders"), &queue("jobs"));
    assert_eq!(claimed.task, first.task);
    let before = db.table_snapshot();
    assert_eq!(
        put(&f, &worker, 6, keyed("report-7")).task,
        first.task,
        "leased still counts"
    );
    assert_eq!(db.table_snapshot(), before);
    // The brief was kept: a duplicate in keep mode changes nothing.
    let view = f.store.read_task(&worker, &first.task).unwrap();
    assert_eq!(view.brief, json_brief(1));

    // Done: the key is free, and a new task is created.
    let _ = f
        .store
        .submit(
            &worker,
            &claimed.task,
            claimed.lease.token(),
            &IdempotencyKey::parse("done").unwrap(),
            &Output::bytes("ok"),
        )
        .unwrap();
    let next = put(&f, &worker, 7, keyed("report-7"));
    assert!(next.created);
    assert_ne!(next.task, first.task);
    // The done task keeps its key for reading.
    let view = f.store.read_task(&worker, &first.task).unwrap();
    assert_eq!(view.unique_key, Some(UniqueKey::parse("report-7").unwrap()));
}

fn a_failure_cancel_or_discard_frees_the_key_and_a_retry_does_not_take_it_back(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    // A failure for good.
    let first = put(&f, &worker, 1, keyed("k"));
    let claimed = f.claim(&worker, &ns, &q);
    f.store
        .fail(&worker, &claimed.task, claimed.lease.token(), Retry::Never)
        .unwrap();
    let second = put(&f, &worker, 2, keyed("k"));
    assert!(second.created, "a failed task lets its key go");
    // A retry puts the failed one back, without its slot.
    f.store.retry_task(&worker, &first.task).unwrap();
    assert_eq!(put(&f, &worker, 3, keyed("k")).task, second.task);
    // A cancel.
    f.store.cancel_task(&worker, &second.task).unwrap();
    let third = put(&f, &worker, 4, keyed("k"));
    assert!(third.created);
    // A lapse on the last try, recorded by expiry: discarded.
    f.store.cancel_task(&worker, &first.task).unwrap();
    let once = put(&f, &worker, 5, keyed("once").with_max_tries(1));
    assert!(once.created);
    assert_eq!(put(&f, &worker, 6, keyed("once")).task, once.task);
    // Claim `third` (older) and `once`; let both lapse.
    let a = f.claim(&worker, &ns, &q);
    let b = f.claim(&worker, &ns, &q);
    assert_eq!(
        BTreeSet::from([a.task.clone(), b.task.clone()]),
        BTreeSet::from([third.task.clone(), once.task.clone()])
    );
    f.clock.advance(Duration::from_secs(3_600));
    f.store.expire_leases(&ns, 10).unwrap();
    let view = f.store.read_task(&worker, &once.task).unwrap();
    assert!(matches!(
        view.record.attempts[0].state,
        TaskState::Discarded { .. }
    ));
    assert!(
        put(&f, &worker, 7, keyed("once")).created,
        "discarded lets it go"
    );
    // `third` lapsed with tries left: ready again, still holding its key.
    assert_eq!(put(&f, &worker, 8, keyed("k")).task, third.task);
}

fn a_window_makes_each_period_its_own_slot(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let mut rule = unique("digest");
    rule.window = Some(Duration::from_secs(600));
    rule.states = UniqueStates::ANY;
    let options = EnqueueOptions::default().with_unique(rule);
    // Start at a period's beginning.
    let now = f.clock.now_utc().timestamp();
    f.clock
        .advance(Duration::from_secs((600 - now.rem_euclid(600)) as u64));
    let first = put(&f, &worker, 1, options.clone());
    assert!(first.created);
    f.clock.advance(Duration::from_secs(599));
    assert_eq!(put(&f, &worker, 2, options.clone()).task, first.task);
    // Finished or not, with every state counted the period holds it.
    claim_and_submit(&f, &worker, &first.task);
    assert_eq!(put(&f, &worker, 3, options.clone()).task, first.task);
    f.clock.advance(Duration::from_secs(1));
    let second = put(&f, &worker, 4, options.clone());
    assert!(second.created, "the next period is a new slot");
    assert_ne!(second.task, first.task);
    assert_eq!(put(&f, &worker, 5, options).task, second.task);
}

fn replace_and_debounce_change_a_waiting_task_only(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let start = f.clock.now_utc();
    let mut replace = unique("r");
    replace.mode = UniqueMode::Replace;
    let first = put(
        &f,
        &worker,
        1,
        EnqueueOptions::default().with_unique(replace.clone()),
    );
    let later = start + Duration::from_secs(120);
    let again = put(
        &f,
        &worker,
        2,
        EnqueueOptions::default()
            .with_unique(replace.clone())
            .with_not_before(later),
    );
    assert_eq!(
        again,
        Enqueued {
            task: first.task.clone(),
            created: false
        }
    );
    let view = f.store.read_task(&worker, &first.task).unwrap();
    assert_eq!(view.brief, json_brief(2), "the brief is replaced");
    assert_eq!(
        view.record.attempts[0].state,
        TaskState::Scheduled { at: later }
    );
    // Replaced without a not-before: ready again.
    put(
        &f,
        &worker,
        3,
        EnqueueOptions::default().with_unique(replace.clone()),
    );
    let view = f.store.read_task(&worker, &first.task).unwrap();
    assert_eq!(
        (view.brief, view.record.attempts[0].state),
        (json_brief(3), TaskState::Ready)
    );
    // Leased: a duplicate changes nothing.
    let claimed = f.claim(&worker, &namespace("renders"), &queue("jobs"));
    assert_eq!(claimed.task, first.task);
    let before = db.table_snapshot();
    put(
        &f,
        &worker,
        4,
        EnqueueOptions::default().with_unique(replace),
    );
    assert_eq!(db.table_snapshot(), before);

    // Debounce: each duplicate pushes the run a minute past itself, never
    // past five minutes after the first enqueue.
    let mut debounce = unique("d");
    debounce.mode = UniqueMode::Debounce {
        delay: Duration::from_secs(60),
        max_delay: Duration::from_secs(300),
    };
    let options = EnqueueOptions::default().with_unique(debounce);
    let enqueued_at = f.clock.now_utc();
    let held = put(&f, &worker, 10, options.clone());
    assert!(held.created);
    assert_eq!(
        f.store
            .read_task(&worker, &held.task)
            .unwrap()
            .record
            .attempts[0]
            .state,
        TaskState::Ready,
        "the first enqueue runs as asked"
    );
    f.clock.advance(Duration::from_secs(10));
    put(&f, &worker, 11, options.clone());
    let view = f.store.read_task(&worker, &held.task).unwrap();
    assert_eq!(
        view.record.attempts[0].state,
        TaskState::Scheduled {
            at: enqueued_at + Duration::from_secs(70)
        }
    );
    assert_eq!(view.brief, json_brief(11));
    f.clock.advance(Duration::from_secs(240));
    put(&f, &worker, 12, options);
    let view = f.store.read_task(&worker, &held.task).unwrap();
    assert_eq!(
        view.record.attempts[0].state,
        TaskState::Scheduled {
            at: enqueued_at + Duration::from_secs(300)
        }
    );
}

fn a_batch_takes_each_slot_once_and_reports_its_duplicates(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let stored = put(&f, &worker, 0, keyed("stored"));
    let batch: Vec<(Brief, EnqueueOptions)> = vec![
        (json_brief(1), keyed("k")),
        (json_brief(2), keyed("k")),
        (json_brief(3), EnqueueOptions::default()),
        (json_brief(4), keyed("stored")),
        (json_brief(5), keyed("j")),
        (json_brief(6), keyed("j")),
    ];
    let answers = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    let created: Vec<bool> = answers.iter().map(|a| a.created).collect();
    assert_eq!(created, [true, false, true, false, true, false]);
    assert_eq!(answers[1].task, answers[0].task, "the first of a slot wins");
    assert_eq!(answers[3].task, stored.task);
    assert_eq!(answers[5].task, answers[4].task);
    let ready = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Ready))
        .unwrap();
    assert_eq!(ready.tasks.len(), 4, "stored, k, the plain one and j");
    // The first's brief was kept.
    assert_eq!(
        f.store.read_task(&worker, &answers[0].task).unwrap().brief,
        json_brief(1)
    );
    // Sent again: every unique task is a duplicate (the plain one, with
    // no id given, is a new task).
    let again = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    let created: Vec<bool> = again.iter().map(|a| a.created).collect();
    assert_eq!(created, [false, false, true, false, false, false]);
    for place in [0, 1, 3, 4, 5] {
        assert_eq!(again[place].task, answers[place].task);
    }
    // In replace mode the batch's later duplicates replace the first.
    let mut replace = unique("r");
    replace.mode = UniqueMode::Replace;
    let options = EnqueueOptions::default().with_unique(replace);
    let answers = f
        .store
        .enqueue_batch(
            &worker,
            &ns,
            &q,
            &[(json_brief(7), options.clone()), (json_brief(8), options)],
        )
        .unwrap();
    assert_eq!((answers[0].created, answers[1].created), (true, false));
    assert_eq!(
        f.store.read_task(&worker, &answers[0].task).unwrap().brief,
        json_brief(8)
    );
}

/// A batch re-sent after its unique task finished: the first task of the
/// key is its stored self, and leaves the free key to the next task of the
/// batch, which takes it; no answer names a holder that holds nothing.
fn a_resent_batch_never_names_a_holder_that_holds_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let first = keyed("k").with_task_id(task_id(1));
    let batch = vec![(json_brief(1), first.clone())];
    let answers = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    claim_and_submit(&f, &worker, &answers[0].task);

    // Sent again with a second task of the key behind it.
    let batch = vec![(json_brief(1), first), (json_brief(2), keyed("k"))];
    let again = f.store.enqueue_batch(&worker, &ns, &q, &batch).unwrap();
    assert_eq!(
        (again[0].task.clone(), again[0].created),
        (answers[0].task.clone(), false)
    );
    assert!(again[1].created, "the key was free: {again:?}");
    assert_ne!(again[1].task, again[0].task);
    // It holds the key: a plain enqueue of the key is its duplicate.
    let plain = put(&f, &worker, 3, keyed("k"));
    assert_eq!((plain.task, plain.created), (again[1].task.clone(), false));
}

fn concurrent_enqueues_of_one_key_create_exactly_one_task(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let answers: Vec<Enqueued> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let (f, worker) = (&f, &worker);
                scope.spawn(move || {
                    (0..5)
                        .map(|round| put(f, worker, n * 10 + round, keyed("only-one")))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert_eq!(answers.iter().filter(|a| a.created).count(), 1);
    let tasks: BTreeSet<&TaskRef> = answers.iter().map(|a| &a.task).collect();
    assert_eq!(tasks.len(), 1, "every answer names the one task");
    assert_eq!(db.count_rows("tasks"), 1);
}

fn partition(name: &str) -> PartitionKey {
    PartitionKey::parse(name).expect("a valid partition key")
}

fn a_partition_key_is_stored_and_shown_by_the_task_view_and_listings(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let keyed = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &json_brief(1),
            &EnqueueOptions::default()
                .with_task_id(task_id(1))
                .with_partition_key(partition("customer-7")),
        )
        .unwrap();
    let plain = f.enqueue_one(&worker, &ns, &q, 2);
    let batch = f
        .store
        .enqueue_batch(
            &worker,
            &ns,
            &q,
            &[(
                Brief::Bytes(b"x".to_vec()),
                EnqueueOptions::default()
                    .with_task_id(task_id(3))
                    .with_partition_key(partition("customer-8")),
            )],
        )
        .unwrap();
    assert!(batch[0].created);

    let view = f.store.read_task(&worker, &keyed).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-7")));
    assert_eq!(view.unique_key, None);
    let view = f.store.read_task(&worker, &plain).unwrap();
    assert_eq!(view.partition_key, None);
    let view = f.store.read_task(&worker, &batch[0].task).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-8")));

    let listed = f
        .store
        .list_tasks(&worker, &ns, &TaskQuery::new(StateName::Ready))
        .unwrap();
    let keys: Vec<_> = listed
        .tasks
        .iter()
        .map(|listing| (listing.task.id.clone(), listing.partition_key.clone()))
        .collect();
    assert_eq!(
        keys,
        vec![
            (task_id(1), Some(partition("customer-7"))),
            (task_id(2), None),
            (task_id(3), Some(partition("customer-8"))),
        ]
    );
    // The claim keeps it.
    let claimed = f.claim(&worker, &ns, &q);
    assert_eq!(claimed.task, keyed);
    let view = f.store.read_task(&worker, &keyed).unwrap();
    assert_eq!(view.partition_key, Some(partition("customer-7")));
}

conformance! {
    a_partition_key_is_stored_and_shown_by_the_task_view_and_listings,
    a_duplicate_while_unfinished_returns_the_task_writes_nothing_and_done_frees_the_key,
    a_failure_cancel_or_discard_frees_the_key_and_a_retry_does_not_take_it_back,
    a_window_makes_each_period_its_own_slot,
    replace_and_debounce_change_a_waiting_task_only,
    a_batch_takes_each_slot_once_and_reports_its_duplicates,
    a_resent_batch_never_names_a_holder_that_holds_nothing,
    concurrent_enqueues_of_one_key_create_exactly_one_task,
}
