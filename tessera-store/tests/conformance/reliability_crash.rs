//! A worker process killed with SIGKILL at random points, round after
//! round: the database stays sound, no task is leased twice at once, and
//! every submission the worker had acknowledged is there.

use std::collections::{HashMap, HashSet};
use std::io::BufReader;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_store::limits::MAX_AUDIT_ROWS;
use tessera_store::{
    Action, AttemptNumber, AuditQuery, BriefVersion, ClaimOutcome, Grant, IdempotencyKey,
    PrincipalId, Scope, Submitted, TaskRef, TaskState,
};

use crate::harness::{Fixture, TestDb, noon, task_id, task_number};
use crate::workers::{
    ChildOrders, Event, Rng, output_for, read_events, spawn_child, work_namespace, work_queue,
};

/// An acknowledged submission: its token, digest and principal.
type Ack = (i64, String, String);

fn crash_rounds(db: &TestDb, rounds: usize, tasks: usize, max_events: u64, batch: usize) {
    let mut rng = Rng::from_env_or_os();
    let mut setup = Fixture::new(db);
    let (ns, q) = (work_namespace(), work_queue());
    let producer = setup.login(&setup.key(&[Scope::Enqueue], Grant::Namespace(ns.clone())));
    setup.enqueue_range(&producer, &ns, &q, 0, tasks);
    let reference = |task: usize| TaskRef::new(ns.clone(), task_id(task), BriefVersion::FIRST);

    let mut acked: HashMap<usize, Ack> = HashMap::new();
    let mut highest_token: HashMap<usize, i64> = HashMap::new();
    // Leases a killed worker held and never submitted: (its key, task, token).
    let mut orphans: Vec<(String, usize, i64)> = Vec::new();
    let mut kills = 0;
    for round in 0..rounds {
        // Each round starts two minutes after the last, so the leases the
        // killed worker left behind (60 s) have lapsed and are taken over.
        let at = round_start(round);
        setup.clock.set_utc(at);
        let key = setup.key(&[Scope::Claim], Grant::Namespace(ns.clone()));
        let principal = key.info.principal.to_string();
        let mut child = spawn_child(&ChildOrders {
            db,
            key: key.secret.expose().to_owned(),
            at,
            // Several threads, so their writes share commits.
            threads: 4,
            retries: false,
            batch,
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut events = Vec::new();
        // Zero kills the worker while it starts up and opens the file.
        let kill_after = rng.between(0, max_events) as usize;
        if kill_after > 0 {
            read_events(&mut stdout, &mut events, |_, seen| seen.len() >= kill_after);
        }
        // SIGKILL on Unix; a worker that already finished is simply reaped.
        child.kill().unwrap();
        read_events(&mut stdout, &mut events, |_, _| false);
        let status = child.wait().unwrap();
        kills += usize::from(!status.success());

        // The database is sound after the kill, and opens again.
        assert_eq!(db.integrity_check(), "ok", "round {round}");
        setup.reopen(setup.config());

        // Within a round the clock stands still, so a second grant of the
        // same task would be a second lease while the first is live.
        let mut granted = HashSet::new();
        for event in &events {
            let task = task_number(event.task());
            match event {
                Event::Grant { token, .. } => {
                    assert!(
                        granted.insert(task),
                        "task {task} leased twice in round {round}"
                    );
                    let previous = highest_token.insert(task, *token).unwrap_or(0);
                    assert!(
                        *token > previous,
                        "task {task}: token {token} after {previous}"
                    );
                    assert!(
                        !acked.contains_key(&task),
                        "a finished task {task} was granted"
                    );
                }
                Event::Ack { token, digest, .. } => {
                    let ack = (*token, digest.clone(), principal.clone());
                    assert!(acked.insert(task, ack).is_none(), "task {task} acked twice");
                }
                Event::Fail { .. } => panic!("this worker never fails a lease"),
            }
        }
        let acked_here: HashSet<usize> = events
            .iter()
            .filter(|event| matches!(event, Event::Ack { .. }))
            .map(|event| task_number(event.task()))
            .collect();
        for event in &events {
            if let Event::Grant { task, token } = event {
                if !acked_here.contains(&task_number(task)) {
                    let secret = key.secret.expose().to_owned();
                    orphans.push((secret, task_number(task), *token));
                }
            }
        }
        let touched: HashSet<usize> = events.iter().map(|e| task_number(e.task())).collect();
        check_store(&setup, &acked, &highest_token, touched, &reference);
        check_audited(&setup, key.info.principal, &events);
    }
    eprintln!(
        "{kills} of {rounds} workers killed; {} of {tasks} tasks acknowledged",
        acked.len()
    );

    // Whatever the workers left, the store finishes: lapsed leases are taken
    // over under new tokens, and finished tasks keep their receipts.
    setup.clock.set_utc(round_start(rounds));
    let finisher =
        setup.login(&setup.key(&[Scope::Claim, Scope::Read], Grant::Namespace(ns.clone())));
    while let ClaimOutcome::Granted(claimed) = setup.store.claim(&finisher, &ns, &q).unwrap() {
        let task = task_number(claimed.task.id.as_str());
        assert!(
            !acked.contains_key(&task),
            "a finished task {task} was granted"
        );
        let token = claimed.lease.token();
        assert!(token.as_i64() > highest_token.get(&task).copied().unwrap_or(0));
        let submitted = setup
            .store
            .submit(
                &finisher,
                &claimed.task,
                token,
                &IdempotencyKey::parse("final").unwrap(),
                &output_for(claimed.task.id.as_str(), token),
            )
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
    check_store(&setup, &acked, &highest_token, 0..tasks, &reference);
    // A killed worker's late submission, under the token its lease had,
    // is refused: its lease was taken over under a larger token.
    for (secret, task, token) in &orphans {
        let late = setup.login_secret(secret);
        let token = tessera_store::FencingToken::new(*token).unwrap();
        let refused = setup
            .store
            .submit(
                &late,
                &reference(*task),
                token,
                &IdempotencyKey::parse("late").unwrap(),
                &output_for(task_id(*task).as_str(), token),
            )
            .unwrap_err();
        assert_eq!(refused.status(), 409, "task {task}: {refused:?}");
    }
    eprintln!("{} late submissions refused", orphans.len());
    let health = setup.store.health(&setup.admin, &ns).unwrap();
    assert_eq!(health.attempts.done, tasks as u64, "{health:?}");
    assert_eq!(db.integrity_check(), "ok");
}

/// Of `tasks`: every acknowledged submission is stored as acknowledged,
/// and no token counter is behind a grant a worker reported.
fn check_store(
    setup: &Fixture<'_>,
    acked: &HashMap<usize, Ack>,
    highest_token: &HashMap<usize, i64>,
    tasks: impl IntoIterator<Item = usize>,
    reference: &impl Fn(usize) -> TaskRef,
) {
    for task in tasks {
        let view = setup
            .store
            .read_task(&setup.admin, &reference(task))
            .unwrap();
        let last = view.record.last_token.map_or(0, |t| t.as_i64());
        assert!(last >= highest_token.get(&task).copied().unwrap_or(0));
        let attempt = &view.record.attempts[0];
        if let Some(lease) = &attempt.lease {
            assert_eq!(
                lease.token.as_i64(),
                last,
                "the live lease is the latest grant"
            );
        }
        let Some((token, digest, principal)) = acked.get(&task) else {
            continue;
        };
        assert_eq!(attempt.state, TaskState::Done, "task {task}");
        let stored = setup
            .store
            .read_receipt(&setup.admin, &reference(task), AttemptNumber::FIRST)
            .unwrap();
        assert_eq!(stored.receipt.token.as_i64(), *token, "task {task}");
        assert_eq!(&stored.receipt.digest.to_string(), digest);
        assert_eq!(stored.receipt.principal.as_str(), principal);
    }
}

/// Every submission the worker had acknowledged has its audit row, in
/// the same commit as the submission.
fn check_audited(setup: &Fixture<'_>, principal: PrincipalId, events: &[Event]) {
    let page = setup
        .store
        .audit(
            &setup.admin,
            &AuditQuery {
                principal: Some(principal),
                limit: MAX_AUDIT_ROWS,
                ..AuditQuery::default()
            },
        )
        .unwrap();
    let submitted: HashSet<String> = page
        .events
        .iter()
        .filter(|event| event.action == Action::Submit)
        .filter_map(|event| event.resource.as_ref().map(|r| r.as_str().to_owned()))
        .collect();
    let acks = events.iter().filter_map(|event| match event {
        Event::Ack { task, token, .. } => Some((task, token)),
        _ => None,
    });
    for (task, token) in acks {
        let resource = format!("task:{task}@1/a1/t{token}");
        assert!(submitted.contains(&resource), "no audit row for {resource}");
    }
}

/// Rounds start two minutes apart: longer than a lease (60 s).
fn round_start(round: usize) -> DateTime<Utc> {
    noon() + TimeDelta::minutes(2 * i64::try_from(round).unwrap())
}

fn a_worker_killed_mid_work_loses_nothing(db: &TestDb) {
    crash_rounds(db, 3, 200, 150, 0);
}

/// Workers that claim ten at a time and submit each ten in one batch,
/// killed at random points, often between a batch's commit and the line
/// that reports it: every submission acknowledged is stored, no task is
/// leased twice at once, and what a killed batch had not acknowledged is
/// taken over under a new token.
fn a_worker_killed_mid_batch_loses_only_what_it_had_not_acknowledged(db: &TestDb) {
    crash_rounds(db, 4, 300, 200, 10);
}

fn workers_killed_at_random_points_round_after_round(db: &TestDb) {
    crash_rounds(db, 60, 8_000, 400, 0);
}

conformance! {
    a_worker_killed_mid_work_loses_nothing,
    a_worker_killed_mid_batch_loses_only_what_it_had_not_acknowledged,
    #[ignore = "long: run by .ci/run"]
    workers_killed_at_random_points_round_after_round,
}
