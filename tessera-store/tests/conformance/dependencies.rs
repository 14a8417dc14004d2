//! Tasks that wait for other tasks, through the public API: a child
//! waits until its last parent ends, however that parent ends and through
//! whichever acknowledgement path; a parent that fails cancels what
//! needed it done; a graph enqueues in one batch; and parents ended by
//! many threads at once unblock their child once.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tessera_store::lease::StateName;
use tessera_store::{
    Brief, Caller, ClaimOutcome, Claimed, EnqueueOptions, Error, Failure, Grant, IdempotencyKey,
    Namespace, Output, Retry, RunAfter, SubmitRequest, Submitted, TaskId, TaskQuery, TaskRef,
    TaskState, WaitOutcome, Worker, WorkerOptions,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

conformance!(
    a_child_waits_until_its_last_parent_is_done,
    a_parent_done_already_counts_as_ended,
    a_missing_or_later_parent_is_a_400_that_enqueues_nothing,
    a_whole_graph_enqueues_in_one_batch_and_runs_in_its_order,
    a_failed_parent_cancels_what_needed_it_done_and_their_children,
    each_acknowledgement_path_unblocks_a_child,
    parents_ended_by_eight_threads_at_once_unblock_their_child_once,
    an_upgrade_from_version_five_keeps_every_task_and_takes_parents_after,
    a_comparison_reads_every_alternative_of_its_parents,
    a_child_made_ready_wakes_a_long_poll_on_its_queue,
    every_parent_is_read_in_the_order_named_ended_before_the_child_or_not,
    a_batch_sent_again_after_its_parents_ended_adds_nothing_and_refuses_nothing,
    a_waiting_child_cancelled_then_retried_waits_again,
    retention_keeps_a_parent_while_a_child_waits,
);

fn ns() -> Namespace {
    namespace("graphs")
}

fn id(name: &str) -> TaskId {
    TaskId::parse(name).unwrap()
}

fn reference(name: &str) -> TaskRef {
    TaskRef::new(ns(), id(name), tessera_store::BriefVersion::FIRST)
}

/// Enqueues task `name` into `queue` after `parents`.
fn put(
    f: &Fixture<'_>,
    caller: &Caller,
    queue_name: &str,
    name: &str,
    parents: &[&str],
) -> TaskRef {
    put_with(f, caller, queue_name, name, parents, RunAfter::AllDone).unwrap()
}

fn put_with(
    f: &Fixture<'_>,
    caller: &Caller,
    queue_name: &str,
    name: &str,
    parents: &[&str],
    run_after: RunAfter,
) -> Result<TaskRef, Error> {
    f.store.enqueue(
        caller,
        &ns(),
        &queue(queue_name),
        &json_brief(name.len()),
        &options(name, parents, run_after),
    )
}

fn options(name: &str, parents: &[&str], run_after: RunAfter) -> EnqueueOptions {
    EnqueueOptions::default()
        .with_task_id(id(name))
        .after(parents.iter().map(|parent| reference(parent)))
        .with_run_after(run_after)
}

fn state(f: &Fixture<'_>, caller: &Caller, task: &TaskRef) -> StateName {
    let view = f.store.read_task(caller, task).unwrap();
    view.record.attempts[0].state.name()
}

fn claim(f: &Fixture<'_>, caller: &Caller, queue_name: &str) -> Option<Claimed> {
    match f.store.claim(caller, &ns(), &queue(queue_name)).unwrap() {
        ClaimOutcome::Granted(claimed) => Some(claimed),
        _ => None,
    }
}

fn submit(f: &Fixture<'_>, caller: &Caller, claimed: &Claimed) {
    let submitted = f
        .store
        .submit(
            caller,
            &claimed.task,
            claimed.lease.token(),
            &IdempotencyKey::parse("done").unwrap(),
            &Output::bytes(claimed.task.id.as_str().as_bytes().to_vec()),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)), "{submitted:?}");
}

/// Claims the next task of `queue_name`, expects `expected`, and submits it.
fn run(f: &Fixture<'_>, caller: &Caller, queue_name: &str, expected: &TaskRef) {
    let claimed = claim(f, caller, queue_name).expect("a claimable task");
    assert_eq!(&claimed.task, expected);
    submit(f, caller, &claimed);
}

fn waiting(f: &Fixture<'_>, caller: &Caller) -> Vec<TaskRef> {
    let query = TaskQuery {
        limit: 100,
        ..TaskQuery::new(StateName::Waiting)
    };
    let page = f.store.list_tasks(caller, &ns(), &query).unwrap();
    page.tasks.into_iter().map(|listing| listing.task).collect()
}

fn a_child_waits_until_its_last_parent_is_done(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let first = put(&f, &caller, "briefs", "brief-1", &[]);
    let second = put(&f, &caller, "briefs", "brief-2", &[]);
    let child = put(&f, &caller, "compare", "compare-1", &["brief-1", "brief-2"]);
    assert_eq!(state(&f, &caller, &child), StateName::Waiting);
    assert_eq!(waiting(&f, &caller), vec![child.clone()]);
    let health = f.store.health(&caller, &ns()).unwrap();
    assert_eq!(health.attempts.waiting, 1, "{health:?}");
    assert!(
        claim(&f, &caller, "compare").is_none(),
        "a waiting task is never granted"
    );

    run(&f, &caller, "briefs", &first);
    assert_eq!(state(&f, &caller, &child), StateName::Waiting);
    assert!(claim(&f, &caller, "compare").is_none());
    run(&f, &caller, "briefs", &second);
    assert_eq!(state(&f, &caller, &child), StateName::Ready);
    assert!(waiting(&f, &caller).is_empty());
    run(&f, &caller, "compare", &child);
    assert_eq!(state(&f, &caller, &child), StateName::Done);
}

fn a_parent_done_already_counts_as_ended(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let done = put(&f, &caller, "briefs", "brief-1", &[]);
    run(&f, &caller, "briefs", &done);
    let open = put(&f, &caller, "briefs", "brief-2", &[]);

    let ready = put(&f, &caller, "compare", "after-done", &["brief-1"]);
    assert_eq!(state(&f, &caller, &ready), StateName::Ready);
    let half = put(
        &f,
        &caller,
        "compare",
        "after-both",
        &["brief-1", "brief-2"],
    );
    assert_eq!(state(&f, &caller, &half), StateName::Waiting);
    run(&f, &caller, "compare", &ready);
    run(&f, &caller, "briefs", &open);
    assert_eq!(state(&f, &caller, &half), StateName::Ready);

    // A parent cancelled already cancels a child that needs it done; one
    // that runs on any outcome is ready.
    let gone = put(&f, &caller, "briefs", "brief-3", &[]);
    f.store.cancel_task(&caller, &gone).unwrap();
    let cancelled = put(&f, &caller, "compare", "after-cancel", &["brief-3"]);
    let view = f.store.read_task(&caller, &cancelled).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Cancelled);
    assert_eq!(
        view.record.attempts[0].last_error.as_deref(),
        Some(tessera_store::lease::PARENT_FAILED)
    );
    let anyway = put_with(
        &f,
        &caller,
        "compare",
        "anyway",
        &["brief-3"],
        RunAfter::AnyOutcome,
    )
    .unwrap();
    assert_eq!(state(&f, &caller, &anyway), StateName::Ready);
}

fn a_missing_or_later_parent_is_a_400_that_enqueues_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    put(&f, &caller, "briefs", "brief-1", &[]);
    let tasks = || db.count_rows("tasks");
    let before = tasks();
    let invalid = |result: Result<TaskRef, Error>| match result {
        Err(Error::InvalidInput { reason }) => reason,
        other => panic!("expected a 400, got {other:?}"),
    };
    let missing = invalid(put_with(
        &f,
        &caller,
        "compare",
        "orphan",
        &["brief-1", "nowhere"],
        RunAfter::AllDone,
    ));
    assert!(missing.contains("nowhere"), "{missing}");
    let own = invalid(put_with(
        &f,
        &caller,
        "compare",
        "self",
        &["self"],
        RunAfter::AllDone,
    ));
    assert!(own.contains("itself"), "{own}");
    let twice = invalid(put_with(
        &f,
        &caller,
        "compare",
        "twice",
        &["brief-1", "brief-1"],
        RunAfter::AllDone,
    ));
    assert!(twice.contains("twice"), "{twice}");
    let elsewhere = f.store.enqueue(
        &caller,
        &ns(),
        &queue("compare"),
        &json_brief(1),
        &EnqueueOptions::default().after([TaskRef::new(
            namespace("other"),
            id("brief-1"),
            tessera_store::BriefVersion::FIRST,
        )]),
    );
    assert!(invalid(elsewhere).contains("namespace"));
    // A parent later in the batch could close a cycle: refused, and the
    // batch enqueues none of its tasks.
    let batch = vec![
        (
            json_brief(1),
            options("early", &["late"], RunAfter::AllDone),
        ),
        (json_brief(2), options("late", &[], RunAfter::AllDone)),
    ];
    let refused = f
        .store
        .enqueue_batch(&caller, &ns(), &queue("compare"), &batch);
    assert!(
        matches!(&refused, Err(Error::InvalidInput { reason }) if reason.contains("late")),
        "{refused:?}"
    );
    assert_eq!(tasks(), before, "a refused enqueue writes no task");
    assert_eq!(db.count_rows("task_edges"), 0);
}

fn a_whole_graph_enqueues_in_one_batch_and_runs_in_its_order(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    // a → (b, c) → d, and e after a task stored before the batch.
    let stored = put(&f, &caller, "dag", "stored", &[]);
    let batch: Vec<(Brief, EnqueueOptions)> = [
        ("a", vec![]),
        ("b", vec!["a"]),
        ("c", vec!["a"]),
        ("d", vec!["b", "c"]),
        ("e", vec!["stored", "a"]),
    ]
    .into_iter()
    .map(|(name, parents)| (json_brief(1), options(name, &parents, RunAfter::AllDone)))
    .collect();
    let enqueued = f
        .store
        .enqueue_batch(&caller, &ns(), &queue("dag"), &batch)
        .unwrap();
    assert!(enqueued.iter().all(|task| task.created));
    let mut order = Vec::new();
    run(&f, &caller, "dag", &stored);
    order.push("stored".to_owned());
    while let Some(claimed) = claim(&f, &caller, "dag") {
        order.push(claimed.task.id.as_str().to_owned());
        submit(&f, &caller, &claimed);
    }
    let place = |name: &str| order.iter().position(|n| n == name).unwrap();
    assert_eq!(order.len(), 6, "{order:?}");
    assert!(
        place("a") < place("b") && place("a") < place("c"),
        "{order:?}"
    );
    assert!(
        place("b") < place("d") && place("c") < place("d"),
        "{order:?}"
    );
    assert!(place("a") < place("e"), "{order:?}");
    // Every edge ended once.
    assert_eq!(db.count_rows("task_edges"), 6);
}

fn a_failed_parent_cancels_what_needed_it_done_and_their_children(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let parent = put(&f, &caller, "briefs", "parent", &[]);
    let child = put(&f, &caller, "compare", "child", &["parent"]);
    let grandchild = put(&f, &caller, "compare", "grandchild", &["child"]);
    let anyway = put_with(
        &f,
        &caller,
        "compare",
        "anyway",
        &["parent"],
        RunAfter::AnyOutcome,
    )
    .unwrap();
    let after_anyway = put(&f, &caller, "compare", "after-anyway", &["anyway"]);

    let claimed = claim(&f, &caller, "briefs").unwrap();
    assert_eq!(claimed.task, parent);
    f.store
        .fail(
            &caller,
            &parent,
            claimed.lease.token(),
            Failure::with_error(Retry::Never, "bad input"),
        )
        .unwrap();
    for task in [&child, &grandchild] {
        let view = f.store.read_task(&caller, task).unwrap();
        assert_eq!(
            view.record.attempts[0].state,
            TaskState::Cancelled,
            "{task}"
        );
        assert_eq!(
            view.record.attempts[0].last_error.as_deref(),
            Some(tessera_store::lease::PARENT_FAILED),
            "{task}"
        );
    }
    assert_eq!(state(&f, &caller, &anyway), StateName::Ready);
    assert_eq!(state(&f, &caller, &after_anyway), StateName::Waiting);
    run(&f, &caller, "compare", &anyway);
    assert_eq!(state(&f, &caller, &after_anyway), StateName::Ready);

    // An operator's cancel of a parent ends its children too, and an
    // operator's retry of a cancelled child runs it.
    let other = put(&f, &caller, "briefs", "other", &[]);
    let waiter = put(&f, &caller, "compare", "waiter", &["other"]);
    f.store.cancel_task(&caller, &other).unwrap();
    assert_eq!(state(&f, &caller, &waiter), StateName::Cancelled);
    f.store.retry_task(&caller, &waiter).unwrap();
    assert_eq!(state(&f, &caller, &waiter), StateName::Ready);
}

fn each_acknowledgement_path_unblocks_a_child(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let paths = ["submit", "batch", "and-claim", "worker"];
    for path in paths {
        put(
            &f,
            &caller,
            &format!("p-{path}"),
            &format!("parent-{path}"),
            &[],
        );
        put(
            &f,
            &caller,
            "children",
            &format!("child-{path}"),
            &[&format!("parent-{path}")],
        );
    }
    let key = IdempotencyKey::parse("done").unwrap();
    // submit
    let claimed = claim(&f, &caller, "p-submit").unwrap();
    submit(&f, &caller, &claimed);
    // submit_batch
    let claimed = claim(&f, &caller, "p-batch").unwrap();
    let answers = f
        .store
        .submit_batch(
            &caller,
            &[SubmitRequest {
                task: claimed.task.clone(),
                token: claimed.lease.token(),
                key: key.clone(),
                output: Output::bytes("ok"),
            }],
        )
        .unwrap();
    assert!(matches!(answers[0], Ok(Submitted::Accepted(_))));
    // submit_and_claim, carrying the next claim of an empty queue
    let claimed = claim(&f, &caller, "p-and-claim").unwrap();
    let (submitted, _) = f
        .store
        .submit_and_claim(
            &caller,
            &SubmitRequest {
                task: claimed.task.clone(),
                token: claimed.lease.token(),
                key: key.clone(),
                output: Output::bytes("ok"),
            },
            &ns(),
            &queue("p-and-claim"),
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
    // the worker loop
    let worker = Worker::new(
        &f.store,
        caller.clone(),
        ns(),
        queue("p-worker"),
        WorkerOptions::default(),
    )
    .unwrap();
    let tessera_store::WorkerNext::Task(claimed) = worker.next().unwrap() else {
        panic!("the worker's parent")
    };
    let _ = worker.submit(&claimed, &key, &Output::bytes("ok")).unwrap();
    drop(worker);
    for path in paths {
        let child = reference(&format!("child-{path}"));
        assert_eq!(state(&f, &caller, &child), StateName::Ready, "{path}");
    }
    let mut granted = Vec::new();
    while let Some(claimed) = claim(&f, &caller, "children") {
        granted.push(claimed.task.id.as_str().to_owned());
        submit(&f, &caller, &claimed);
    }
    granted.sort();
    assert_eq!(
        granted,
        [
            "child-and-claim",
            "child-batch",
            "child-submit",
            "child-worker"
        ]
    );
}

fn parents_ended_by_eight_threads_at_once_unblock_their_child_once(db: &TestDb) {
    const THREADS: usize = 8;
    for round in 0..5 {
        let f = Fixture::new(db);
        let caller = f.login(&f.full_worker(Grant::AllNamespaces));
        let parents: Vec<String> = (0..THREADS).map(|n| format!("r{round}-p{n}")).collect();
        let names: Vec<&str> = parents.iter().map(String::as_str).collect();
        for (n, name) in names.iter().enumerate() {
            put(&f, &caller, &format!("r{round}-q{n}"), name, &[]);
        }
        let child = put(&f, &caller, "fan-in", &format!("r{round}-child"), &names);
        let claims: Vec<Claimed> = (0..THREADS)
            .map(|n| claim(&f, &caller, &format!("r{round}-q{n}")).unwrap())
            .collect();
        let barrier = Arc::new(Barrier::new(THREADS));
        thread::scope(|scope| {
            for claimed in &claims {
                let (barrier, caller, f) = (barrier.clone(), caller.clone(), &f);
                scope.spawn(move || {
                    barrier.wait();
                    submit(f, &caller, claimed);
                });
            }
        });
        assert_eq!(
            state(&f, &caller, &child),
            StateName::Ready,
            "round {round}"
        );
        let granted = claim(&f, &caller, "fan-in").expect("the child, once");
        assert_eq!(granted.task, child);
        assert!(
            claim(&f, &caller, "fan-in").is_none(),
            "round {round}: granted twice"
        );
        let view = f.store.read_task(&caller, &child).unwrap();
        assert_eq!(view.record.attempts[0].tries, 1);
    }
}

fn an_upgrade_from_version_five_keeps_every_task_and_takes_parents_after(db: &TestDb) {
    let mut f = Fixture::new(db);
    let key = f.full_worker(Grant::AllNamespaces);
    let caller = f.login(&key);
    let done = put(&f, &caller, "briefs", "brief-1", &[]);
    run(&f, &caller, "briefs", &done);
    let open = put(&f, &caller, "briefs", "brief-2", &[]);
    let leased = put(&f, &caller, "briefs", "brief-3", &[]);
    let held = claim(&f, &caller, "briefs").unwrap();
    assert_eq!(held.task, open);
    let _ = leased;
    let tasks = db.count_rows("tasks");
    db.downgrade_edges_to_version_five();

    f.reopen(f.config());
    let caller = f.login(&key);
    assert_eq!(db.count_rows("tasks"), tasks);
    assert_eq!(state(&f, &caller, &done), StateName::Done);
    // The lease held across the upgrade still submits, and ends a parent.
    let child = put(&f, &caller, "compare", "compare-1", &["brief-1", "brief-2"]);
    assert_eq!(state(&f, &caller, &child), StateName::Waiting);
    submit(&f, &caller, &held);
    assert_eq!(state(&f, &caller, &child), StateName::Ready);
}

/// The seed's comparison verb: one brief solved by three competing
/// attempts, and a comparison task after it that reads all three.
fn a_comparison_reads_every_alternative_of_its_parents(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let brief = f
        .store
        .enqueue(
            &caller,
            &ns(),
            &queue("briefs"),
            &json_brief(1),
            &EnqueueOptions::default()
                .with_task_id(id("brief-1"))
                .with_alternatives(3),
        )
        .unwrap();
    let other = put(&f, &caller, "briefs", "brief-2", &[]);
    let compare = put(&f, &caller, "compare", "compare-1", &["brief-1", "brief-2"]);
    // Three workers each solve brief-1 under their own lease and key;
    // brief-2 is solved once.
    let mut claims = Vec::new();
    for _ in 0..4 {
        claims.push(claim(&f, &caller, "briefs").unwrap());
    }
    for (n, claimed) in claims.iter().enumerate() {
        let submitted = f
            .store
            .submit(
                &caller,
                &claimed.task,
                claimed.lease.token(),
                &IdempotencyKey::parse(&format!("solution-{n}")).unwrap(),
                &Output::bytes(format!("solution {n}").into_bytes()),
            )
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
    assert_eq!(state(&f, &caller, &compare), StateName::Ready);
    let parents = f.store.parent_alternatives(&caller, &compare).unwrap();
    assert_eq!(parents.len(), 2);
    assert_eq!(parents[0].parent, brief);
    assert_eq!(parents[1].parent, other);
    assert_eq!(
        parents[0].receipts.len(),
        3,
        "every alternative of the brief"
    );
    assert_eq!(parents[1].receipts.len(), 1);
    let attempts: Vec<u16> = parents[0]
        .receipts
        .iter()
        .map(|stored| stored.receipt.attempt.as_u16())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    for stored in parents.iter().flat_map(|parent| &parent.receipts) {
        let output = String::from_utf8(stored.output.clone().unwrap()).unwrap();
        assert!(output.starts_with("solution "), "{output}");
        assert!(
            stored
                .receipt
                .artifact
                .as_str()
                .contains(stored.receipt.task.as_str())
        );
    }
    // A task without parents has none to read; an unknown one is a 404.
    assert!(
        f.store
            .parent_alternatives(&caller, &brief)
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        f.store.parent_alternatives(&caller, &reference("nowhere")),
        Err(Error::NotFound { .. })
    ));
}

/// A child made ready by its parent's end wakes a long-poll on its queue,
/// as an enqueue does (the store's clock never moves here, so only a wake
/// ends the poll before the test moves it).
fn a_child_made_ready_wakes_a_long_poll_on_its_queue(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    put(&f, &caller, "briefs", "brief-1", &[]);
    put(&f, &caller, "compare", "compare-1", &["brief-1"]);
    let claimed = claim(&f, &caller, "briefs").unwrap();
    thread::scope(|scope| {
        let polling = scope.spawn(|| {
            f.store
                .wait_for_work(&caller, &ns(), &queue("compare"), Duration::from_secs(30))
        });
        while f.store.long_polls_waiting() == 0 {
            thread::yield_now();
        }
        submit(&f, &caller, &claimed);
        let waited = Instant::now();
        while !polling.is_finished() && waited.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(5));
        }
        // Not woken: the poll times out, and the assertion below says so.
        f.clock.advance(Duration::from_secs(31));
        assert_eq!(polling.join().unwrap().unwrap(), WaitOutcome::WorkAvailable);
    });
}

fn every_parent_is_read_in_the_order_named_ended_before_the_child_or_not(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let done = put(&f, &caller, "briefs", "zeta", &[]);
    run(&f, &caller, "briefs", &done);
    let cancelled = put(&f, &caller, "briefs", "alpha", &[]);
    f.store.cancel_task(&caller, &cancelled).unwrap();
    let open = put(&f, &caller, "briefs", "mid", &[]);
    let child = put_with(
        &f,
        &caller,
        "compare",
        "child",
        &["mid", "zeta", "alpha"],
        RunAfter::AnyOutcome,
    )
    .unwrap();
    assert_eq!(state(&f, &caller, &child), StateName::Waiting);
    run(&f, &caller, "briefs", &open);
    assert_eq!(state(&f, &caller, &child), StateName::Ready);
    let parents = f.store.parent_alternatives(&caller, &child).unwrap();
    let named: Vec<&TaskRef> = parents.iter().map(|parent| &parent.parent).collect();
    assert_eq!(
        named,
        [&open, &done, &cancelled],
        "in the order `after` named them"
    );
    let receipts: Vec<usize> = parents.iter().map(|parent| parent.receipts.len()).collect();
    assert_eq!(
        receipts,
        [1, 1, 0],
        "the parent done before the child's enqueue included"
    );
    // A child whose every parent had ended reads them too.
    let late = put(&f, &caller, "compare", "late", &["zeta"]);
    assert_eq!(state(&f, &caller, &late), StateName::Ready);
    let parents = f.store.parent_alternatives(&caller, &late).unwrap();
    assert_eq!(parents.len(), 1);
    assert_eq!(parents[0].receipts.len(), 1);
}

fn a_batch_sent_again_after_its_parents_ended_adds_nothing_and_refuses_nothing(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let stored = put(&f, &caller, "briefs", "stored", &[]);
    let batch = vec![
        (json_brief(1), options("a", &[], RunAfter::AllDone)),
        (
            json_brief(2),
            options("b", &["a", "stored"], RunAfter::AllDone),
        ),
    ];
    let first = f
        .store
        .enqueue_batch(&caller, &ns(), &queue("dag"), &batch)
        .unwrap();
    assert!(first.iter().all(|task| task.created));
    run(&f, &caller, "briefs", &stored);
    let again = f
        .store
        .enqueue_batch(&caller, &ns(), &queue("dag"), &batch)
        .unwrap();
    assert!(again.iter().all(|task| !task.created), "{again:?}");
    assert_eq!(db.count_rows("task_edges"), 2, "no edge twice");
    assert_eq!(state(&f, &caller, &reference("b")), StateName::Waiting);
}

fn a_waiting_child_cancelled_then_retried_waits_again(db: &TestDb) {
    let f = Fixture::new(db);
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    let parent = put(&f, &caller, "briefs", "parent", &[]);
    let child = put(&f, &caller, "compare", "child", &["parent"]);
    f.store.cancel_task(&caller, &child).unwrap();
    assert_eq!(state(&f, &caller, &child), StateName::Cancelled);
    f.store.retry_task(&caller, &child).unwrap();
    assert_eq!(
        state(&f, &caller, &child),
        StateName::Waiting,
        "its parent has not ended"
    );
    assert!(claim(&f, &caller, "compare").is_none());
    // The same by filter.
    f.store
        .cancel_tasks(
            &caller,
            &ns(),
            &tessera_store::BulkFilter::default().with_state(StateName::Waiting),
        )
        .unwrap();
    f.store
        .retry_tasks(
            &caller,
            &ns(),
            &tessera_store::BulkFilter::default().with_state(StateName::Cancelled),
        )
        .unwrap();
    assert_eq!(state(&f, &caller, &child), StateName::Waiting);
    run(&f, &caller, "briefs", &parent);
    assert_eq!(state(&f, &caller, &child), StateName::Ready);
}

fn retention_keeps_a_parent_while_a_child_waits(db: &TestDb) {
    let minute = Duration::from_secs(60);
    let f = Fixture::with(db, |config| {
        config.with_retention(tessera_store::Retention {
            done: Some(minute),
            discarded: Some(minute),
            cancelled: Some(minute),
        })
    });
    let caller = f.login(&f.full_worker(Grant::AllNamespaces));
    // `kept` and `gone` are done; `ready` ran after both, `waiting` waits
    // for `kept` and `later`.
    let kept = put(&f, &caller, "briefs", "kept", &[]);
    let gone = put(&f, &caller, "briefs", "gone", &[]);
    let ready = put(&f, &caller, "compare", "ready", &["kept", "gone"]);
    run(&f, &caller, "briefs", &kept);
    run(&f, &caller, "briefs", &gone);
    let later = put(&f, &caller, "briefs", "later", &[]);
    let second = put(&f, &caller, "compare", "second", &["kept", "later"]);
    assert_eq!(state(&f, &caller, &ready), StateName::Ready);
    assert_eq!(state(&f, &caller, &second), StateName::Waiting);
    f.clock.advance(10 * minute);
    let report = f.store.maintain().unwrap();
    assert!(report.retention_ran);
    // Both are past their keep time: `kept` stays for `second`, which
    // still waits; `gone` has no child waiting and is purged.
    assert!(
        f.store.read_task(&caller, &kept).is_ok(),
        "kept for a waiting child"
    );
    assert_eq!(f.store.read_task(&caller, &gone).unwrap_err().status(), 404);
    run(&f, &caller, "briefs", &later);
    let parents = f.store.parent_alternatives(&caller, &second).unwrap();
    assert_eq!(parents.len(), 2);
    assert_eq!(parents[0].receipts.len(), 1, "the kept parent's output");
}
