//! The PostgreSQL server stopped (`pg_ctlcluster … stop -m immediate`) and
//! started again while a worker runs: the store answers storage errors
//! while it is down, recovers by itself, and loses no acknowledged
//! submission.
//!
//! It stops the server everything else uses, so it is a test binary of its
//! own (cargo runs binaries one after another) and runs only where
//! `TESSERA_TEST_POSTGRES_CLUSTER` names the cluster (`15 main`) as well as
//! `TESSERA_TEST_POSTGRES_URL` the server; elsewhere it is marked ignored.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

#[path = "harness/mod.rs"]
mod harness;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use tessera_store::{
    BriefVersion, ClaimOutcome, Grant, IdempotencyKey, Output, Scope, Submitted, TaskRef,
};

use harness::{BackendKind, Fixture, namespace, queue, task_id, task_number};

fn cluster(action: &str, cluster: &str) {
    let mut words = cluster.split_whitespace();
    let (version, name) = (words.next().unwrap(), words.next().unwrap());
    let mut command = Command::new("pg_ctlcluster");
    command.args([version, name, action]);
    if action == "stop" {
        command.args(["-m", "immediate"]);
    }
    let status = command.status().unwrap();
    assert!(status.success(), "pg_ctlcluster {cluster} {action}");
}

#[test]
#[cfg_attr(
    any(tessera_no_test_postgres, tessera_no_test_postgres_cluster),
    ignore = "stops and starts a PostgreSQL cluster: set TESSERA_TEST_POSTGRES_URL and TESSERA_TEST_POSTGRES_CLUSTER"
)]
fn a_server_restart_mid_run_is_storage_errors_then_recovery_and_loses_no_acknowledged_submission() {
    let name = std::env::var("TESSERA_TEST_POSTGRES_CLUSTER")
        .expect("TESSERA_TEST_POSTGRES_CLUSTER names the cluster to stop and start");
    let db = BackendKind::Postgres.database();
    const TASKS: usize = 300;
    let f = Fixture::new(&db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let worker = f.login(&f.key(
        &[Scope::Enqueue, Scope::Claim, Scope::Read],
        Grant::Namespace(ns.clone()),
    ));
    f.enqueue_range(&worker, &ns, &q, 0, TASKS);

    let mut acked: BTreeMap<usize, (i64, String)> = BTreeMap::new();
    let mut while_down = Vec::new();
    let mut restarted = false;
    let began = Instant::now();
    loop {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the store did not recover"
        );
        if !restarted && acked.len() == TASKS / 3 {
            // Started again however this test ends, so a failure here does
            // not leave the server down for the tests after it.
            struct StartAgain<'a>(&'a str, bool);
            impl Drop for StartAgain<'_> {
                fn drop(&mut self) {
                    if !self.1 {
                        cluster("start", self.0);
                    }
                }
            }
            let mut guard = StartAgain(&name, false);
            cluster("stop", &name);
            // Down: every operation is a storage error, none a hang.
            for _ in 0..3 {
                let error = f.store.claim(&worker, &ns, &q).unwrap_err();
                assert_eq!(error.code(), "storage_error", "{error:?}");
                assert!(error.is_retryable(), "{error:?}");
                while_down.push(error);
            }
            cluster("start", &name);
            guard.1 = true;
            restarted = true;
        }
        let claimed = match f.store.claim(&worker, &ns, &q) {
            Ok(ClaimOutcome::Granted(claimed)) => claimed,
            Ok(ClaimOutcome::Empty { .. }) => {
                let done = f.store.health(&worker, &ns).unwrap().attempts.done;
                if done == TASKS as u64 {
                    break;
                }
                // A lease whose submission failed with the server: let it
                // lapse, to be taken over.
                f.clock.advance(Duration::from_secs(61));
                continue;
            }
            // The first operations after the restart may still meet a
            // connection the server dropped; they are retryable.
            Err(error) => {
                assert!(error.is_retryable(), "{error:?}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let token = claimed.lease.token();
        let key = IdempotencyKey::parse(&format!("k{token}")).unwrap();
        let output = Output::bytes(format!("{} under {token}", claimed.task.id));
        match f.store.submit(&worker, &claimed.task, token, &key, &output) {
            Ok(Submitted::Accepted(receipt)) => {
                let task = task_number(claimed.task.id.as_str());
                acked.insert(task, (token.as_i64(), receipt.digest.to_string()));
            }
            Ok(Submitted::Replayed(_)) => panic!("a fresh key is accepted"),
            Err(error) => assert!(error.is_retryable(), "{error:?}"),
        }
    }
    assert!(restarted && while_down.len() == 3);
    // Every task done once; a submission whose answer the restart lost may
    // have landed unacknowledged, so acknowledged ones are at most all.
    let health = f.store.health(&worker, &ns).unwrap();
    assert_eq!(health.attempts.done, TASKS as u64, "{health:?}");
    assert!(acked.len() <= TASKS && acked.len() >= TASKS / 3);
    // Every acknowledged submission is there, as acknowledged.
    let reader = f.login(&f.key(&[Scope::Read], Grant::Namespace(ns.clone())));
    for (task, (token, digest)) in &acked {
        let reference = TaskRef::new(ns.clone(), task_id(*task), BriefVersion::FIRST);
        let receipts = f.store.alternatives(&reader, &reference).unwrap();
        assert_eq!(receipts.len(), 1, "task {task}");
        assert_eq!(receipts[0].receipt.token.as_i64(), *token);
        assert_eq!(&receipts[0].receipt.digest.to_string(), digest);
    }
}
