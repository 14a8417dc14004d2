//! The server on a real loopback port, driven by `ureq`: in this process
//! over a store on a `ManualClock` (nothing sleeps to let time pass), and
//! as the `tessera-server` program itself.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_store::{
    AdmissionConfig, ClaimPermit, ClaimStart, ManualClock, Namespace, QueueName, Store, StoreConfig,
};

/// A response: status, headers (names lowercase) and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
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
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("a JSON body: {self:?}"))
    }

    fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .expect("an error body")
            .to_owned()
    }
}

/// An agent that reports every status as a reply, bounded by `timeout`.
fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// One request to `address`: a JSON body if given, with its content type.
fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let raw = body.map(|body| ("application/json", body.to_string().into_bytes()));
    send_raw(address, method, path, key, headers, raw)
}

/// One request with a body of any content type.
fn send_raw(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<(&str, Vec<u8>)>,
) -> Reply {
    try_send(
        &agent(Duration::from_secs(30)),
        address,
        method,
        path,
        key,
        headers,
        body,
    )
    .expect("the server answers")
}

fn try_send(
    agent: &ureq::Agent,
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<(&str, Vec<u8>)>,
) -> Result<Reply, ureq::Error> {
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let bytes = match body {
        Some((content_type, bytes)) => {
            request = request.header("content-type", content_type);
            bytes
        }
        None => Vec::new(),
    };
    let mut response = agent.run(request.body(bytes).expect("a request"))?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// The server on a loopback port, over an in-memory store.
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
        Self::start_with(admission, at, tessera_server::ServeOptions::default())
    }

    fn start_with(
        admission: AdmissionConfig,
        at: &str,
        options: tessera_server::ServeOptions,
    ) -> Self {
        let clock = ManualClock::new(at.parse().expect("an RFC 3339 time"));
        let config = StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_admission(admission);
        tessera_server::prometheus();
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
        runtime.spawn(tessera_server::serve_until(
            listener,
            Arc::clone(&store),
            options,
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
        make_worker(self.address, &self.admin, namespace)
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

/// A keyed worker with every scope in `namespace`.
fn make_worker(address: SocketAddr, admin: &str, namespace: &str) -> String {
    let body = json!({
        "account": "acme",
        "scopes": ["enqueue", "claim", "read"],
        "grants": [format!("namespace:{namespace}")],
    });
    let reply = send(address, "POST", "/v1/keys", Some(admin), &[], Some(&body));
    assert_eq!(reply.status, 201, "{}", reply.text());
    reply.json()["key"].as_str().expect("a key").to_owned()
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
        service.until_pending(BURST);
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
fn a_paused_queue_answers_204_paused_and_a_full_one_204_limited() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let queue = "/v1/ns/renders/queues/frames";
    for n in 0..3 {
        assert_eq!(service.enqueue(&worker, TASKS, json!(n)).status, 201);
    }
    let paused = service.send("PUT", &format!("{queue}/pause"), Some(&worker), &[], None);
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["paused_at"], START);
    // Enqueues go on; claims are 204 saying why, with a Retry-After.
    assert_eq!(service.enqueue(&worker, TASKS, json!(3)).status, 201);
    let reply = service.claim(&worker, CLAIMS);
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("x-claim-empty-reason"), Some("paused"));
    assert_eq!(reply.header("retry-after"), Some("5"));
    let batch = service.send(
        "POST",
        &format!("{CLAIMS}/batch"),
        Some(&worker),
        &[],
        Some(&json!({ "count": 2 })),
    );
    assert_eq!(batch.status, 204);
    assert_eq!(batch.header("x-claim-empty-reason"), Some("paused"));
    let read = service.send(
        "GET",
        &format!("{queue}/settings"),
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(read.json(), paused.json());
    let health = service.send("GET", "/v1/ns/renders/health", Some(&worker), &[], None);
    assert_eq!(health.json()["queues"][0], paused.json());

    // Resumed with a limit of one: one lease, then 204 limited.
    let limits = service.send(
        "PUT",
        &format!("{queue}/limits"),
        Some(&worker),
        &[],
        Some(&json!({ "queue": 1 })),
    );
    assert_eq!(limits.status, 200, "{}", limits.text());
    assert_eq!(limits.json()["limit"]["queue"], 1);
    let resumed = service.send("PUT", &format!("{queue}/resume"), Some(&worker), &[], None);
    assert_eq!(resumed.json()["paused_at"], Value::Null);
    assert_eq!(service.claim(&worker, CLAIMS).status, 200);
    let reply = service.claim(&worker, CLAIMS);
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("x-claim-empty-reason"), Some("limited"));
    assert_eq!(reply.header("retry-after"), Some("5"));

    // A bad limit is a 400; 0 removes the limit.
    let bad = service.send(
        "PUT",
        &format!("{queue}/limits"),
        Some(&worker),
        &[],
        Some(&json!({ "queue": -1 })),
    );
    assert_eq!(
        (bad.status, bad.error_code().as_str()),
        (400, "invalid_input")
    );
    let cleared = service.send(
        "PUT",
        &format!("{queue}/limits"),
        Some(&worker),
        &[],
        Some(&json!({ "queue": 0, "per_partition": null })),
    );
    assert_eq!(cleared.json()["limit"]["queue"], Value::Null);
    assert_eq!(service.claim(&worker, CLAIMS).status, 200);
}

#[test]
fn a_queue_gets_keep_times_of_its_own_and_hands_them_back() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let path = "/v1/ns/renders/queues/frames/retention";
    let read = service.send("GET", path, Some(&worker), &[], None);
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["own"], false);
    assert_eq!(read.json()["retention"]["done"], 24 * 60 * 60 * 1000);
    let set = service.send(
        "PUT",
        path,
        Some(&worker),
        &[],
        Some(&json!({ "done": 60_000, "discarded": null, "cancelled": 0 })),
    );
    assert_eq!(set.status, 200, "{}", set.text());
    assert_eq!(
        set.json()["retention"],
        json!({ "done": 60_000, "discarded": null, "cancelled": 0 })
    );
    assert_eq!(set.json()["own"], true);
    assert_eq!(
        service.send("GET", path, Some(&worker), &[], None).json(),
        set.json()
    );
    // Every keep time must be said: a missing one would silently mean
    // "for good". Unknown fields, arrays and keep times past ten years
    // are refused, and change nothing.
    for body in [
        json!({ "done": 60_000, "discarded": null }),
        json!({ "done": 1, "discarded": 1, "cancelled": 1, "failed": 1 }),
        json!([60_000, null, 0]),
        json!({ "done": -1, "discarded": 1, "cancelled": 1 }),
        json!({ "done": 400_000_000_000_i64, "discarded": 1, "cancelled": 1 }),
    ] {
        let bad = service.send("PUT", path, Some(&worker), &[], Some(&body));
        assert_eq!(bad.status, 400, "{body}: {}", bad.text());
    }
    assert_eq!(
        service.send("GET", path, Some(&worker), &[], None).json(),
        set.json()
    );
    let reset = service.send("DELETE", path, Some(&worker), &[], None);
    assert_eq!(reset.status, 200, "{}", reset.text());
    assert_eq!(reset.json(), read.json());
}

/// Reads what the server sends on `stream` until it closes it (or a
/// minute passes, which fails).
fn read_until_closed(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(error) => panic!("the server never closed a slow client's connection: {error}"),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn slow_clients_are_cut_off_while_others_are_served() {
    use std::io::Write;
    let options = tessera_server::ServeOptions {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        ..tessera_server::ServeOptions::default()
    };
    let service = Service::start_with(AdmissionConfig::default(), START, options);
    let worker = service.worker("renders");
    // A client that sends half its headers, one that sends a body shorter
    // than its Content-Length, and one that connects and says nothing.
    let mut half_header = std::net::TcpStream::connect(service.address).unwrap();
    half_header
        .write_all(b"POST /v1/ns/renders/queues/frames/tasks HTTP/1.1\r\nHost: tessera\r\n")
        .unwrap();
    let mut short_body = std::net::TcpStream::connect(service.address).unwrap();
    short_body
        .write_all(
            format!(
                "POST /v1/ns/renders/queues/frames/tasks HTTP/1.1\r\nHost: tessera\r\n\
                 Authorization: Bearer {worker}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{\"brief\":"
            )
            .as_bytes(),
        )
        .unwrap();
    let mut silent = std::net::TcpStream::connect(service.address).unwrap();
    // Meanwhile the others are served.
    for n in 0..5 {
        assert_eq!(service.enqueue(&worker, TASKS, json!(n)).status, 201);
    }
    // Each slow one is cut off: the short body with a 408, the others
    // closed.
    let answer = read_until_closed(&mut short_body);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    read_until_closed(&mut half_header);
    read_until_closed(&mut silent);
    // Nothing of the short body was stored.
    assert_eq!(
        service
            .store
            .health(
                &service.store.authenticate(Some(&worker)).unwrap(),
                &Namespace::parse("renders").unwrap()
            )
            .unwrap()
            .attempts
            .ready,
        5
    );
}

#[test]
fn an_unknown_query_parameter_is_ignored_and_an_unknown_body_field_refused() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    assert_eq!(service.enqueue(&worker, TASKS, json!(1)).status, 201);
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=ready&_=1733561234",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(listed.json()["tasks"].as_array().map(Vec::len), Some(1));
    let typo = service.send(
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(&json!({ "brief": 2, "priorty": 3 })),
    );
    assert_eq!(typo.status, 400, "{}", typo.text());
}

#[test]
fn a_session_lasts_the_store_s_lifetime_and_a_flag_turns_them_off() {
    let service = Service::start(AdmissionConfig::default(), START);
    let minted = service.send("POST", "/v1/sessions", None, &[], None);
    assert_eq!(minted.status, 201, "{}", minted.text());
    // 24 hours from the service's clock, as the document says.
    assert_eq!(minted.json()["expires_at"], "2026-10-30T12:00:00Z");
    let document = service
        .send("GET", "/v1/openapi.json", None, &[], None)
        .text();
    assert!(
        document.contains("24 hours by default"),
        "the document says how long"
    );
    let off = Service::start_with(
        AdmissionConfig::default(),
        START,
        tessera_server::ServeOptions {
            sessions: false,
            ..tessera_server::ServeOptions::default()
        },
    );
    let refused = off.send("POST", "/v1/sessions", None, &[], None);
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert_eq!(refused.error_code(), "not_found");
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
fn a_task_s_own_lease_and_deadline_hold_and_a_snooze_keeps_its_try() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let body = json!({ "brief": 1, "id": "quick", "lease_ms": 5000, "timeout_ms": 30000,
        "max_tries": 1 });
    let reply = service.send("POST", TASKS, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 201, "{}", reply.text());
    // Out of bounds, refused before anything is written.
    for bad in [
        json!({ "brief": 1, "lease_ms": 0 }),
        json!({ "brief": 1, "timeout_ms": -5 }),
        json!({ "brief": 1, "deadline": "2026-10-29T11:00:00Z" }),
        json!({ "brief": 1, "deadline": "soon" }),
    ] {
        let refused = service.send("POST", TASKS, Some(&worker), &[], Some(&bad));
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
    let claimed = service.claim(&worker, CLAIMS).json();
    assert_eq!(claimed["lease"]["expires_at"], "2026-10-29T12:00:05Z");
    let token = claimed["lease"]["token"].as_i64().unwrap();
    let snooze = "/v1/ns/renders/tasks/quick/snooze";
    let request = json!({ "version": 1, "token": token, "delay_ms": 2000 });
    let first = service.send("POST", snooze, Some(&worker), &[], Some(&request));
    assert_eq!(first.status, 200, "{}", first.text());
    // Retried, the same answer; a bad delay is a 400.
    let again = service.send("POST", snooze, Some(&worker), &[], Some(&request));
    assert_eq!((again.status, again.json()), (200, first.json()));
    let bad = json!({ "version": 1, "token": token, "delay_ms": -1 });
    let refused = service.send("POST", snooze, Some(&worker), &[], Some(&bad));
    assert_eq!(refused.status, 400, "{}", refused.text());
    // Its only try kept, it is granted again after the delay.
    service.clock.advance(Duration::from_secs(2));
    let claimed = service.claim(&worker, CLAIMS);
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    assert_eq!(
        claimed.json()["lease"]["expires_at"],
        "2026-10-29T12:00:07Z"
    );
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
        json!({ "namespace": "renders", "id": "frame-7", "version": 2, "created": true })
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

    let receipt = service.send(
        "GET",
        "/v1/ns/renders/tasks/frame-7/attempts/1/receipt?version=2",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(receipt.status, 200, "{}", receipt.text());
    assert_eq!(receipt.json()["receipt"]["token"], token);
    // The output reads back as the JSON it was sent as, not as bytes.
    assert_eq!(receipt.json()["output"], json!({ "pixels": 42 }));
    let alternatives = service.send(
        "GET",
        "/v1/ns/renders/tasks/frame-7/alternatives?version=2",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(alternatives.status, 200, "{}", alternatives.text());
    assert_eq!(alternatives.json().as_array().unwrap().len(), 1);
    assert_eq!(alternatives.json()[0]["output"], json!({ "pixels": 42 }));
}

#[test]
fn a_struct_sent_as_an_array_or_with_a_field_twice_is_refused_at_any_depth() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let enqueued = service.send(
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(&json!({ "brief": 1 })),
    );
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());
    let claimed = service.claim(&worker, CLAIMS).json();
    let (task, token) = (&claimed["task"]["id"], &claimed["lease"]["token"]);
    let batch = "/v1/ns/renders/submissions/batch";
    let refused = |body: String| {
        let reply = send_raw(
            service.address,
            "POST",
            batch,
            Some(&worker),
            &[],
            Some(("application/json", body.into_bytes())),
        );
        assert_eq!(reply.status, 400, "{}", reply.text());
        let error = &reply.json()["error"];
        assert_eq!(error["code"], "invalid_input", "{}", reply.text());
        error["message"].as_str().unwrap().to_owned()
    };
    // An item as an array, which serde alone reads by position.
    let message = refused(json!({ "submissions": [[task, 1, token, "k1", null]] }).to_string());
    assert!(message.contains("a JSON object"), "{message}");
    // A field named twice, in an item or in the output.
    let twice = format!(
        r#"{{"submissions": [{{"task": {task}, "version": 1, "token": {token}, "token": {token}, "key": "k1"}}]}}"#
    );
    assert!(refused(twice).contains("duplicate field `token`"));
    let twice = format!(
        r#"{{"submissions": [{{"task": {task}, "version": 1, "token": {token}, "key": "k1", "output": {{"a": 1, "a": 2}}}}]}}"#
    );
    assert!(refused(twice).contains("duplicate field `a`"));
    // None of them submitted anything: the lease is still held, and the
    // right body is accepted.
    let body = json!({ "submissions": [
        { "task": task, "version": 1, "token": token, "key": "k1", "output": { "a": 1 } },
    ] });
    let reply = service.send("POST", batch, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()[0]["replayed"], false, "{}", reply.text());
}

#[test]
fn a_long_target_or_too_many_headers_is_refused_with_a_json_body() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let refused = |reply: &Reply, status: u16, code: &str| {
        assert_eq!(reply.status, status, "{}", reply.text());
        assert_eq!(reply.json()["error"]["code"], code, "{}", reply.text());
    };
    // A query of 9 KiB, past the 8 KiB a target may take.
    let long = format!(
        "/v1/ns/renders/tasks?state=ready&_={}",
        "x".repeat(9 * 1024)
    );
    refused(
        &service.send("GET", &long, Some(&worker), &[], None),
        414,
        "uri_too_long",
    );
    // 101 header fields, then one field of 65 KiB.
    let names: Vec<String> = (0..101).map(|n| format!("x-field-{n}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    refused(
        &service.send("GET", "/v1/ns/renders/health", Some(&worker), &many, None),
        431,
        "headers_too_large",
    );
    let big = "y".repeat(65 * 1024);
    refused(
        &service.send(
            "GET",
            "/v1/ns/renders/health",
            Some(&worker),
            &[("x-big", &big)],
            None,
        ),
        431,
        "headers_too_large",
    );
    // Within the bounds, the same requests are served.
    let fine = format!(
        "/v1/ns/renders/tasks?state=ready&_={}",
        "x".repeat(7 * 1024)
    );
    let reply = service.send("GET", &fine, Some(&worker), &many[..90], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[test]
fn a_body_is_json_once_in_utf8_unencoded_and_within_its_declared_limit() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let body = json!({ "brief": 1 }).to_string().into_bytes();
    for headers in [
        vec![("content-encoding", "gzip")],
        vec![("content-type", "text/plain")],
    ] {
        let reply = send_raw(
            service.address,
            "POST",
            TASKS,
            Some(&worker),
            &headers,
            Some(("application/json", body.clone())),
        );
        assert_eq!(reply.status, 415, "{headers:?}: {}", reply.text());
    }
    let utf16 = send_raw(
        service.address,
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(("application/vnd.tessera+json; charset=utf-16", body.clone())),
    );
    assert_eq!(utf16.status, 415, "{}", utf16.text());
    // A declared length over the limit is 413 at once, before any body.
    let mut stream = std::net::TcpStream::connect(service.address).unwrap();
    std::io::Write::write_all(
        &mut stream,
        format!(
            "POST {TASKS} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {worker}\r\n\
             content-type: application/json\r\ncontent-length: 3145728\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let answer = read_until_closed(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // None of them enqueued anything; the plain body does.
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=ready",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(listed.json()["tasks"], json!([]), "{}", listed.text());
    let plain = send_raw(
        service.address,
        "POST",
        TASKS,
        Some(&worker),
        &[("content-encoding", "identity")],
        Some(("application/json; charset=UTF-8", body)),
    );
    assert_eq!(plain.status, 201, "{}", plain.text());

    // A submission with two idempotency keys is refused and lands nothing.
    let claimed = service.claim(&worker, CLAIMS).json();
    let submit = format!(
        "/v1/ns/renders/tasks/{}/submit",
        claimed["task"]["id"].as_str().unwrap()
    );
    let output = json!({ "version": 1, "token": claimed["lease"]["token"], "output": 1 });
    let request = ureq::http::Request::builder()
        .method("POST")
        .uri(format!("http://{}{submit}", service.address))
        .header("authorization", format!("Bearer {worker}"))
        .header("content-type", "application/json")
        .header("idempotency-key", "aaa")
        .header("idempotency-key", "bbb");
    let mut reply = agent(Duration::from_secs(30))
        .run(request.body(output.to_string().into_bytes()).unwrap())
        .unwrap();
    assert_eq!(reply.status().as_u16(), 400);
    let text = reply.body_mut().read_to_string().unwrap();
    assert!(text.contains("one idempotency-key header"), "{text}");
    let once = service.send(
        "POST",
        &submit,
        Some(&worker),
        &[("idempotency-key", "aaa")],
        Some(&output),
    );
    assert_eq!(once.status, 200, "{}", once.text());
    assert_eq!(once.json()["idempotency_key"], "aaa", "{}", once.text());
}

#[test]
fn a_batch_of_submissions_answers_each_in_order() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    for id in ["frame-1", "frame-2"] {
        let body = json!({ "brief": { "frame": id }, "id": id, "version": 1 });
        let reply = service.send("POST", TASKS, Some(&worker), &[], Some(&body));
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    let first = service.claim(&worker, CLAIMS).json();
    let second = service.claim(&worker, CLAIMS).json();
    let item = |claimed: &Value, token: i64, key: &str| {
        json!({
            "task": claimed["task"]["id"], "version": 1, "token": token,
            "key": key, "output": { "from": key },
        })
    };
    let (token1, token2) = (
        first["lease"]["token"].as_i64().unwrap(),
        second["lease"]["token"].as_i64().unwrap(),
    );
    let batch = "/v1/ns/renders/submissions/batch";
    // The second item's token was never granted: it alone is refused.
    let body = json!({ "submissions": [
        item(&first, token1, "k1"),
        item(&second, token2 + 7, "k2"),
    ] });
    let reply = service.send("POST", batch, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answers = reply.json();
    assert_eq!(answers[0]["replayed"], false);
    assert_eq!(answers[0]["receipt"]["token"], token1);
    assert_eq!(answers[0]["receipt"]["task"]["id"], first["task"]["id"]);
    assert_eq!(answers[1]["status"], 409, "{answers}");
    assert_eq!(answers[1]["error"]["code"], "unknown_token");

    // Sent again with the second token right: the first replays, the
    // second is accepted.
    let body = json!({ "submissions": [
        item(&first, token1, "k1"),
        item(&second, token2, "k2"),
    ] });
    let reply = service.send("POST", batch, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let again = reply.json();
    assert_eq!(again[0]["replayed"], true);
    assert_eq!(again[0]["receipt"], answers[0]["receipt"]);
    assert_eq!(again[1]["replayed"], false);
    assert_eq!(again[1]["receipt"]["token"], token2);

    let empty = json!({ "submissions": [] });
    let reply = service.send("POST", batch, Some(&worker), &[], Some(&empty));
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), "invalid_input");
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

    let nowhere = service.send("GET", "/v1/nothing", Some(&worker), &[], None);
    assert_eq!(nowhere.status, 404);
    assert_eq!(nowhere.error_code(), "not_found");

    // The denials are counted, and the worker reads its own counters.
    let audit = service.send("GET", "/v1/audit", Some(&worker), &[], None);
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
    // A client that gives up quickly: its connection closes while its
    // claim waits for admission.
    let impatient = agent(Duration::from_millis(200));
    let address = service.address;
    let gone = try_send(
        &impatient,
        address,
        "POST",
        CLAIMS,
        Some(&worker),
        &[],
        None,
    );
    assert!(gone.is_err(), "the claim was still waiting: {gone:?}");
    // The dropped request withdraws its ticket from admission.
    service.until_pending(0);
}

#[test]
fn every_refusal_is_json_with_its_status_code_and_a_lowercase_message() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let mut refusals = Vec::new();

    let wrong_method = service.send("GET", CLAIMS, Some(&worker), &[], None);
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.error_code(), "method_not_allowed");
    refusals.push(wrong_method);
    let bad_path = service.send("GET", "/v1/ns/%FF/health", None, &[], None);
    assert_eq!(bad_path.status, 400);
    assert_eq!(bad_path.error_code(), "invalid_input");
    refusals.push(bad_path);
    let nowhere = service.send("GET", "/v1/nowhere", None, &[], None);
    assert_eq!(
        (nowhere.status, nowhere.error_code()),
        (404, "not_found".to_owned())
    );
    refusals.push(nowhere);
    let anonymous = service.send("POST", CLAIMS, None, &[], None);
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    refusals.push(anonymous);
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
    refusals.push(unknown);
    let bad_grant = service.send(
        "POST",
        "/v1/keys",
        Some(&service.admin),
        &[],
        Some(&json!({ "account": "acme", "grants": ["bogus"] })),
    );
    assert_eq!(bad_grant.status, 400);
    // A worker's key without scopes or grants could do nothing: refused.
    for useless in [
        json!({ "account": "worker1" }),
        json!({ "account": "worker1", "scopes": ["claim"] }),
        json!({ "account": "worker1", "grants": ["namespace:renders"] }),
        json!({ "account": "worker1", "scopes": [], "grants": ["namespace:renders"] }),
    ] {
        let refused = service.send(
            "POST",
            "/v1/keys",
            Some(&service.admin),
            &[],
            Some(&useless),
        );
        assert_eq!(refused.status, 400, "{useless}: {}", refused.text());
        assert!(refused.text().contains("scopes"), "{}", refused.text());
    }
    let too_many = service.send(
        "POST",
        "/v1/keys",
        Some(&service.admin),
        &[],
        Some(&json!({ "account": "acme", "scopes": ["read", "read", "read", "read"] })),
    );
    assert_eq!(
        too_many.status,
        400,
        "maxItems is enforced: {}",
        too_many.text()
    );
    let message = bad_grant.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(message.matches("invalid input").count(), 1, "{message}");
    refusals.push(bad_grant);
    let no_key_header = service.send(
        "POST",
        "/v1/ns/renders/tasks/t-1/submit",
        Some(&worker),
        &[],
        Some(&json!({ "version": 1, "token": 1, "output": 1 })),
    );
    assert_eq!(no_key_header.status, 400);
    refusals.push(no_key_header);
    // Over the body limit: refused from its length, before it is read,
    // so the client may see its upload cut off instead of the answer.
    let huge = json!({ "brief": "x".repeat(3 << 20) })
        .to_string()
        .into_bytes();
    let agent = agent(Duration::from_secs(30));
    let body = Some(("application/json", huge));
    match try_send(
        &agent,
        service.address,
        "POST",
        TASKS,
        Some(&worker),
        &[],
        body,
    ) {
        Ok(too_large) => {
            assert_eq!(too_large.status, 413);
            assert_eq!(too_large.error_code(), "payload_too_large");
            refusals.push(too_large);
        }
        Err(ureq::Error::Io(cut)) => assert!(
            matches!(
                cut.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{cut}"
        ),
        Err(other) => panic!("{other}"),
    }
    // A body that is not JSON by its content type is 415, whatever it holds.
    let body = json!({ "brief": 1 }).to_string().into_bytes();
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let reply = send_raw(
            service.address,
            "POST",
            TASKS,
            Some(&worker),
            &[],
            Some((content_type, body.clone())),
        );
        assert_eq!(reply.status, 415, "{content_type}: {}", reply.text());
        assert_eq!(reply.error_code(), "unsupported_media_type");
        refusals.push(reply);
    }
    let without_body = service.send("POST", TASKS, Some(&worker), &[], None);
    assert_eq!(without_body.status, 415);
    let charset = send_raw(
        service.address,
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(("application/json; charset=utf-8", body)),
    );
    assert_eq!(charset.status, 201, "{}", charset.text());

    for reply in refusals {
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        let first = message.chars().next().expect("a message");
        assert!(!first.is_uppercase(), "{message}");
    }
}

#[test]
fn keys_are_listed_expired_and_revoked_over_http() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("renders");
    let listed = service.send("GET", "/v1/keys", Some(&service.admin), &[], None);
    assert_eq!(listed.status, 200, "{}", listed.text());
    let keys = listed.json();
    let keys = keys.as_array().expect("a list, as the document says");
    assert_eq!(keys.len(), 2, "the admin's and the worker's");
    assert!(!listed.text().contains(&worker), "no secret is listed");
    let id = keys
        .iter()
        .map(|key| key["key_id"].as_str().unwrap().to_owned())
        .find(|id| worker.contains(id.as_str()))
        .expect("the worker's key id is in its secret");
    let page = service.send("GET", "/v1/keys?limit=1", Some(&service.admin), &[], None);
    assert_eq!(page.json().as_array().unwrap().len(), 1);
    let expiry = json!({ "at": "2026-10-29T13:00:00Z" });
    let expiring = service.send(
        "POST",
        &format!("/v1/keys/{id}/expire"),
        Some(&service.admin),
        &[],
        Some(&expiry),
    );
    assert_eq!(expiring.status, 200, "{}", expiring.text());
    assert_eq!(expiring.json()["expires_at"], "2026-10-29T13:00:00Z");
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
fn tasks_are_listed_by_state_page_by_page_cancelled_and_retried() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let batch = json!({ "tasks": (0..5).map(|n| json!({ "brief": n, "id": format!("f-{n}") })).collect::<Vec<_>>() });
    let enqueued = service.send(
        "POST",
        &format!("{TASKS}/batch"),
        Some(&worker),
        &[],
        Some(&batch),
    );
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());
    assert_eq!(enqueued.json().as_array().unwrap().len(), 5);
    let again = service.send(
        "POST",
        &format!("{TASKS}/batch"),
        Some(&worker),
        &[],
        Some(&batch),
    );
    assert!(
        again
            .json()
            .as_array()
            .unwrap()
            .iter()
            .all(|task| task["created"] == false)
    );

    // Ready tasks, two a page, following `next`.
    let mut seen = Vec::new();
    let mut path = "/v1/ns/renders/tasks?state=ready&limit=2".to_owned();
    loop {
        let page = service.send("GET", &path, Some(&worker), &[], None);
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        for task in page["tasks"].as_array().unwrap() {
            seen.push(task["task"]["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/ns/renders/tasks?state=ready&limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["f-0", "f-1", "f-2", "f-3", "f-4"]);

    // A batch claim leases three at once.
    let claimed = service.send(
        "POST",
        &format!("{CLAIMS}/batch"),
        Some(&worker),
        &[],
        Some(&json!({ "count": 3 })),
    );
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    let leases = claimed.json()["claimed"].as_array().unwrap().clone();
    assert_eq!(leases.len(), 3);

    // A failure with no retry, then an operator's retry of it.
    let failed = &leases[0];
    let id = failed["task"]["id"].as_str().unwrap();
    let token = &failed["lease"]["token"];
    let report = json!({ "version": 1, "token": token, "retry": "never", "error": "bad frame" });
    let reply = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/fail"),
        Some(&worker),
        &[],
        Some(&report),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=failed",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(listed.json()["tasks"][0]["task"]["id"], id);
    let retried = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/retry"),
        Some(&worker),
        &[],
        Some(&json!({ "version": 1 })),
    );
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.json(), json!([1]));

    // A cancel reaches the holder at its next heartbeat.
    let held = &leases[1];
    let id = held["task"]["id"].as_str().unwrap();
    let cancelled = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/cancel"),
        Some(&worker),
        &[],
        Some(&json!({ "version": 1 })),
    );
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    let beat = json!({ "version": 1, "token": held["lease"]["token"] });
    let late = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
        Some(&worker),
        &[],
        Some(&beat),
    );
    assert_eq!(
        (late.status, late.error_code()),
        (409, "task_cancelled".to_owned())
    );
    let read = service.send(
        "GET",
        &format!("/v1/ns/renders/tasks/{id}"),
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["task"]["id"], id);

    // A snooze steps back without spending the try: the task is ready
    // again, and the old token is done with.
    let snoozed = &leases[2];
    let id = snoozed["task"]["id"].as_str().unwrap();
    let token = &snoozed["lease"]["token"];
    let report = json!({ "version": 1, "token": token, "retry": "snooze", "after_ms": 0 });
    let reply = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/fail"),
        Some(&worker),
        &[],
        Some(&report),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["state"],
        json!({ "state": "ready" }),
        "{}",
        reply.text()
    );
    let beat = json!({ "version": 1, "token": token });
    let late = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
        Some(&worker),
        &[],
        Some(&beat),
    );
    assert_eq!(late.status, 409, "{}", late.text());

    // Work is there, so a long-poll answers at once.
    let wait = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/wait",
        Some(&worker),
        &[],
        Some(&json!({ "timeout_ms": 1000 })),
    );
    assert_eq!(wait.json()["outcome"], "work_available", "{}", wait.text());
}

#[test]
fn a_partition_key_is_taken_at_enqueue_and_shown_by_the_task_and_listings() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let body = json!({ "brief": 1, "id": "p-1", "partition_key": "customer-7" });
    let enqueued = service.send("POST", TASKS, Some(&worker), &[], Some(&body));
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());
    let view = service.send("GET", "/v1/ns/renders/tasks/p-1", Some(&worker), &[], None);
    assert_eq!(view.json()["partition_key"], "customer-7");
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=ready",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(listed.json()["tasks"][0]["partition_key"], "customer-7");
    // A key that is not a name is a 400, and nothing is enqueued.
    let bad = json!({ "brief": 2, "id": "p-2", "partition_key": "a b" });
    let refused = service.send("POST", TASKS, Some(&worker), &[], Some(&bad));
    assert_eq!(refused.status, 400, "{}", refused.text());
    let missing = service.send("GET", "/v1/ns/renders/tasks/p-2", Some(&worker), &[], None);
    assert_eq!(missing.status, 404);
}

#[test]
fn a_task_after_others_waits_for_them_and_reads_their_alternatives() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let enqueue = |body: Value| service.send("POST", TASKS, Some(&worker), &[], Some(&body));
    let brief = enqueue(json!({ "brief": 1, "id": "brief-1", "alternatives": 2 }));
    assert_eq!(brief.status, 201, "{}", brief.text());
    let child = json!({ "brief": 2, "id": "compare-1", "after": [{ "id": "brief-1" }] });
    let waiting = service.send(
        "POST",
        "/v1/ns/renders/queues/compare/tasks",
        Some(&worker),
        &[],
        Some(&child),
    );
    assert_eq!(waiting.status, 201, "{}", waiting.text());
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=waiting",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(
        listed.json()["tasks"][0]["task"]["id"],
        "compare-1",
        "{}",
        listed.text()
    );
    // A parent that does not exist, a parent that is no name, and a rule
    // that is no rule: each a 400, and nothing enqueued.
    for bad in [
        json!({ "brief": 3, "id": "orphan", "after": [{ "id": "nowhere" }] }),
        json!({ "brief": 3, "id": "orphan", "after": [{ "id": "a b" }] }),
        json!({ "brief": 3, "id": "orphan", "after": [{ "id": "brief-1", "extra": 1 }] }),
        json!({ "brief": 3, "id": "orphan", "after": [{ "id": "brief-1" }], "run_after": "never" }),
        json!({ "brief": 3, "id": "orphan", "after": "brief-1" }),
    ] {
        let refused = enqueue(bad.clone());
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
    let orphan = service.send(
        "GET",
        "/v1/ns/renders/tasks/orphan",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(orphan.status, 404);
    let compare = "/v1/ns/renders/queues/compare/claims";
    assert_eq!(
        service.claim(&worker, compare).status,
        204,
        "a waiting task is not claimed"
    );
    // Both alternatives of the brief are solved.
    for n in 0..2 {
        let claimed = service.claim(&worker, CLAIMS).json();
        let token = claimed["lease"]["token"].as_i64().unwrap();
        let output = json!({ "version": 1, "token": token, "output": { "solution": n } });
        let key = format!("solution-{n}");
        let submitted = service.send(
            "POST",
            "/v1/ns/renders/tasks/brief-1/submit",
            Some(&worker),
            &[("idempotency-key", key.as_str())],
            Some(&output),
        );
        assert_eq!(submitted.status, 200, "{}", submitted.text());
    }
    let claimed = service.claim(&worker, compare);
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    assert_eq!(claimed.json()["task"]["id"], "compare-1");
    let parents = service.send(
        "GET",
        "/v1/ns/renders/tasks/compare-1/parents",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(parents.status, 200, "{}", parents.text());
    let parents = parents.json();
    assert_eq!(parents[0]["parent"]["id"], "brief-1");
    let solutions: Vec<&Value> = parents[0]["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|receipt| &receipt["output"]["solution"])
        .collect();
    assert_eq!(solutions, [&json!(0), &json!(1)]);
}

#[test]
fn a_unique_task_s_duplicate_answers_200_with_the_task_already_there() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let body = json!({ "brief": 1, "unique": { "key": "report-7" } });
    let first = service.send("POST", TASKS, Some(&worker), &[], Some(&body));
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.json()["created"], true);
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let again = service.send(
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(&json!({ "brief": 2, "unique": { "key": "report-7" } })),
    );
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        (
            again.json()["id"].as_str(),
            again.json()["created"].as_bool()
        ),
        (Some(id.as_str()), Some(false))
    );
    let view = service.send(
        "GET",
        &format!("/v1/ns/renders/tasks/{id}"),
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(
        (
            view.json()["unique_key"].as_str(),
            &view.json()["brief"]["value"]
        ),
        (Some("report-7"), &json!(1))
    );

    // Replace mode takes the duplicate's brief; a batch reports its
    // in-batch duplicates with the first task.
    let replace = json!({ "brief": 3, "unique": { "key": "report-7", "mode": "replace", "states": ["ready", "leased"] } });
    let replaced = service.send("POST", TASKS, Some(&worker), &[], Some(&replace));
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    let view = service.send(
        "GET",
        &format!("/v1/ns/renders/tasks/{id}"),
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(view.json()["brief"]["value"], json!(3));
    let batch = json!({ "tasks": [
        { "brief": 4, "unique": { "key": "k", "window_ms": 60000 } },
        { "brief": 5, "unique": { "key": "k", "window_ms": 60000 } },
        { "brief": 6, "unique": { "key": "report-7" } },
    ] });
    let answers = service.send(
        "POST",
        &format!("{TASKS}/batch"),
        Some(&worker),
        &[],
        Some(&batch),
    );
    assert_eq!(answers.status, 201, "{}", answers.text());
    let answers = answers.json();
    let created: Vec<bool> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["created"].as_bool().unwrap())
        .collect();
    assert_eq!(created, [true, false, false]);
    assert_eq!(answers[1]["task"], answers[0]["task"]);
    assert_eq!(answers[2]["task"]["id"], json!(id));

    // Bad uniqueness is a 400 that enqueues nothing.
    for bad in [
        json!({ "brief": 7, "unique": { "key": "a b" } }),
        json!({ "brief": 7, "unique": { "key": "k2", "mode": "debounce" } }),
        json!({ "brief": 7, "unique": { "key": "k2", "mode": "keep", "delay_ms": 5 } }),
        json!({ "brief": 7, "unique": { "key": "k2", "mode": "later" } }),
        json!({ "brief": 7, "unique": { "key": "k2", "window_ms": 0 } }),
        json!({ "brief": 7, "unique": { "key": "k2", "mode": "debounce", "delay_ms": 10, "max_delay_ms": 5 } }),
        json!({ "brief": 7, "unique": { "key": "k2", "states": ["done", "nope"] } }),
    ] {
        let refused = service.send("POST", TASKS, Some(&worker), &[], Some(&bad));
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
    let ready = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=ready",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(
        ready.json()["tasks"].as_array().unwrap().len(),
        2,
        "report-7 and k"
    );
}

#[test]
fn progress_rides_on_heartbeats_and_filters_cancel_and_retry_in_bulk() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    let batch = json!({ "tasks": (0..4).map(|n| json!({ "brief": n, "id": format!("b-{n}") })).collect::<Vec<_>>() });
    let enqueued = service.send(
        "POST",
        &format!("{TASKS}/batch"),
        Some(&worker),
        &[],
        Some(&batch),
    );
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());

    // A heartbeat with progress; the task view and the listing show it.
    let claimed = service.claim(&worker, CLAIMS);
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    let claimed = claimed.json();
    let id = claimed["task"]["id"].as_str().unwrap().to_owned();
    let token = claimed["lease"]["token"].clone();
    let progress = json!({ "stage": "encode", "done": 2, "of": 5 });
    let beat = json!({ "version": 1, "token": token, "progress": progress });
    let reply = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
        Some(&worker),
        &[],
        Some(&beat),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let read = service.send(
        "GET",
        &format!("/v1/ns/renders/tasks/{id}"),
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(read.json()["progress"][0]["progress"], progress);
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=leased",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(listed.json()["tasks"][0]["progress"], progress);
    let big = json!({ "version": 1, "token": token, "progress": "x".repeat(5000) });
    let refused = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
        Some(&worker),
        &[],
        Some(&big),
    );
    assert_eq!(refused.status, 400, "{}", refused.text());

    // Every ready task of the queue cancelled at once; the leased one kept.
    let filter = json!({ "queue": "frames", "state": "ready" });
    let cancelled = service.send(
        "POST",
        "/v1/ns/renders/bulk/cancel",
        Some(&worker),
        &[],
        Some(&filter),
    );
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json(), json!({ "changed": 3 }));
    let retried = service.send(
        "POST",
        "/v1/ns/renders/bulk/retry",
        Some(&worker),
        &[],
        Some(&json!({ "state": "cancelled", "changed_since": START })),
    );
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.json(), json!({ "changed": 3 }));
    let none = service.send(
        "POST",
        "/v1/ns/renders/bulk/cancel",
        Some(&worker),
        &[],
        Some(&json!({ "queue": "elsewhere" })),
    );
    assert_eq!(none.json(), json!({ "changed": 0 }));
    for bad in [
        json!({ "state": "asleep" }),
        json!({ "queue": "no/slash" }),
        json!({ "colour": "red" }),
    ] {
        let reply = service.send(
            "POST",
            "/v1/ns/renders/bulk/retry",
            Some(&worker),
            &[],
            Some(&bad),
        );
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text());
    }
}

#[test]
fn the_audit_is_read_a_page_at_a_time_with_before() {
    let service = Service::start(AdmissionConfig::default(), START);
    let worker = service.worker("renders");
    for n in 0..5 {
        assert_eq!(service.enqueue(&worker, TASKS, json!(n)).status, 201);
    }
    let mut events = Vec::new();
    let mut path = "/v1/audit?limit=2".to_owned();
    for _ in 0..10 {
        let page = service.send("GET", &path, Some(&worker), &[], None);
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/audit?limit=2&before={next}"),
            None => break,
        }
    }
    let enqueues = events
        .iter()
        .filter(|event| event["action"] == "enqueue")
        .count();
    assert_eq!(enqueues, 5, "{events:?}");
    let bad = service.send(
        "GET",
        "/v1/audit?before=yesterday",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(bad.status, 400);
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
    for route in tessera_server::routes() {
        let concrete = route
            .path
            .replace("{ns}", "renders")
            .replace("{queue}", "frames")
            .replace("{task}", "t-1")
            .replace("{attempt}", "1")
            .replace("{principal}", "p1")
            .replace("{key_id}", "0000000000000000")
            .replace("{name}", "nightly");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let reply = service.send(method, &concrete, Some(&service.admin), &[], None);
            let fallback = reply.status == 404 && reply.text().contains("not found: route");
            assert!(!fallback, "{method} {concrete} is routed");
            if reply.status != 405 {
                served.insert((route.path.to_owned(), method.to_owned()));
            }
        }
    }
    assert_eq!(documented, served);
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // `GET /v1/keys` answers a list, and the document says so.
    assert_eq!(
        document["paths"]["/v1/keys"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
            ["type"],
        "array"
    );
}

/// The public methods of `Store` (`pub fn` and `pub async fn` directly
/// inside an `impl Store` block), read from the store's source.
fn store_methods(dir: &Path, methods: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            store_methods(&path, methods);
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let mut in_store = false;
        for line in source.lines() {
            if line.starts_with("impl Store {") {
                in_store = true;
            } else if line == "}" {
                in_store = false;
            } else if in_store {
                let name = line
                    .strip_prefix("    pub fn ")
                    .or_else(|| line.strip_prefix("    pub async fn "));
                if let Some(name) = name {
                    let end = name.find(['(', '<']).unwrap();
                    methods.insert(name[..end].to_owned());
                }
            }
        }
    }
}

#[test]
fn every_public_store_operation_has_a_route_or_a_reason() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tessera-store/src");
    let mut methods = std::collections::BTreeSet::new();
    store_methods(&source, &mut methods);
    assert!(
        methods.contains("enqueue") && methods.contains("claim_batch"),
        "{methods:?}"
    );
    let routes = tessera_server::routes();
    let routed: std::collections::BTreeSet<String> = routes
        .iter()
        .filter_map(|route| route.operation.map(str::to_owned))
        .collect();
    let reasoned: std::collections::BTreeSet<String> = tessera_server::NOT_ROUTED
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    let missing: Vec<&String> = methods
        .iter()
        .filter(|method| !routed.contains(*method) && !reasoned.contains(*method))
        .collect();
    assert!(
        missing.is_empty(),
        "public Store methods without a route: {missing:?}"
    );
    let unknown: Vec<&String> = routed
        .union(&reasoned)
        .filter(|name| !methods.contains(*name))
        .collect();
    assert!(
        unknown.is_empty(),
        "named but not Store methods: {unknown:?}"
    );
    assert!(routed.is_disjoint(&reasoned), "routed and excused both");
    for operation in [
        "list_tasks",
        "cancel_task",
        "retry_task",
        "cancel_tasks",
        "retry_tasks",
        "enqueue_batch",
        "claim_batch",
        "audit",
        "health",
        "list_keys",
        "pause_queue",
        "resume_queue",
        "set_queue_limits",
        "queue_settings",
        "put_schedule",
        "list_schedules",
        "pause_schedule",
        "resume_schedule",
        "delete_schedule",
        "fire_due_schedules",
    ] {
        assert!(routed.contains(operation), "{operation} has a route");
    }
}

#[test]
fn schedules_are_put_read_paused_resumed_fired_and_deleted_over_http() {
    let service = Service::start(small_window(), START);
    let worker = service.worker("reports");
    let path = "/v1/ns/reports/schedules/nightly";
    let body = json!({
        "queue": "daily",
        "cron": "*/5 * * * *",
        "brief": { "report": "sales" },
        "priority": 1,
    });
    let reply = service.send("PUT", path, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 201, "{}", reply.text());
    let view = reply.json();
    assert_eq!(
        view["schedule"],
        json!({ "cron": "*/5 * * * *", "zone": "UTC" })
    );
    assert_eq!(view["next_run_at"], "2026-10-29T12:05:00Z");
    assert_eq!(view["paused"], false);
    // The same name again replaces it.
    let body = json!({
        "queue": "daily",
        "cron": "0 * * * *",
        "zone": "Europe/Stockholm",
        "brief": { "report": "hourly" },
    });
    let reply = service.send("PUT", path, Some(&worker), &[], Some(&body));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["brief"]["value"]["report"], "hourly");
    // Bad cron or zone: 400, typed.
    for (cron, zone) in [("61 * * * *", "UTC"), ("* * * * *", "Mars/Olympus")] {
        let bad = json!({ "queue": "daily", "cron": cron, "zone": zone, "brief": 1 });
        let reply = service.send("PUT", path, Some(&worker), &[], Some(&bad));
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert_eq!(reply.error_code(), "invalid_input");
    }
    let reply = service.send("GET", path, Some(&worker), &[], None);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["schedule"]["zone"], "Europe/Stockholm");
    let reply = service.send(
        "GET",
        "/v1/ns/reports/schedules?limit=10",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(reply.json()["next"], Value::Null);

    let reply = service.send("POST", &format!("{path}/pause"), Some(&worker), &[], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["paused"], true);
    service.clock.advance(Duration::from_secs(3600));
    let fire = "/v1/schedules/fire";
    let reply = service.send("POST", fire, Some(&service.admin), &[], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json(), json!([]), "paused: nothing fires");
    let reply = service.send("POST", &format!("{path}/resume"), Some(&worker), &[], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["paused"], false);
    service.clock.advance(Duration::from_secs(3600));
    // A pass is an admin's.
    let reply = service.send("POST", fire, Some(&worker), &[], None);
    assert_eq!(reply.status, 403, "{}", reply.text());
    let reply = service.send("POST", fire, Some(&service.admin), &[], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let fired = reply.json();
    assert_eq!(fired.as_array().unwrap().len(), 1, "{fired}");
    assert_eq!(fired[0]["run_at"], "2026-10-29T14:00:00Z");
    let reply = service.send("POST", fire, Some(&service.admin), &[], None);
    assert_eq!(reply.json(), json!([]), "each run-at fires once");
    let reply = service.claim(&worker, "/v1/ns/reports/queues/daily/claims");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["task"]["id"], fired[0]["task"]["id"]);

    let reply = service.send("DELETE", path, Some(&worker), &[], None);
    assert_eq!(reply.status, 204, "{}", reply.text());
    let reply = service.send("GET", path, Some(&worker), &[], None);
    assert_eq!(reply.status, 404);
    let reply = service.send("DELETE", path, Some(&worker), &[], None);
    assert_eq!(reply.status, 404);
}

// ---- the program ----

const PROGRAM: &str = env!("CARGO_BIN_EXE_tessera-server");

#[test]
fn the_program_explains_its_flags() {
    let help = std::process::Command::new(PROGRAM)
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
        "--long-poll-max",
        "--no-scheduler",
    ] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
    let wrong = std::process::Command::new(PROGRAM)
        .args(["--port", "many"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(2));
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        said.contains("invalid value 'many' for '--port <PORT>'"),
        "{said}"
    );
    // The usual conventions: --flag=value, a host name, --version, and
    // every flag from the environment.
    let version = std::process::Command::new(PROGRAM)
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success(), "{version:?}");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("tessera-server "));
    let from_env = std::process::Command::new(PROGRAM)
        .env("TESSERA_PORT", "many")
        .output()
        .unwrap();
    assert_eq!(from_env.status.code(), Some(2), "{from_env:?}");
    let setting = std::process::Command::new(PROGRAM)
        .env("TESSERA_CLAIM_MAX_PENDING", "abc")
        .output()
        .unwrap();
    assert_eq!(setting.status.code(), Some(2), "{setting:?}");
    let said = String::from_utf8_lossy(&setting.stderr);
    assert!(
        said.contains("tessera-server: TESSERA_CLAIM_MAX_PENDING") && said.contains("\"abc\""),
        "{said}"
    );
}

/// A `tessera-server` process of its own.
struct Process {
    child: std::process::Child,
    address: SocketAddr,
    admin: String,
    /// The start-up line, after the address.
    database: String,
}

impl Process {
    fn start(backend: &[&str], key_file: &Path) -> Self {
        Self::start_logging(backend, key_file, std::process::Stdio::null())
    }

    /// [`start`](Self::start) with its log lines to `stderr`.
    fn start_logging(backend: &[&str], key_file: &Path, stderr: std::process::Stdio) -> Self {
        let mut child = std::process::Command::new(PROGRAM)
            .args(["--port", "0"])
            .args(backend)
            .arg("--admin-key-file")
            .arg(key_file)
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let mut said = |prefix: &str| loop {
            let line = lines.next().expect("the server printed").unwrap();
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        };
        let started = said("tessera-server listening on http://");
        let (address, database) = started.split_once(", ").expect("address, database");
        let (address, database) = (address.parse().unwrap(), database.to_owned());
        let admin = said("admin key: ");
        let admin = if admin.starts_with("kept in") {
            std::fs::read_to_string(key_file).unwrap()
        } else {
            admin.split_whitespace().next().unwrap().to_owned()
        };
        // Nothing more is read: stdout is left to the pipe, which the
        // last lines ("shut down") fit.
        std::mem::forget(lines);
        Self {
            child,
            address,
            admin,
            database,
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn each_request_is_one_json_access_line_and_the_scrape_has_its_families() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key_file) = (dir.path().join("t.db"), dir.path().join("admin.key"));
    let log = dir.path().join("stderr.log");
    let stderr = std::fs::File::create(&log).unwrap();
    let process = Process::start_logging(
        &["--db", db.to_str().unwrap(), "--log-format", "json"],
        &key_file,
        stderr.into(),
    );
    let worker = make_worker(process.address, &process.admin, "renders");
    let enqueued = send(
        process.address,
        "POST",
        TASKS,
        Some(&worker),
        &[],
        Some(&json!({ "brief": 1 })),
    );
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());
    let health = send(
        process.address,
        "GET",
        "/v1/ns/renders/health",
        Some(&worker),
        &[],
        None,
    );
    assert_eq!(health.status, 200, "{}", health.text());
    // A client's own method name is counted as `other`.
    let mut stream = std::net::TcpStream::connect(process.address).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"FROB /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let odd = read_until_closed(&mut stream);
    assert!(odd.starts_with("HTTP/1.1 405"), "{odd}");
    let scrape = send(process.address, "GET", "/metrics", None, &[], None).text();
    for family in [
        "# HELP tessera_http_requests_total",
        "# TYPE tessera_http_requests_total counter",
        "tessera_http_requests_total{method=\"POST\",route=\"/v1/ns/{ns}/queues/{queue}/tasks\",status=\"201\"} 1",
        "# TYPE tessera_http_request_duration_seconds histogram",
        "tessera_http_request_duration_seconds_bucket{",
        "# TYPE tessera_retention_tasks_purged_total counter",
        "tessera_attempts{namespace=\"renders\",state=\"ready\"} 1",
        "# TYPE tessera_queue_depth gauge",
        "tessera_queue_depth{namespace=\"renders\",queue=\"frames\",state=\"ready\"} 1",
        "tessera_queue_depth{namespace=\"renders\",queue=\"frames\",state=\"leased\"} 0",
        "tessera_http_requests_total{method=\"other\",route=\"/healthz\",status=\"405\"} 1",
    ] {
        assert!(scrape.contains(family), "{family} in:\n{scrape}");
    }
    assert!(!scrape.contains("FROB"), "{scrape}");
    // A write drops the namespace's snapshot: until health is read again,
    // the depth keeps its last figures rather than reading 0.
    let claimed = send(process.address, "POST", CLAIMS, Some(&worker), &[], None);
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    let scrape = send(process.address, "GET", "/metrics", None, &[], None).text();
    let ready = "tessera_queue_depth{namespace=\"renders\",queue=\"frames\",state=\"ready\"} 1";
    assert!(scrape.contains(ready), "{ready} in:\n{scrape}");
    send(
        process.address,
        "GET",
        "/v1/ns/renders/health",
        Some(&worker),
        &[],
        None,
    );
    let scrape = send(process.address, "GET", "/metrics", None, &[], None).text();
    for family in [
        "tessera_queue_depth{namespace=\"renders\",queue=\"frames\",state=\"ready\"} 0",
        "tessera_queue_depth{namespace=\"renders\",queue=\"frames\",state=\"leased\"} 1",
    ] {
        assert!(scrape.contains(family), "{family} in:\n{scrape}");
    }
    assert!(process.terminate().success());
    let lines = std::fs::read_to_string(&log).unwrap();
    let access: Vec<Value> = lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "tessera_server::access")
        .collect();
    let posted = access
        .iter()
        .find(|line| line["route"] == "/v1/ns/{ns}/queues/{queue}/tasks")
        .unwrap_or_else(|| panic!("an access line for the enqueue in:\n{lines}"));
    assert_eq!(
        (&posted["method"], &posted["status"]),
        (&json!("POST"), &json!(201))
    );
    assert!(posted["duration_ms"].as_f64().is_some(), "{posted}");
    // The key's public id, never its secret.
    let id = &worker[4..20];
    assert_eq!(posted["key"], id);
    assert!(!lines.contains(&worker), "a secret in the log");
}

#[test]
#[cfg_attr(no_curl, ignore = "needs curl on the PATH")]
fn the_readme_walkthrough_runs_from_an_admin_key_to_a_receipt() {
    let readme = include_str!("../README.md");
    let block = readme
        .split_once("<!-- walkthrough: begins -->")
        .and_then(|(_, rest)| rest.split_once("<!-- walkthrough: ends -->"))
        .map(|(block, _)| block)
        .expect("the README's walkthrough");
    let script = block
        .trim()
        .strip_prefix("```sh")
        .and_then(|rest| rest.strip_suffix("```"))
        .expect("a sh block");
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("tessera-admin.key");
    let process = Process::start(
        &["--db", dir.path().join("t.db").to_str().unwrap()],
        &key_file,
    );
    let ran = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir.path())
        .env("BASE", format!("http://{}", process.address))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(said.contains(r#""output":{"pixels":42}"#), "{said}");
}

#[test]
fn the_admin_key_is_made_once_and_another_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key_file) = (dir.path().join("t.db"), dir.path().join("admin.key"));
    let backend = ["--db", db.to_str().unwrap()];
    let first = Process::start(&backend, &key_file);
    let secret = std::fs::read_to_string(&key_file).unwrap();
    assert_eq!(first.admin, secret);
    assert!(first.database.starts_with("SQLite "), "{}", first.database);
    assert!(first.database.ends_with("t.db"), "{}", first.database);
    drop(first);
    let second = Process::start(&backend, &key_file);
    assert_eq!(second.admin, secret, "kept, not made again");
    drop(second);
    let mut args = backend.to_vec();
    args.push("--new-admin-key");
    let third = Process::start(&args, &key_file);
    let another = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(another, secret);
    assert_eq!(third.admin, another);
    // It rotates: the old key no longer works, the new one does.
    let keys = |key: &str| send(third.address, "GET", "/v1/keys", Some(key), &[], None).status;
    assert_eq!(keys(&secret), 401);
    assert_eq!(keys(&another), 200);
    drop(third);
    // A key file that cannot be written stops the start with its path,
    // and makes no key.
    let nowhere = dir.path().join("missing-dir").join("admin.key");
    let failed = std::process::Command::new(PROGRAM)
        .args([
            "--port",
            "0",
            "--db",
            db.to_str().unwrap(),
            "--new-admin-key",
        ])
        .arg("--admin-key-file")
        .arg(&nowhere)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains(&nowhere.display().to_string()), "{said}");
    let fourth = Process::start(&backend, &key_file);
    let listed = send(fourth.address, "GET", "/v1/keys", Some(&another), &[], None);
    let admins = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| key["revoked_at"].is_null())
        .count();
    assert_eq!(admins, 1, "{}", listed.text());
}

#[test]
fn a_database_that_cannot_be_opened_is_named_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("no-such-dir").join("t.db");
    let failed = std::process::Command::new(PROGRAM)
        .args(["--port", "0", "--db", db.to_str().unwrap()])
        .arg("--admin-key-file")
        .arg(dir.path().join("admin.key"))
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("cannot open SQLite"), "{said}");
    assert!(said.contains(&db.display().to_string()), "{said}");
    assert!(
        said.trim_end().len() > "tessera-server: storage error".len(),
        "{said}"
    );
    let refused = std::process::Command::new(PROGRAM)
        .args([
            "--port",
            "0",
            "--postgres",
            "postgres://nobody:wrong@127.0.0.1:1/none?connect_timeout=2",
        ])
        .arg("--admin-key-file")
        .arg(dir.path().join("admin2.key"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("cannot open PostgreSQL postgres://nobody@127.0.0.1:1/none"),
        "{said}"
    );
    assert!(said.contains("Connection refused"), "the cause in {said}");
    assert!(!said.contains("wrong"), "a password in {said}");
}

/// Enqueues from four clients until the server stops answering, SIGTERMs
/// it while they run, and returns the exit status and every task id the
/// server acknowledged (`201`).
fn terminate_under_load(process: Process) -> (std::process::ExitStatus, Vec<String>, String) {
    let worker = make_worker(process.address, &process.admin, "renders");
    let address = process.address;
    let acknowledged = std::sync::Mutex::new(Vec::new());
    let status = std::thread::scope(|scope| {
        for client in 0..4 {
            let (worker, acknowledged) = (&worker, &acknowledged);
            scope.spawn(move || {
                let agent = agent(Duration::from_secs(30));
                for n in 0.. {
                    let id = format!("c{client}-{n}");
                    let body = json!({ "brief": { "n": n }, "id": id }).to_string();
                    let reply = try_send(
                        &agent,
                        address,
                        "POST",
                        TASKS,
                        Some(worker),
                        &[],
                        Some(("application/json", body.into_bytes())),
                    );
                    match reply {
                        Ok(reply) if reply.status == 201 => acknowledged.lock().unwrap().push(id),
                        Ok(reply) => assert_eq!(reply.status, 503, "{}", reply.text()),
                        Err(_) => return,
                    }
                }
            });
        }
        // Some writes are acknowledged before the signal.
        let deadline = Instant::now() + Duration::from_secs(60);
        while acknowledged.lock().unwrap().len() < 20 {
            assert!(Instant::now() < deadline, "the server acknowledges writes");
            std::thread::yield_now();
        }
        process.terminate()
    });
    (status, acknowledged.into_inner().unwrap(), worker)
}

/// Every id in `acknowledged` is a task of `store`.
fn all_there(store: &Store, worker: &str, acknowledged: &[String]) {
    let caller = store.authenticate(Some(worker)).unwrap();
    for id in acknowledged {
        let task = tessera_store::TaskRef::new(
            Namespace::parse("renders").unwrap(),
            tessera_store::TaskId::parse(id).unwrap(),
            tessera_store::BriefVersion::FIRST,
        );
        store
            .read_task(&caller, &task)
            .unwrap_or_else(|error| panic!("acknowledged {id} is lost: {error}"));
    }
}

#[test]
fn sigterm_on_sqlite_exits_0_and_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key_file) = (dir.path().join("t.db"), dir.path().join("admin.key"));
    let process = Process::start(&["--db", db.to_str().unwrap()], &key_file);
    let (status, acknowledged, worker) = terminate_under_load(process);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let idle = Process::start(&["--db", db.to_str().unwrap()], &key_file);
    assert_eq!(idle.terminate().code(), Some(0));
    let store = Store::open(&db, StoreConfig::default()).unwrap();
    all_there(&store, &worker, &acknowledged);
}

#[test]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn sigterm_on_postgres_exits_0_and_keeps_every_acknowledged_write() {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL").expect("TESSERA_TEST_POSTGRES_URL");
    let schema = format!("server_sigterm_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("admin.key");
    let process = Process::start(&["--postgres", &url, "--schema", &schema], &key_file);
    assert!(
        process.database.starts_with("PostgreSQL "),
        "{}",
        process.database
    );
    assert!(
        !process.database.contains(":postgres@"),
        "no password: {}",
        process.database
    );
    let (status, acknowledged, worker) = terminate_under_load(process);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let options =
        tessera_store::postgres::PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
    // Idle since it started when the signal comes: the store's last
    // handle, and its connection pool's, is the program's own.
    // Whether the pool is dropped on the program's own thread depends on
    // timing, so a few starts.
    for _ in 0..3 {
        let idle = Process::start(&["--postgres", &url, "--schema", &schema], &key_file);
        assert_eq!(idle.terminate().code(), Some(0));
    }
    let store = Store::open_postgres(options, StoreConfig::default()).unwrap();
    all_there(&store, &worker, &acknowledged);
    drop(store);
    drop_schema(&url, &schema);
}

fn drop_schema(url: &str, schema: &str) {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

#[test]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn two_servers_on_one_postgres_database_never_lease_a_task_twice() {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL").expect("TESSERA_TEST_POSTGRES_URL");
    let schema = format!("server_two_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let backend = ["--postgres", url.as_str(), "--schema", schema.as_str()];
    let services = [
        Process::start(&backend, &dir.path().join("a.key")),
        Process::start(&backend, &dir.path().join("b.key")),
    ];
    const COUNT: usize = 200;
    let worker = make_worker(services[0].address, &services[0].admin, "renders");
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
    // what it is granted through the other; every grant is recorded.
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
                        let other = services[(turn + 1) % 2].address;
                        let headers = [("idempotency-key", key.as_str())];
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
    let mut tasks: Vec<&str> = grants.iter().map(|(id, _)| id.as_str()).collect();
    tasks.sort_unstable();
    tasks.dedup();
    assert_eq!(tasks.len(), grants.len(), "a task was leased twice");
    assert_eq!(grants.len(), COUNT, "every task was leased once");
    for service in services {
        assert_eq!(service.terminate().code(), Some(0));
    }
    drop_schema(&url, &schema);
}
