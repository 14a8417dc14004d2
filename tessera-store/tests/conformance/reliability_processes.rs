//! Several operating-system processes share one database and claim from
//! the same queue at once: every grant goes to exactly one process, fencing
//! tokens strictly increase per task, and every acknowledged submission is
//! there afterwards.

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;

use tessera_store::{AttemptNumber, BriefVersion, Grant, Scope, TaskRef, TaskState};

use crate::harness::{Fixture, TestDb, noon, task_id, task_number};
use crate::workers::{
    ChildOrders, Event, grants_for, read_events, spawn_child, work_namespace, work_queue,
};

/// Enqueues `tasks` tasks, lets `processes` children with `threads` threads
/// each work them (failing some on purpose so they are granted again), and
/// checks every grant, token and receipt. Returns how many grants each
/// process received.
fn processes_share_one_database(
    db: &TestDb,
    processes: usize,
    threads: usize,
    tasks: usize,
) -> Vec<usize> {
    let setup = Fixture::new(db);
    let (ns, q) = (work_namespace(), work_queue());
    let producer = setup.login(&setup.key(&[Scope::Enqueue], Grant::Namespace(ns.clone())));
    setup.enqueue_range(&producer, &ns, &q, 0, tasks);
    // One key, so one principal, per process: a receipt names its process.
    let keys: Vec<_> = (0..processes)
        .map(|_| setup.key(&[Scope::Claim], Grant::Namespace(ns.clone())))
        .collect();

    let mut children: Vec<_> = keys
        .iter()
        .map(|key| {
            spawn_child(&ChildOrders {
                db,
                key: key.secret.expose().to_owned(),
                at: noon(),
                threads,
                retries: true,
                batch: 0,
            })
        })
        .collect();
    // Each child's stdout is drained on its own thread, so no child blocks
    // on a full pipe while another is read.
    let logs: Vec<Vec<Event>> = std::thread::scope(|scope| {
        let readers: Vec<_> = children
            .iter_mut()
            .map(|child| {
                let mut stdout = BufReader::new(child.stdout.take().unwrap());
                scope.spawn(move || {
                    let mut events = Vec::new();
                    read_events(&mut stdout, &mut events, |_, _| false);
                    events
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for child in &mut children {
        let status = child.wait().unwrap();
        assert!(status.success(), "a worker process failed: {status}");
    }

    // Per task: every grant (process, token) in the order each process saw
    // them, every fail report and every acknowledged submission.
    let mut grants: BTreeMap<usize, Vec<(usize, i64)>> = BTreeMap::new();
    let mut fails: HashMap<(usize, i64), usize> = HashMap::new();
    let mut acks: HashMap<usize, (usize, i64, String)> = HashMap::new();
    for (process, log) in logs.iter().enumerate() {
        let mut last_seen: HashMap<usize, i64> = HashMap::new();
        for event in log {
            let task = task_number(event.task());
            match event {
                Event::Grant { token, .. } => {
                    let previous = last_seen.insert(task, *token);
                    assert!(
                        previous.is_none_or(|p| p < *token),
                        "process {process} saw token {token} of task {task} after {previous:?}"
                    );
                    grants.entry(task).or_default().push((process, *token));
                }
                Event::Fail { token, .. } => {
                    assert!(fails.insert((task, *token), process).is_none());
                }
                Event::Ack { token, digest, .. } => {
                    let ack = (process, *token, digest.clone());
                    assert!(acks.insert(task, ack).is_none(), "task {task} acked twice");
                }
            }
        }
    }

    assert_eq!(grants.len(), tasks, "every task was granted");
    for (&task, granted) in &grants {
        // Every token from 1 to the task's number of grants was handed out
        // exactly once, to exactly one process.
        let mut tokens: Vec<i64> = granted.iter().map(|(_, token)| *token).collect();
        tokens.sort_unstable();
        let expected: Vec<i64> = (1..=grants_for(task)).collect();
        assert_eq!(tokens, expected, "grants of task {task}: {granted:?}");
        // A new grant only after the previous lease was failed by the
        // process that held it; the last grant is the one that submitted.
        for &(process, token) in granted {
            if token < grants_for(task) {
                assert_eq!(fails.get(&(task, token)), Some(&process), "task {task}");
            } else {
                let (acked_by, acked_token, _) = &acks[&task];
                assert_eq!((acked_by, acked_token), (&process, &token), "task {task}");
            }
        }
    }
    assert_eq!(acks.len(), tasks);

    // Every acknowledged submission is stored, under its token, digest and
    // principal.
    for (&task, (process, token, digest)) in &acks {
        let reference = TaskRef::new(ns.clone(), task_id(task), BriefVersion::FIRST);
        let stored = setup
            .store
            .read_receipt(&setup.admin, &reference, AttemptNumber::FIRST)
            .unwrap();
        assert_eq!(stored.receipt.token.as_i64(), *token);
        assert_eq!(&stored.receipt.digest.to_string(), digest);
        assert_eq!(
            stored.receipt.principal.as_str(),
            keys[*process].info.principal.to_string()
        );
        let view = setup.store.read_task(&setup.admin, &reference).unwrap();
        assert_eq!(view.record.last_token.unwrap().as_i64(), grants_for(task));
        assert_eq!(view.record.attempts[0].state, TaskState::Done);
    }
    let health = setup.store.health(&setup.admin, &ns).unwrap();
    assert_eq!(health.attempts.done, tasks as u64);
    assert_eq!(health.attempts.total(), tasks as u64);
    assert_eq!(db.integrity_check(), "ok");
    logs.iter()
        .map(|log| {
            log.iter()
                .filter(|event| matches!(event, Event::Grant { .. }))
                .count()
        })
        .collect()
}

fn two_processes_share_one_database(db: &TestDb) {
    let grants = processes_share_one_database(db, 2, 2, 300);
    assert_eq!(grants.iter().sum::<usize>(), 300 + 100 + 34);
}

fn five_processes_share_ten_thousand_tasks(db: &TestDb) {
    let grants = processes_share_one_database(db, 5, 2, 10_000);
    eprintln!("grants per process: {grants:?}");
    // Ten thousand tasks outlast any process's start-up: all took part.
    assert!(grants.iter().all(|&n| n > 0), "{grants:?}");
}

conformance! {
    two_processes_share_one_database,
    #[ignore = "long: run by .ci/run"]
    five_processes_share_ten_thousand_tasks,
}
