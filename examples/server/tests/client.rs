//! `tessera-client` against a real `tessera-server` process, on SQLite and
//! PostgreSQL: its routes and bodies against the server's table and
//! document, each call of both clients, and the remote `Worker` through a
//! kill of the server in the middle of a run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_client::store::{EmptyReason, Namespace, QueueName, Retry, TaskState, WaitOutcome};
use tessera_client::wire::{self, Verb};
use tessera_client::{
    AsyncClient, ClaimAnswer, Client, Error, NewTask, Worker, WorkerOptions, WorkerStats,
};

const NS: &str = "remote";

/// `tessera-server` on a port of its own, killed and started again on the
/// same port and storage.
struct Server {
    work: tempfile::TempDir,
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    fn sqlite() -> Self {
        let work = tempfile::tempdir().unwrap();
        let db = work.path().join("tessera.db").display().to_string();
        Self::with(work, vec!["--db".into(), db])
    }

    fn postgres(url: &str, schema: &str) -> Self {
        let args = ["--postgres", url, "--schema", schema];
        Self::with(
            tempfile::tempdir().unwrap(),
            args.map(String::from).to_vec(),
        )
    }

    fn with(work: tempfile::TempDir, args: Vec<String>) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self {
            work,
            port,
            args,
            child: None,
        };
        server.start();
        server
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.work.path().join("server.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-server"))
            .args(["--port", &self.port.to_string(), "--admin-key-file"])
            .arg(self.work.path().join("admin.key"))
            .args(&self.args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("tessera-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if ureq::get(format!("{}/healthz", self.base())).call().is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not start: {}", self.log());
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("server.log")).unwrap_or_default()
    }

    fn admin(&self) -> String {
        std::fs::read_to_string(self.work.path().join("admin.key"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// A key for `NS` with `scopes`.
    fn key(&self, scopes: &[&str]) -> String {
        let body = json!({ "account": "remote-worker", "scopes": scopes, "grants": [format!("namespace:{NS}")] });
        let mut reply = ureq::post(format!("{}/v1/keys", self.base()))
            .header("authorization", &format!("Bearer {}", self.admin()))
            .send_json(body)
            .expect("a key is issued");
        reply.body_mut().read_json::<Value>().unwrap()["key"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// An admin call: `PUT` of a queue's pause or resume.
    fn queue(&self, queue: &str, action: &str) {
        ureq::put(format!(
            "{}/v1/ns/{NS}/queues/{queue}/{action}",
            self.base()
        ))
        .header("authorization", &format!("Bearer {}", self.admin()))
        .send_empty()
        .expect("the queue changes");
    }

    /// `GET` as the admin.
    fn read(&self, path: &str) -> Value {
        ureq::get(format!("{}{path}", self.base()))
            .header("authorization", &format!("Bearer {}", self.admin()))
            .call()
            .expect("a read answers")
            .body_mut()
            .read_json()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ns() -> Namespace {
    Namespace::parse(NS).unwrap()
}

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).unwrap()
}

fn task(id: &str, brief: Value) -> NewTask {
    NewTask {
        id: Some(id.to_owned()),
        ..NewTask::new(brief)
    }
}

#[test]
fn every_client_route_is_the_servers_with_the_body_its_document_describes() {
    let routes = tessera_server::routes();
    let document = tessera_server::document();
    for endpoint in wire::ENDPOINTS {
        let route = routes.iter().find(|route| {
            route.path == endpoint.path && route.method.as_str() == endpoint.verb.as_str()
        });
        assert!(
            route.is_some(),
            "{} {} is not a server route",
            endpoint.verb.as_str(),
            endpoint.path
        );
        assert_eq!(
            endpoint.verb,
            Verb::Post,
            "the client's routes are all writes"
        );
    }
    // Each body the client sends, with every field set, names only
    // fields its route's document lists.
    let unique = wire::Unique {
        key: "k".into(),
        window_ms: Some(1),
        states: Some(vec!["ready".into()]),
        mode: Some("keep".into()),
        delay_ms: Some(1),
        max_delay_ms: Some(1),
    };
    let full_task = NewTask {
        id: Some("t".into()),
        version: Some(1),
        alternatives: Some(1),
        priority: Some(1),
        max_tries: Some(1),
        not_before: Some(chrono::Utc::now()),
        lease_ms: Some(1),
        deadline: Some(chrono::Utc::now()),
        timeout_ms: Some(1),
        partition_key: Some("p".into()),
        unique: Some(unique),
        ..NewTask::new(json!(1))
    };
    let bodies = [
        (wire::ENQUEUE, json!(full_task)),
        (
            wire::ENQUEUE_BATCH,
            json!(wire::NewTasks {
                tasks: vec![full_task.clone()]
            }),
        ),
        (wire::CLAIM_BATCH, json!(wire::ClaimCount { count: 1 })),
        (wire::WAIT, json!(wire::WaitTimeout { timeout_ms: 1 })),
        (
            wire::HEARTBEAT,
            json!(wire::Beat {
                version: 1,
                token: 1,
                progress: Some(json!(1))
            }),
        ),
        (
            wire::SUBMIT,
            json!(wire::Submission {
                version: 1,
                token: 1,
                output: json!(1)
            }),
        ),
        (
            wire::FAIL,
            json!(wire::FailureReport {
                version: 1,
                token: 1,
                retry: "after".into(),
                after_ms: Some(1),
                error: Some("e".into())
            }),
        ),
        (
            wire::SNOOZE,
            json!(wire::Snooze {
                version: 1,
                token: 1,
                delay_ms: 1
            }),
        ),
    ];
    for (endpoint, body) in bodies {
        let schema = &document["paths"][endpoint.path]["post"]["requestBody"]["content"]["application/json"]
            ["schema"];
        assert_described(endpoint.path, schema, &body);
    }
    // The answers' required fields are the ones the client reads.
    let required = |path: &str, status: &str| -> BTreeSet<String> {
        let schema = &document["paths"][path]["post"]["responses"][status]["content"]["application/json"]
            ["schema"];
        (schema["required"].as_array().unwrap().iter())
            .map(|name| name.as_str().unwrap().to_owned())
            .collect()
    };
    let claim_fields: BTreeSet<String> = ["task", "lease", "brief"].map(String::from).into();
    assert!(required(wire::CLAIM.path, "200").is_subset(&claim_fields));
    assert!(required(wire::HEARTBEAT.path, "200").contains("token"));
}

/// Every field of `body` is a property of `schema`, at any depth.
fn assert_described(path: &str, schema: &Value, body: &Value) {
    match body {
        Value::Object(fields) if schema.get("properties").is_some() => {
            for (name, value) in fields {
                let property = &schema["properties"][name];
                assert!(
                    !property.is_null(),
                    "{path}: the document has no field {name:?}"
                );
                assert_described(path, property, value);
            }
        }
        Value::Array(items) if schema.get("items").is_some() => {
            for item in items {
                assert_described(path, &schema["items"], item);
            }
        }
        _ => {}
    }
}

/// Each call of the blocking client, and what a hostile or unlucky caller
/// meets: a replay, a conflict, a stale lease, a paused queue, a key
/// without the scope.
fn blocking_calls(server: &Server) {
    let client = Client::new(&server.base(), &server.key(&["enqueue", "claim", "read"])).unwrap();
    let (ns, q) = (ns(), queue("calls"));
    let first = client
        .enqueue(&ns, &q, &task("c-1", json!({"n": 1})))
        .unwrap();
    assert!(first.created);
    let again = client.enqueue(&ns, &q, &task("c-1", json!({"n": 1})));
    assert!(
        matches!(again, Err(ref error) if error.is_conflict()),
        "{again:?}"
    );
    let batch = client
        .enqueue_batch(&ns, &q, &[task("c-2", json!(2)), task("c-3", json!(3))])
        .unwrap();
    assert_eq!(batch.len(), 2);

    let ClaimAnswer::Granted(claim) = client.claim(&ns, &q).unwrap() else {
        panic!("a ready task is granted")
    };
    assert_eq!(claim.task.id.as_str(), "c-1");
    assert_eq!(claim.brief_json(), Some(&json!({"n": 1})));
    let beaten = client
        .heartbeat(&claim.lease, Some(&json!({"half": true})))
        .unwrap();
    assert!(beaten.expires_at >= claim.lease.expires_at);
    let key = claim.lease.idempotency_key();
    let accepted = client
        .submit(&claim.lease, &json!({"ok": 1}), &key)
        .unwrap();
    assert!(!accepted.replayed);
    let replay = client
        .submit(&claim.lease, &json!({"ok": 1}), &key)
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(
        replay.receipt, accepted.receipt,
        "a replay answers the same receipt"
    );
    let other = client
        .submit(&claim.lease, &json!({"ok": 2}), &key)
        .unwrap_err();
    assert!(other.is_conflict(), "{other}");
    let stale = client.heartbeat(&claim.lease, None).unwrap_err();
    assert!(stale.is_lease_lost(), "{stale}");

    let ClaimAnswer::Granted(batch) = client.claim_batch(&ns, &q, 5).unwrap() else {
        panic!("two ready tasks are granted")
    };
    assert_eq!(batch.len(), 2);
    let state = client
        .fail(&batch[0].lease, Retry::Never, Some("gave up"))
        .unwrap();
    assert_eq!(state, TaskState::Failed);
    let state = client
        .snooze(&batch[1].lease, Duration::from_secs(600))
        .unwrap();
    assert!(matches!(state, TaskState::Backoff { .. }), "{state:?}");
    let ClaimAnswer::Empty {
        reason,
        retry_after,
    } = client.claim(&ns, &q).unwrap()
    else {
        panic!("nothing is claimable")
    };
    assert_eq!(reason, EmptyReason::Empty);
    assert!(retry_after > Duration::ZERO);
    let waited = client
        .wait_for_work(&ns, &q, Duration::from_millis(200))
        .unwrap();
    assert_eq!(waited, WaitOutcome::TimedOut);

    server.queue("calls", "pause");
    let ClaimAnswer::Empty { reason, .. } = client.claim(&ns, &q).unwrap() else {
        panic!("a paused queue grants nothing")
    };
    assert_eq!(reason, EmptyReason::Paused);
    server.queue("calls", "resume");

    // Hostile input is refused with the server's typed error, before or
    // at the server.
    let huge = client.enqueue(&ns, &q, &task("c-4", json!("x".repeat(2_000_000))));
    assert!(
        matches!(
            huge,
            Err(Error::Refused {
                status: 400 | 413,
                ..
            })
        ),
        "{huge:?}"
    );
    let bad_id = client
        .enqueue(&ns, &q, &task("no spaces/allowed", json!(1)))
        .unwrap_err();
    assert_eq!(bad_id.status(), Some(400), "{bad_id}");
    let reader = Client::new(&server.base(), &server.key(&["read"])).unwrap();
    let refused = reader.claim(&ns, &q).unwrap_err();
    assert_eq!(refused.status(), Some(403), "{refused}");
    assert!(!refused.is_transient());
    let nobody = Client::new(&server.base(), "tsk_not_a_key").unwrap();
    assert_eq!(nobody.claim(&ns, &q).unwrap_err().status(), Some(401));
}

/// The same calls, on tokio.
async fn async_calls(server: &Server) {
    let client = AsyncClient::new(&server.base(), &server.key(&["enqueue", "claim"])).unwrap();
    let (ns, q) = (ns(), queue("async-calls"));
    client
        .enqueue(&ns, &q, &task("a-1", json!(1)))
        .await
        .unwrap();
    let ClaimAnswer::Granted(claim) = client.claim(&ns, &q).await.unwrap() else {
        panic!("granted")
    };
    client.heartbeat(&claim.lease, None).await.unwrap();
    let key = claim.lease.idempotency_key();
    let accepted = client.submit(&claim.lease, &json!(7), &key).await.unwrap();
    let replay = client.submit(&claim.lease, &json!(7), &key).await.unwrap();
    assert!(replay.replayed && replay.receipt == accepted.receipt);
    client
        .enqueue_batch(&ns, &q, &[task("a-2", json!(2))])
        .await
        .unwrap();
    let ClaimAnswer::Granted(batch) = client.claim_batch(&ns, &q, 3).await.unwrap() else {
        panic!("granted")
    };
    let state = client
        .fail(&batch[0].lease, Retry::Backoff, None)
        .await
        .unwrap();
    assert!(matches!(state, TaskState::Backoff { .. }), "{state:?}");
    let woken = client
        .wait_for_work(&ns, &q, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(
        woken,
        WaitOutcome::TimedOut,
        "the failed task waits out its backoff"
    );
    let snoozed = client
        .snooze(&claim.lease, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(snoozed.is_lease_lost(), "{snoozed}");
    // No server at all: a transport error, transient.
    let down = AsyncClient::new("http://127.0.0.1:9", "k").unwrap();
    let error = down.claim(&ns, &q).await.unwrap_err();
    assert!(
        matches!(error, Error::Transport { .. }) && error.is_transient(),
        "{error}"
    );
}

#[test]
fn each_call_of_both_clients_on_sqlite() {
    let server = Server::sqlite();
    blocking_calls(&server);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async_calls(&server));
}

#[test]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn each_call_of_both_clients_on_postgres() {
    on_postgres("calls", |server| {
        blocking_calls(server);
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async_calls(server));
    });
}

fn on_postgres(name: &str, run: impl FnOnce(&mut Server)) {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL").unwrap();
    let schema = format!("client_{name}_{}", std::process::id());
    let mut server = Server::postgres(&url, &schema);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut server)));
    drop(server);
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// `tasks` tasks through a `Worker` of 8 threads, then `tasks` more
/// through an `AsyncWorker` of 8 tasks, each while the server is killed
/// and started again when about half are done: each task is done once in
/// the store, with one accepted attempt, and no submission the server
/// accepted is accepted twice.
fn through_a_restart(server: &mut Server, tasks: usize) {
    let key = server.key(&["enqueue", "claim", "read"]);
    for threads in [true, false] {
        let name = if threads {
            "restart-threads"
        } else {
            "restart-tasks"
        };
        let client = Client::new(&server.base(), &key).unwrap();
        let all: Vec<NewTask> = (0..tasks)
            .map(|n| NewTask {
                // Short, so a grant whose answer the kill lost lapses
                // soon; the heartbeats keep the others.
                lease_ms: Some(4_000),
                ..task(&format!("{name}-{n}"), json!({ "n": n }))
            })
            .collect();
        for chunk in all.chunks(1000) {
            client.enqueue_batch(&ns(), &queue(name), chunk).unwrap();
        }
        let handled = Mutex::new(BTreeMap::<String, u32>::new());
        let handle = |claim: &tessera_client::Claim| {
            *handled
                .lock()
                .unwrap()
                .entry(claim.task.id.to_string())
                .or_default() += 1;
            let n = claim
                .brief_json()
                .and_then(|brief| brief["n"].as_u64())
                .unwrap();
            json!({ "n": n, "squared": n * n })
        };
        let options = WorkerOptions {
            wait: Duration::from_millis(500),
            ..WorkerOptions::default()
        };
        let stats = if threads {
            let worker = Worker::new(client, NS, name, |claim| Ok(handle(claim)))
                .unwrap()
                .with_options(options);
            restart_midway(
                server,
                tasks,
                || worker.stats(),
                || worker.stopper(),
                || worker.run(8),
            )
        } else {
            let client = AsyncClient::new(&server.base(), &key).unwrap();
            let worker = tessera_client::AsyncWorker::new(client, NS, name, |claim| {
                let output = handle(&claim);
                async move { Ok(output) }
            })
            .unwrap()
            .with_options(options);
            restart_midway(
                server,
                tasks,
                || worker.stats(),
                || worker.stopper(),
                || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(worker.run(8))
                },
            )
        };
        let in_namespace = if threads { tasks } else { 2 * tasks };
        let handled = handled.into_inner().unwrap();
        check_run(server, (name, tasks, in_namespace), stats, handled);
    }
}

/// Runs a worker loop (`run`) until half of `tasks` are done, kills the
/// server and starts it again, and stops the loop once all are done.
fn restart_midway(
    server: &mut Server,
    tasks: usize,
    stats: impl Fn() -> WorkerStats,
    stopper: impl Fn() -> tessera_client::Stopper,
    run: impl FnOnce() -> Result<WorkerStats, Error> + Send,
) -> WorkerStats {
    std::thread::scope(|scope| {
        let running = scope.spawn(run);
        let deadline = Instant::now() + Duration::from_secs(600);
        while stats().done < (tasks / 2) as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let at = stats().done;
        server.kill();
        std::thread::sleep(Duration::from_millis(300));
        server.start();
        eprintln!("killed at {at} of {tasks} done, started again");
        while stats().done < tasks as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        stopper().stop();
        running
            .join()
            .unwrap()
            .expect("the worker runs to its stop")
    })
}

/// The checks of one run of `tasks` tasks in the queue `name`: each task
/// done once in the store, with one accepted attempt, and the namespace's
/// attempts `in_namespace`, every one done.
fn check_run(
    server: &Server,
    (name, tasks, in_namespace): (&str, usize, usize),
    stats: WorkerStats,
    handled: BTreeMap<String, u32>,
) {
    eprintln!("{stats:?}");
    assert_eq!(
        stats.done, tasks as u64,
        "every task's submission landed once: {stats:?}"
    );
    assert_eq!(stats.abandoned, 0);
    assert_eq!(handled.len(), tasks, "every task was handled");
    let twice = handled.values().filter(|&&runs| runs > 1).count() as u64;
    assert!(
        twice <= stats.lost,
        "a task runs again only after its lease was lost"
    );

    let health = server.read(&format!("/v1/ns/{NS}/health"));
    assert_eq!(health["attempts"]["done"], json!(in_namespace), "{health}");
    // Every attempt in the namespace is done, one per task: none doubled,
    // none left ready, leased or failed.
    for (state, count) in health["attempts"].as_object().unwrap() {
        if state != "done" {
            assert_eq!(count, &json!(0), "{state}: {health}");
        }
    }
    // A sample of tasks read back: one attempt each, done.
    for n in (0..tasks).step_by((tasks / 40).max(1)) {
        let view = server.read(&format!("/v1/ns/{NS}/tasks/{name}-{n}"));
        let attempts = view["record"]["attempts"].as_array().unwrap();
        let states: Vec<&Value> = attempts
            .iter()
            .map(|attempt| &attempt["state"]["state"])
            .collect();
        assert_eq!(states, [&json!("done")], "{name}-{n}: {view}");
    }
}

#[test]
fn a_remote_worker_loses_nothing_when_the_server_is_killed_on_sqlite() {
    through_a_restart(&mut Server::sqlite(), 400);
}

#[test]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn a_remote_worker_loses_nothing_when_the_server_is_killed_on_postgres() {
    on_postgres("restart", |server| through_a_restart(server, 400));
}

/// The full run: 10,000 tasks from 8 threads through a kill.
#[test]
#[ignore = "long: 10,000 tasks; run with --ignored in release"]
fn ten_thousand_tasks_through_a_kill_on_sqlite() {
    through_a_restart(&mut Server::sqlite(), 10_000);
}

/// The same on PostgreSQL.
#[test]
#[ignore = "long: 10,000 tasks; run with --ignored in release"]
fn ten_thousand_tasks_through_a_kill_on_postgres() {
    if std::env::var_os("TESSERA_TEST_POSTGRES_URL").is_none() {
        eprintln!("TESSERA_TEST_POSTGRES_URL is not set");
        return;
    }
    on_postgres("restart_long", |server| through_a_restart(server, 10_000));
}

#[test]
fn handlers_that_misbehave_end_their_tasks_once_and_the_loop_goes_on() {
    let server = Server::sqlite();
    let client = Client::new(&server.base(), &server.key(&["enqueue", "claim", "read"])).unwrap();
    let (ns, slow) = (ns(), queue("slow"));
    let mut long = task("slow-1", json!({}));
    long.lease_ms = Some(1500);
    client.enqueue(&ns, &slow, &long).unwrap();
    let options = WorkerOptions {
        wait: Duration::from_millis(300),
        ..WorkerOptions::default()
    };
    // Three lease lengths long: only heartbeats keep the lease.
    let runs = AtomicU64::new(0);
    let worker = Worker::new(client.clone(), NS, "slow", |_| {
        runs.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(4500));
        Ok(json!({"slow": true}))
    })
    .unwrap()
    .with_options(options.clone());
    let stats = run_until(&worker, 2, |stats| stats.done >= 1);
    assert_eq!(
        (stats.done, stats.lost, runs.load(Ordering::Relaxed)),
        (1, 0, 1),
        "{stats:?}"
    );

    // Stopped while a handler two lease lengths long runs: the handler
    // is heartbeated to its end and its output lands.
    let mut held = task("slow-2", json!({}));
    held.lease_ms = Some(1500);
    client.enqueue(&ns, &slow, &held).unwrap();
    let worker = Worker::new(client.clone(), NS, "slow", |_| {
        std::thread::sleep(Duration::from_millis(3000));
        Ok(json!({"slow": true}))
    })
    .unwrap()
    .with_options(options.clone());
    let stopper = worker.stopper();
    let stats = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            stopper.stop();
        });
        worker.run(1).unwrap()
    });
    assert_eq!(
        (stats.done, stats.lost, stats.abandoned),
        (1, 0, 0),
        "{stats:?}"
    );

    let odd = queue("odd");
    let kinds = ["raises", "panics", "too large", "fine"];
    for (n, kind) in kinds.iter().enumerate() {
        let mut once = task(&format!("odd-{n}"), json!({ "kind": kind }));
        once.max_tries = Some(1);
        client.enqueue(&ns, &odd, &once).unwrap();
    }
    let worker = Worker::new(client.clone(), NS, "odd", |claim| {
        let kind = claim.brief_json().map(|brief| brief["kind"].clone());
        match kind.as_ref().and_then(Value::as_str) {
            Some("raises") => Err("clé\nwith\ta newline".into()),
            Some("panics") => panic!("a handler's bug"),
            Some("too large") => Ok(json!("x".repeat(8 << 20))),
            _ => Ok(json!({"ok": true})),
        }
    })
    .unwrap()
    .with_options(options.clone());
    // One thread: a panic does not end it, and the tasks after it run.
    let stats = run_until(&worker, 1, |stats| stats.failed + stats.done >= 4);
    assert_eq!(
        (stats.failed, stats.done, stats.lost),
        (3, 1, 0),
        "{stats:?}"
    );
    let last_error = |n: usize| {
        let view = server.read(&format!("/v1/ns/{NS}/tasks/odd-{n}"));
        let attempt = &view["record"]["attempts"][0];
        let state = attempt["state"]["state"].as_str().unwrap_or_default();
        assert!(["failed", "discarded"].contains(&state), "{view}");
        attempt["last_error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(last_error(0).contains("cl\\u{e9}\\nwith\\ta newline"));
    assert!(last_error(1).contains("the handler panicked: a handler's bug"));
    assert!(last_error(2).contains("the server refused the output"));

    // The same on tokio: a panicking async handler fails its task.
    let mut once = task("async-panic", json!({}));
    once.max_tries = Some(1);
    client.enqueue(&ns, &queue("async-odd"), &once).unwrap();
    let async_client = AsyncClient::new(&server.base(), &server.key(&["claim"])).unwrap();
    let worker = tessera_client::AsyncWorker::new(async_client, NS, "async-odd", |_| async {
        panic!("an async handler's bug");
    })
    .unwrap()
    .with_options(options.clone());
    let stopper = worker.stopper();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stats = runtime.block_on(async {
        let watch = async {
            while worker.stats().failed < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stopper.stop();
        };
        let (stats, ()) = tokio::join!(worker.run(2), watch);
        stats.unwrap()
    });
    assert_eq!((stats.failed, stats.done), (1, 0), "{stats:?}");
    let view = server.read(&format!("/v1/ns/{NS}/tasks/async-panic"));
    let error = view["record"]["attempts"][0]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("the handler panicked: an async handler's bug"),
        "{view}"
    );

    // A paused queue is waited out for its Retry-After, not polled.
    client
        .enqueue(&ns, &queue("held"), &task("held-1", json!({})))
        .unwrap();
    server.queue("held", "pause");
    let worker = Worker::new(client.clone(), NS, "held", |_| Ok(json!({})))
        .unwrap()
        .with_options(options);
    let stopper = worker.stopper();
    let stats = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_secs(2));
            stopper.stop();
        });
        worker.run(2).unwrap()
    });
    assert_eq!(stats.done, 0);
    // Each thread claims once a `wait` (0.3 s): not a spin.
    assert!(stats.empty <= 20, "a paused queue is not polled: {stats:?}");

    // A key that may not claim stops every thread, and run says why.
    let reader = Client::new(&server.base(), &server.key(&["read"])).unwrap();
    let worker = Worker::new(reader, NS, "held", |_| Ok(json!({}))).unwrap();
    let refused = worker.run(4).unwrap_err();
    assert_eq!(refused.status(), Some(403), "{refused}");
    assert!(Worker::new(client, "bad ns!", "q", |_| Ok(json!({}))).is_err());
}

/// Runs `worker` on `threads` until `enough` holds of its stats, then
/// stops it.
fn run_until<H>(
    worker: &Worker<H>,
    threads: usize,
    enough: impl Fn(&WorkerStats) -> bool,
) -> WorkerStats
where
    H: Fn(&tessera_client::Claim) -> Result<Value, tessera_client::HandlerError> + Sync,
{
    std::thread::scope(|scope| {
        let running = scope.spawn(|| worker.run(threads));
        let deadline = Instant::now() + Duration::from_secs(120);
        while !enough(&worker.stats()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        worker.stopper().stop();
        running.join().unwrap().unwrap()
    })
}

/// A proxy in front of the server that passes each request on and, for
/// the first `drops` submissions, drops the server's answer: the
/// submission landed, and the worker does not know it.
struct LossyProxy {
    port: u16,
    submissions: std::sync::Arc<AtomicU64>,
}

impl LossyProxy {
    fn start(server_port: u16, drops: u64) -> Self {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let submissions = std::sync::Arc::new(AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&submissions);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let counter = std::sync::Arc::clone(&counter);
                std::thread::spawn(move || {
                    // One request per connection: read its head and body.
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 8192];
                    let head_end = loop {
                        let Ok(read) = client.read(&mut buffer) else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
                    let length: usize = (head.lines())
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .map_or(0, |value| value.trim().parse().unwrap());
                    while request.len() < head_end + length {
                        let Ok(read) = client.read(&mut buffer) else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                    }
                    // Passed on with `Connection: close`, so the answer
                    // ends at the end of the stream.
                    let mut upstream =
                        std::net::TcpStream::connect(("127.0.0.1", server_port)).unwrap();
                    let first_line_end = request.windows(2).position(|w| w == b"\r\n").unwrap();
                    upstream.write_all(&request[..first_line_end + 2]).unwrap();
                    upstream.write_all(b"connection: close\r\n").unwrap();
                    upstream.write_all(&request[first_line_end + 2..]).unwrap();
                    let mut answer = Vec::new();
                    let _ = upstream.read_to_end(&mut answer);
                    let submission = head
                        .lines()
                        .next()
                        .is_some_and(|line| line.contains("/submit "));
                    if submission && counter.fetch_add(1, Ordering::SeqCst) < drops {
                        return; // the answer is lost
                    }
                    let _ = client.write_all(&answer);
                });
            }
        });
        Self { port, submissions }
    }
}

#[test]
fn a_submission_whose_answer_was_lost_is_retried_under_its_key_and_lands_once() {
    let server = Server::sqlite();
    let key = server.key(&["enqueue", "claim", "read"]);
    let direct = Client::new(&server.base(), &key).unwrap();
    let tasks: Vec<NewTask> = (0..20)
        .map(|n| task(&format!("lossy-{n}"), json!(n)))
        .collect();
    direct
        .enqueue_batch(&ns(), &queue("lossy"), &tasks)
        .unwrap();
    let proxy = LossyProxy::start(server.port, 10);
    let client = Client::new(&format!("http://127.0.0.1:{}", proxy.port), &key).unwrap();
    let runs = Mutex::new(BTreeMap::<String, u32>::new());
    let worker = Worker::new(client, NS, "lossy", |claim| {
        *runs
            .lock()
            .unwrap()
            .entry(claim.task.id.to_string())
            .or_default() += 1;
        Ok(json!({ "n": claim.brief_json() }))
    })
    .unwrap()
    .with_options(WorkerOptions {
        wait: Duration::from_millis(300),
        ..WorkerOptions::default()
    });
    let stats = run_until(&worker, 4, |stats| stats.done >= 20);
    assert!(
        proxy.submissions.load(Ordering::SeqCst) >= 30,
        "ten answers were dropped, and their submissions made again"
    );
    assert_eq!((stats.done, stats.lost), (20, 0), "{stats:?}");
    let runs = runs.into_inner().unwrap();
    assert!(
        runs.values().all(|&count| count == 1),
        "each handler ran once: {runs:?}"
    );
    for n in 0..20 {
        let view = server.read(&format!("/v1/ns/{NS}/tasks/lossy-{n}"));
        let attempts = view["record"]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{view}");
        assert_eq!(attempts[0]["state"]["state"], "done", "{view}");
    }
}
