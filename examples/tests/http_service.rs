//! The `http_service` example on a real loopback port, driven by a small
//! blocking HTTP/1.1 client. Time is a `ManualClock`: nothing sleeps to let
//! time pass.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_store::{
    AdmissionConfig, ClaimPermit, ClaimStart, ManualClock, Namespace, QueueName, Store, StoreConfig,
};

#[allow(dead_code)]
#[path = "../examples/http_service.rs"]
mod http_service;

/// The service on a loopback port, over an in-memory store.
struct Service {
    address: SocketAddr,
    store: Arc<Store>,
    clock: ManualClock,
    admin: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    _runtime: tokio::runtime::Runtime,
}

impl Service {
    fn start(admission: AdmissionConfig, at: &str) -> Self {
        let clock = ManualClock::new(at.parse().expect("an RFC 3339 time"));
        let config = StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_admission(admission);
        http_service::prometheus();
        let store = Arc::new(Store::open_in_memory(config).expect("store opens"));
        let admin = store.create_admin_key("operators").expect("admin key");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .expect("loopback port");
        let address = listener.local_addr().expect("bound address");
        let (shutdown, signal) = tokio::sync::oneshot::channel();
        let signal = async move {
            let _ = signal.await;
        };
        runtime.spawn(http_service::serve_until(
            listener,
            Arc::clone(&store),
            signal,
        ));
        Self {
            address,
            store,
            clock,
            admin: admin.secret.expose().to_owned(),
            shutdown: Some(shutdown),
            _runtime: runtime,
        }
    }

    /// Signals the service to shut down, as SIGTERM does.
    fn shut_down(&mut self) {
        let _ = self.shutdown.take().expect("running").send(());
    }

    /// A keyed worker with every scope in `namespace`, made over HTTP.
    fn worker(&self, namespace: &str) -> String {
        let body = json!({
            "account": "acme",
            "scopes": ["enqueue", "claim", "read"],
            "grants": [format!("namespace:{namespace}")],
        });
        let reply = self.send("POST", "/v1/keys", Some(&self.admin), &[], Some(&body));
        assert_eq!(reply.status, 201, "{}", reply.text());
        reply.json()["key"].as_str().expect("a key").to_owned()
    }

    /// Takes the whole admission window (4) for `key`'s principal straight
    /// from the store, so that claims over HTTP have to wait; dropping the
    /// permits hands it back.
    fn hold_window(&self, key: &str) -> Vec<ClaimPermit> {
        let caller = self.store.authenticate(Some(key)).unwrap();
        let namespace = Namespace::parse("renders").unwrap();
        let queue = QueueName::parse("frames").unwrap();
        (0..4)
            .map(
                |_| match self.store.begin_claim(&caller, &namespace, &queue) {
                    Ok(ClaimStart::Admitted(permit)) => permit,
                    other => panic!("the window is free: {other:?}"),
                },
            )
            .collect()
    }

    /// Waits (bounded) until `pending` claims wait for admission.
    fn until_pending(&self, pending: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.store.claim_stats().pending != pending {
            assert!(Instant::now() < deadline, "{:?}", self.store.claim_stats());
            std::thread::yield_now();
        }
    }

    fn enqueue(&self, key: &str, path: &str, brief: Value) -> Reply {
        let body = json!({ "brief": brief });
        self.send("POST", path, Some(key), &[], Some(&body))
    }

    fn claim(&self, key: &str, path: &str) -> Reply {
        self.send("POST", path, Some(key), &[], None)
    }

    /// One request on its own connection, read to the end.
    fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Reply {
        send(self.address, method, path, key, headers, body)
    }
}

/// One request to `address` on its own connection, read to the end.
fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(key) = key {
        request.push_str(&format!("authorization: Bearer {key}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    let mut stream = TcpStream::connect(address).expect("connects");
    // Bounds the test if the service never answers.
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("request sent");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("response read");
    Reply::parse(&raw)
}

/// A response: status, headers (names lowercase) and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn parse(raw: &[u8]) -> Self {
        let split = raw
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .expect("a complete head");
        let head = std::str::from_utf8(&raw[..split]).expect("an ASCII head");
        let mut lines = head.split("\r\n");
        let status = lines.next().expect("a status line")[9..12]
            .parse()
            .expect("a status code");
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
            .collect();
        assert!(
            !headers.iter().any(|(name, _)| name == "transfer-encoding"),
            "the service answers with a length"
        );
        Self {
            status,
            headers,
            body: raw[split + 4..].to_vec(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .expect("an error body")
            .to_owned()
    }
}

const START: &str = "2026-10-29T12:00:00Z";
const TASKS: &str = "/v1/ns/renders/queues/frames/tasks";
const CLAIMS: &str = "/v1/ns/renders/queues/frames/claims";

fn small_window() -> AdmissionConfig {
    AdmissionConfig {
        initial_concurrency: 4,
        ..AdmissionConfig::default()
    }
}

#[test]
fn a_burst_beyond_the_concurrency_limit_waits_for_leases_instead_of_429() {
    const BURST: usize = 100;
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    for frame in 0..BURST {
        let reply = service.enqueue(&worker, TASKS, json!({ "frame": frame }));
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    let held = service.hold_window(&worker);

    let replies = std::thread::scope(|scope| {
        let claims: Vec<_> = (0..BURST)
            .map(|_| scope.spawn(|| service.claim(&worker, CLAIMS)))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while service.store.claim_stats().pending < BURST {
            assert!(
                Instant::now() < deadline,
                "{:?}",
                service.store.claim_stats()
            );
            std::thread::yield_now();
        }
        service.clock.advance(Duration::from_millis(100));
        // Handing the window back lets the driver grant the parked claims.
        drop(held);
        claims
            .into_iter()
            .map(|claim| claim.join().expect("client thread"))
            .collect::<Vec<_>>()
    });

    let mut tasks = std::collections::BTreeSet::new();
    for reply in &replies {
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("x-claim-wait-ms"), Some("100"));
        assert_eq!(reply.header("x-claim-concurrency"), Some("4"));
        let body = reply.json();
        assert_eq!(body["lease"]["token"], 1);
        tasks.insert(body["task"]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(tasks.len(), BURST, "no task leased twice");
    let stats = service.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));

    let health = service.send("GET", "/v1/ns/renders/health", Some(&worker), &[], None);
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["attempts"]["leased"], 100);
    assert_eq!(health.json()["attempts"]["ready"], 0);
}

#[test]
fn empty_claims_pace_from_5_to_60_seconds_and_a_grant_starts_again() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    for expected in ["5", "10", "20", "40", "60", "60"] {
        let reply = service.claim(&worker, CLAIMS);
        assert_eq!(reply.status, 204);
        assert_eq!(reply.header("retry-after"), Some(expected));
        assert!(reply.body.is_empty());
    }
    assert_eq!(service.enqueue(&worker, TASKS, json!("one")).status, 201);
    assert_eq!(service.claim(&worker, CLAIMS).status, 200);
    let reply = service.claim(&worker, CLAIMS);
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("retry-after"), Some("5"));
}

#[test]
fn overload_is_429_with_retry_after() {
    let legacy_quota = AdmissionConfig {
        claims_per_minute: 1,
        ..AdmissionConfig::default()
    };
    let service = Service::start(legacy_quota, START);
    let worker = service.worker("renders");
    assert_eq!(service.claim(&worker, CLAIMS).status, 204);
    let reply = service.claim(&worker, CLAIMS);
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.error_code(), "rate_limited");
    let retry_after = reply.header("retry-after").expect("a Retry-After");
    assert_eq!(
        reply.json()["error"]["retry_after"].to_string(),
        retry_after
    );
    assert!(retry_after.parse::<u64>().unwrap() >= 1);
}

#[test]
fn heartbeat_extends_and_submit_is_idempotent() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let body = json!({ "brief": { "frame": 7 }, "id": "frame-7", "version": 2 });
    let reply = service.send("POST", TASKS, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!({ "namespace": "renders", "id": "frame-7", "version": 2 })
    );

    let claimed = service.claim(&worker, CLAIMS).json();
    assert_eq!(claimed["brief"]["value"], json!({ "frame": 7 }));
    assert_eq!(claimed["lease"]["expires_at"], "2026-10-29T12:01:00Z");
    // Where the worker writes its output; the receipt names the same key.
    assert_eq!(claimed["lease"]["artifact"], "frame-7.a1.t1");
    let token = claimed["lease"]["token"].as_i64().unwrap();
    let lease = json!({ "version": 2, "token": token });

    service.clock.advance(Duration::from_secs(30));
    let heartbeat = "/v1/ns/renders/tasks/frame-7/heartbeat";
    let reply = service.send("POST", heartbeat, Some(&worker), &[], Some(&lease));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["expires_at"], "2026-10-29T12:01:30Z");

    let submit = "/v1/ns/renders/tasks/frame-7/submit";
    let output = json!({ "version": 2, "token": token, "output": { "pixels": 42 } });
    let key = [("idempotency-key", "frame-7-result")];
    let first = service.send("POST", submit, Some(&worker), &key, Some(&output));
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = service.send("POST", submit, Some(&worker), &key, Some(&output));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json(), first.json(), "the same receipt");
    assert_eq!(first.json()["token"], token);
    assert_eq!(first.json()["artifact"], claimed["lease"]["artifact"]);

    let other = json!({ "version": 2, "token": token, "output": { "pixels": 43 } });
    let conflict = service.send("POST", submit, Some(&worker), &key, Some(&other));
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.error_code(), "idempotency_conflict");

    let unkeyed = service.send("POST", submit, Some(&worker), &[], Some(&output));
    assert_eq!(unkeyed.status, 400);
    assert_eq!(unkeyed.error_code(), "invalid_input");

    let late = service.send("POST", heartbeat, Some(&worker), &[], Some(&lease));
    assert_eq!(late.status, 409, "the lease ended with the submission");
}

#[test]
fn keys_are_checked_before_any_namespace() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");

    let missing = service.send("POST", CLAIMS, None, &[], None);
    assert_eq!(missing.status, 401);
    assert_eq!(missing.error_code(), "unauthorized");
    let unknown = service.claim("tsk_0123456789abcdef_nope", CLAIMS);
    assert_eq!(unknown.status, 401);
    let not_bearer = service.send(
        "POST",
        CLAIMS,
        None,
        &[("authorization", worker.as_str())],
        None,
    );
    assert_eq!(not_bearer.status, 401);

    let elsewhere = service.claim(&worker, "/v1/ns/billing/queues/invoices/claims");
    assert_eq!(elsewhere.status, 403);
    assert_eq!(elsewhere.error_code(), "forbidden");
    let health = service.send("GET", "/v1/ns/billing/health", Some(&worker), &[], None);
    assert_eq!(health.status, 403);
    let anonymous_health = service.send("GET", "/v1/ns/renders/health", None, &[], None);
    assert_eq!(anonymous_health.status, 401, "renders is not public");
    let key = json!({ "account": "mallory", "admin": true });
    let not_admin = service.send("POST", "/v1/keys", Some(&worker), &[], Some(&key));
    assert_eq!(not_admin.status, 403);

    let malformed = service.send("POST", TASKS, Some(&worker), &[], None);
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.error_code(), "invalid_input");
    let nowhere = service.send("GET", "/v1/nothing", Some(&worker), &[], None);
    assert_eq!(nowhere.status, 404);
    assert_eq!(nowhere.error_code(), "not_found");

    // The denials are counted, and the worker reads its own counters.
    let audit = service.send("GET", "/v1/me/audit", Some(&worker), &[], None);
    assert_eq!(audit.status, 200, "{}", audit.text());
    let counters = audit.json()["counters"].to_string();
    assert!(counters.contains("forbidden"), "{counters}");
}

#[test]
fn refused_writes_are_503_until_midnight_while_health_answers() {
    let service = Service::start(AdmissionConfig::default(), "2026-10-29T23:59:30Z");
    let worker = service.worker("renders");
    assert_eq!(service.enqueue(&worker, TASKS, json!(1)).status, 201);
    service.store.refuse_writes(true);

    for reply in [
        service.enqueue(&worker, TASKS, json!(2)),
        service.claim(&worker, CLAIMS),
    ] {
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert_eq!(reply.header("retry-after"), Some("30"));
        let error = &reply.json()["error"];
        assert_eq!(error["code"], "storage_quota_exhausted");
        assert_eq!(error["retry_after"], 30);
        assert_eq!(error["reset_at"], "2026-10-30T00:00:00Z");
    }

    let health = service.send("GET", "/v1/ns/renders/health", Some(&worker), &[], None);
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["attempts"]["ready"], 1);

    service.store.refuse_writes(false);
    assert_eq!(service.claim(&worker, CLAIMS).status, 200);
}

#[test]
fn a_client_that_leaves_gives_up_its_place() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let _held = service.hold_window(&worker);
    let mut client = TcpStream::connect(service.address).unwrap();
    let request = format!(
        "POST {CLAIMS} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {worker}\r\ncontent-length: 0\r\n\r\n"
    );
    client.write_all(request.as_bytes()).unwrap();
    service.until_pending(1);
    drop(client);
    // The dropped request withdraws its ticket from admission.
    service.until_pending(0);
}

/// Numbers the processes a test run starts, for their key files.
static NEXT_PROCESS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An `http_service` process of its own, built beside this test.
struct Process {
    child: std::process::Child,
    address: SocketAddr,
    admin: String,
}

impl Process {
    fn start(url: &str, schema: &str) -> Self {
        let program = example_program("http_service");
        let key_file = std::env::temp_dir().join(format!(
            "tessera-admin-{schema}-{}.key",
            NEXT_PROCESS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let mut child = std::process::Command::new(&program)
            .args(["--port", "0", "--postgres", url, "--schema", schema])
            .arg("--admin-key-file")
            .arg(&key_file)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("{}: {error}", program.display()));
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let mut said = |prefix: &str| loop {
            let line = lines.next().expect("the service printed").unwrap();
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        };
        let address = said("tessera http service on http://").parse().unwrap();
        let admin = said("admin key: ")
            .split_whitespace()
            .next()
            .expect("a key made now is printed")
            .to_owned();
        let _ = std::fs::remove_file(&key_file);
        Self {
            child,
            address,
            admin,
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_services_on_one_postgres_database_never_lease_a_task_twice() {
    let Ok(url) = std::env::var("TESSERA_TEST_POSTGRES_URL") else {
        println!("skipping: TESSERA_TEST_POSTGRES_URL is not set");
        return;
    };
    let schema = format!("http_{}", std::process::id());
    let services = [Process::start(&url, &schema), Process::start(&url, &schema)];
    const COUNT: usize = 200;
    let body = json!({
        "account": "acme",
        "scopes": ["enqueue", "claim", "read"],
        "grants": ["namespace:renders"],
    });
    let made = send(
        services[0].address,
        "POST",
        "/v1/keys",
        Some(&services[0].admin),
        &[],
        Some(&body),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let worker = made.json()["key"].as_str().unwrap().to_owned();
    for n in 0..COUNT {
        let body = json!({ "brief": { "frame": n }, "id": format!("frame-{n}") });
        let reply = send(
            services[n % 2].address,
            "POST",
            TASKS,
            Some(&worker),
            &[],
            Some(&body),
        );
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    // Four clients claim through both services at once, each submitting
    // what it is granted; every grant is recorded.
    let grants: Vec<(String, i64)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|client| {
                let (services, worker) = (&services, &worker);
                scope.spawn(move || {
                    let mut grants = Vec::new();
                    let mut turn = client;
                    loop {
                        turn += 1;
                        let address = services[turn % 2].address;
                        let reply = send(address, "POST", CLAIMS, Some(worker), &[], None);
                        if reply.status == 204 {
                            return grants;
                        }
                        assert_eq!(reply.status, 200, "{}", reply.text());
                        let claimed = reply.json();
                        let id = claimed["task"]["id"].as_str().unwrap().to_owned();
                        let token = claimed["lease"]["token"].as_i64().unwrap();
                        let submit = format!("/v1/ns/renders/tasks/{id}/submit");
                        let output = json!({ "version": 1, "token": token, "output": "done" });
                        let key = format!("{id}-{token}");
                        let headers = [("idempotency-key", key.as_str())];
                        let other = services[(turn + 1) % 2].address;
                        let done = send(
                            other,
                            "POST",
                            &submit,
                            Some(worker),
                            &headers,
                            Some(&output),
                        );
                        assert_eq!(done.status, 200, "{}", done.text());
                        grants.push((id, token));
                    }
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|client| client.join().unwrap())
            .collect()
    });
    // No lease lapsed (60 s), so a second grant of a task would have been
    // a second live lease.
    let mut tasks: Vec<&str> = grants.iter().map(|(id, _)| id.as_str()).collect();
    tasks.sort_unstable();
    tasks.dedup();
    assert_eq!(tasks.len(), grants.len(), "a task was leased twice");
    assert_eq!(grants.len(), COUNT, "every task was leased once");
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

/// An example program: cargo builds the examples of the package under test
/// beside the test binaries' folder.
fn example_program(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .unwrap()
}

/// Set in a child run of this test binary: the program name the child
/// reads its admission settings for.
const PROBE: &str = "TESSERA_EXAMPLES_ADMISSION_PROBE";

/// What both examples read their admission settings with: in a child run
/// of this binary (with [`PROBE`] set) it reads them, and an invalid one
/// stops the child.
#[test]
fn an_invalid_admission_setting_stops_the_program_with_its_name() {
    if let Ok(program) = std::env::var(PROBE) {
        let config = tessera_examples::admission_from_env(&program);
        println!("read max_pending {}", config.max_pending);
        return;
    }
    let run = |value: Option<&str>| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "an_invalid_admission_setting_stops_the_program_with_its_name",
                "--nocapture",
            ])
            .env(PROBE, "quickstart");
        match value {
            Some(value) => command.env("TESSERA_CLAIM_MAX_PENDING", value),
            None => command.env_remove("TESSERA_CLAIM_MAX_PENDING"),
        };
        command.output().unwrap()
    };
    let invalid = run(Some("abc"));
    assert_eq!(invalid.status.code(), Some(2), "{invalid:?}");
    let stderr = String::from_utf8_lossy(&invalid.stderr);
    assert!(
        stderr.contains("quickstart: TESSERA_CLAIM_MAX_PENDING") && stderr.contains("\"abc\""),
        "{stderr}"
    );
    let valid = run(Some("7"));
    assert!(valid.status.success(), "{valid:?}");
    assert!(String::from_utf8_lossy(&valid.stdout).contains("read max_pending 7"));
}

#[test]
fn every_refusal_is_json_with_its_status_and_code() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let code = |reply: &Reply| reply.json()["error"]["code"].as_str().unwrap().to_owned();

    let wrong_method = service.send("GET", CLAIMS, Some(&worker), &[], None);
    assert_eq!(wrong_method.status, 405);
    assert_eq!(code(&wrong_method), "method_not_allowed");
    let bad_path = service.send("GET", "/v1/ns/%FF/health", None, &[], None);
    assert_eq!(bad_path.status, 400);
    assert_eq!(code(&bad_path), "invalid_input");
    let nowhere = service.send("GET", "/v1/nowhere", None, &[], None);
    assert_eq!(
        (nowhere.status, code(&nowhere)),
        (404, "not_found".to_owned())
    );
    let anonymous = service.send("POST", CLAIMS, None, &[], None);
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    assert_eq!(code(&anonymous), "unauthorized");
    let unknown = service.send(
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(&json!({ "brief": {}, "priority_typo": 1 })),
    );
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.text().contains("priority_typo"),
        "{}",
        unknown.text()
    );
    let bad_scope = service.send(
        "POST",
        "/v1/keys",
        Some(&service.admin),
        &[],
        Some(&json!({ "account": "acme", "grants": ["bogus"] })),
    );
    assert_eq!(bad_scope.status, 400);
    let message = bad_scope.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(message.matches("invalid input").count(), 1, "{message}");
    let huge = json!({ "brief": "x".repeat(3 << 20) });
    let too_large = service.send("POST", TASKS, Some(&worker), &[], Some(&huge));
    assert_eq!(too_large.status, 413);
    assert_eq!(code(&too_large), "payload_too_large");
}

#[test]
fn keys_are_listed_and_revoked_over_http() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let listed = service.send("GET", "/v1/keys", Some(&service.admin), &[], None);
    assert_eq!(listed.status, 200, "{}", listed.text());
    let keys = listed.json();
    let keys = keys.as_array().unwrap();
    assert_eq!(keys.len(), 2, "the admin's and the worker's");
    assert!(!listed.text().contains(&worker), "no secret is listed");
    let id = keys
        .iter()
        .map(|key| key["key_id"].as_str().unwrap().to_owned())
        .find(|id| worker.contains(id.as_str()))
        .expect("the worker's key id is in its secret");
    let revoked = service.send(
        "DELETE",
        &format!("/v1/keys/{id}"),
        Some(&service.admin),
        &[],
        None,
    );
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    assert!(revoked.json()["revoked_at"].is_string());
    let refused = service.send("POST", CLAIMS, Some(&worker), &[], None);
    assert_eq!(refused.status, 401);
}

#[test]
fn a_shutdown_answers_waiting_claims_503_with_retry_after() {
    let mut service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let _held = service.hold_window(&worker);
    let address = service.address;
    let waiting = {
        let worker = worker.clone();
        std::thread::spawn(move || send(address, "POST", CLAIMS, Some(&worker), &[], None))
    };
    service.until_pending(1);
    service.shut_down();
    let reply = waiting.join().unwrap();
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], "shutting_down");
    assert_eq!(reply.header("retry-after"), Some("5"));
    service.until_pending(0);
}

#[test]
fn the_program_explains_its_flags() {
    let program = example_program("http_service");
    let help = std::process::Command::new(&program)
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--port",
        "--bind",
        "--db",
        "--postgres",
        "--public",
        "--daily-rows",
        "--page-cap",
    ] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
    let wrong = std::process::Command::new(&program)
        .args(["--port", "many"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(2));
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(said.starts_with("http_service: --port: \"many\""), "{said}");
    assert!(
        !said.contains("\\n"),
        "a message, not a debug string: {said}"
    );
}

#[test]
fn metrics_are_served_as_prometheus_text() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    service.enqueue(&worker, TASKS, json!({ "frame": 1 }));
    let claimed = service.claim(&worker, CLAIMS);
    assert_eq!(claimed.status, 200);
    let body = claimed.json();
    assert!(body["waited_ms"].is_u64(), "durations in milliseconds");
    assert_eq!(
        body["lease"]["task"], body["task"],
        "one shape of task reference"
    );
    assert!(body["task"]["namespace"].is_string());
    let (id, token) = (
        body["task"]["id"].as_str().unwrap(),
        &body["lease"]["token"],
    );
    let beat = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
        Some(&worker),
        &[],
        Some(&json!({ "version": 1, "token": token })),
    );
    assert_eq!(beat.status, 200, "{}", beat.text());
    assert_eq!(beat.json()["task"], body["task"]);
    let reply = service.send("GET", "/metrics", None, &[], None);
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let text = reply.text();
    for metric in [
        "tessera_claims_granted_total",
        "tessera_claim_limit",
        "tessera_claim_service_seconds",
    ] {
        assert!(text.contains(metric), "{metric} in {text}");
    }
}

#[test]
fn the_admin_key_is_made_once_and_another_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key_file) = (dir.path().join("t.db"), dir.path().join("admin.key"));
    let start = |extra: &[&str]| {
        let mut child = std::process::Command::new(example_program("http_service"))
            .args(["--port", "0", "--db"])
            .arg(&db)
            .arg("--admin-key-file")
            .arg(&key_file)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let said = lines
            .map(Result::unwrap)
            .find(|line| line.starts_with("admin key: "))
            .expect("the service says where its key is");
        let _ = child.kill();
        let _ = child.wait();
        said
    };
    let first = start(&[]);
    let secret = std::fs::read_to_string(&key_file).unwrap();
    assert!(first.contains(&secret), "made and printed once: {first}");
    let second = start(&[]);
    assert!(!second.contains(&secret), "not printed again: {second}");
    assert!(second.contains("kept in"), "{second}");
    let third = start(&["--new-admin-key"]);
    let another = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(another, secret);
    assert!(third.contains(&another), "{third}");
}

#[test]
fn the_openapi_document_describes_exactly_the_routes_the_router_serves() {
    let service = Service::start(small_window(), START);
    let reply = service.send("GET", "/v1/openapi.json", None, &[], None);
    assert_eq!(reply.status, 200);
    let document = reply.json();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = std::collections::BTreeSet::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            documented.insert((path.clone(), method.to_uppercase()));
        }
    }
    // What the router serves: every method of every path it routes that
    // is not refused as 405 (the path's parameters filled in).
    let mut served = std::collections::BTreeSet::new();
    for (path, _) in http_service::routes() {
        let concrete = path
            .replace("{ns}", "renders")
            .replace("{queue}", "frames")
            .replace("{task}", "t-1")
            .replace("{key}", "0000000000000000");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let reply = service.send(method, &concrete, Some(&service.admin), &[], None);
            let fallback = reply.status == 404 && reply.text().contains("not found: route");
            assert!(!fallback, "{method} {concrete} is routed");
            if reply.status != 405 {
                served.insert((path.to_owned(), method.to_owned()));
            }
        }
    }
    assert_eq!(documented, served);
    // Each refusal's shape is the store's error body, and keys are bearer.
    let schemas = &document["components"]["schemas"];
    assert!(schemas["ErrorSchema"]["properties"]["error"].is_object());
    assert!(schemas["NewTask"]["properties"]["brief"].is_object());
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}
