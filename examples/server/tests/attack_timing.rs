//! Attack tests of the timing routes over HTTP and MCP, written from the
//! OpenAPI document and the docs alone: per-task `lease_ms`, `deadline`
//! and `timeout_ms`, snooze, and per-queue retention.
//!
//! Each test runs the `tessera-server` binary on a SQLite file in a
//! temporary directory and, when `TESSERA_TEST_POSTGRES_URL` is set, on
//! PostgreSQL in a fresh schema of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

struct Server {
    name: &'static str,
    child: Child,
    addr: String,
    admin: String,
    pg: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((url, schema)) = &self.pg {
            if let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) {
                let _ =
                    client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
            }
        }
    }
}

fn start(kind: &'static str) -> Option<Server> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera-server"));
    cmd.arg("--port")
        .arg("0")
        .arg("--admin-key-file")
        .arg(dir.path().join("admin.key"));
    let mut pg = None;
    match kind {
        "sqlite" => {
            cmd.arg("--db").arg(dir.path().join("t.db"));
        }
        "postgres" => {
            let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
                .ok()
                .filter(|u| !u.is_empty())?;
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let schema = format!("atks_{}_{}", std::process::id(), nanos % 1_000_000_000);
            cmd.arg("--postgres").arg(&url).arg("--schema").arg(&schema);
            pg = Some((url, schema));
        }
        _ => return None,
    }
    cmd.env_remove("TESSERA_POSTGRES_URL");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut addr, mut admin) = (None, None);
    let mut line = String::new();
    while addr.is_none() || admin.is_none() {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("[{kind}] server exited before it listened");
        }
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = Some(rest.split([',', ' ', '\n']).next().unwrap().to_owned());
        }
        if let Some(rest) = line.strip_prefix("admin key: ") {
            admin = Some(rest.split_whitespace().next().unwrap().to_owned());
        }
    }
    // Keep draining stdout so the server never blocks on it.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    Some(Server {
        name: kind,
        child,
        addr: addr.unwrap(),
        admin: admin.unwrap(),
        pg,
        _dir: dir,
    })
}

fn each(test: impl Fn(&Server)) {
    let mut failures = Vec::new();
    for kind in ["sqlite", "postgres"] {
        if let Some(server) = start(kind) {
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&server)));
            if let Err(payload) = got {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failures.push(format!("{kind}: {msg}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failed on {} backend(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }
}

impl Server {
    fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Reply {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        if let Some(k) = key {
            req.push_str(&format!("Authorization: Bearer {k}\r\n"));
        }
        for (h, v) in headers {
            req.push_str(&format!("{h}: {v}\r\n"));
        }
        let body = body.unwrap_or("");
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        Reply { status, body }
    }
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        self.raw(
            method,
            path,
            Some(&self.admin),
            &[("Content-Type", "application/json")],
            body,
        )
    }
    fn call_as(&self, key: &str, method: &str, path: &str, body: Option<&str>) -> Reply {
        self.raw(
            method,
            path,
            Some(key),
            &[("Content-Type", "application/json")],
            body,
        )
    }
    fn enqueue(&self, queue: &str, body: Value) -> Reply {
        self.call(
            "POST",
            &format!("/v1/ns/atk/queues/{queue}/tasks"),
            Some(&body.to_string()),
        )
    }
    fn claim(&self, queue: &str) -> Reply {
        self.call("POST", &format!("/v1/ns/atk/queues/{queue}/claims"), None)
    }
    fn key(&self, scopes: &[&str]) -> String {
        let r = self.call(
            "POST",
            "/v1/keys",
            Some(
                &json!({"account": "w", "scopes": scopes, "grants": ["namespace:atk"]}).to_string(),
            ),
        );
        assert!(
            r.status == 200 || r.status == 201,
            "[{}] key: {} {}",
            self.name,
            r.status,
            r.body
        );
        let v = r.json();
        v["secret"]
            .as_str()
            .or_else(|| v["key"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("key reply {v}"))
    }
    fn mcp(&self, name: &str, args: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}});
        let r = self.raw(
            "POST",
            "/mcp",
            Some(&self.admin),
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ],
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 200, "[{}] mcp {name}: {}", self.name, r.body);
        r.json()["result"].clone()
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = s.split_once("\r\n") else {
            break;
        };
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n..];
        s = s.strip_prefix("\r\n").unwrap_or(s);
    }
    out
}

fn ms_between(a: &Value, b: &Value) -> i64 {
    let a: chrono::DateTime<chrono::Utc> = a.as_str().unwrap().parse().unwrap();
    let b: chrono::DateTime<chrono::Utc> = b.as_str().unwrap().parse().unwrap();
    (b - a).num_milliseconds()
}

/// Bad timing fields on enqueue: each 400 invalid_input with the error
/// body, never a 5xx, never accepted.
#[test]
fn http_enqueue_rejects_bad_timing_fields() {
    each(|s| {
        let past = "2020-01-01T00:00:00Z";
        let bodies = [
            json!({"brief": 1, "lease_ms": 0}),
            json!({"brief": 1, "lease_ms": -1}),
            json!({"brief": 1, "lease_ms": 86_400_001}),
            json!({"brief": 1, "lease_ms": 1.5}),
            json!({"brief": 1, "lease_ms": "5"}),
            json!({"brief": 1, "lease_ms": u64::MAX}),
            json!({"brief": 1, "timeout_ms": 0}),
            json!({"brief": 1, "timeout_ms": -5}),
            json!({"brief": 1, "timeout_ms": 316_224_000_001_i64}),
            json!({"brief": 1, "timeout_ms": i64::MAX}),
            json!({"brief": 1, "deadline": past}),
            json!({"brief": 1, "deadline": "soon"}),
            json!({"brief": 1, "deadline": 12345}),
            json!({"brief": 1, "deadline": "2030-01-01"}),
            json!({"brief": 1, "deadline": "+275760-09-13T00:00:00Z"}),
            json!({"brief": 1, "deadline": "2040-01-01T00:00:00Z", "not_before": "2040-01-01T00:00:00Z"}),
            json!({"brief": 1, "deadline": "2040-01-01T00:00:00Z", "not_before": "2041-01-01T00:00:00Z"}),
            json!({"brief": 1, "timeout_ms": 1000, "not_before": "2041-01-01T00:00:00Z"}),
            json!({"brief": 1, "timeout_ms": 60_000, "deadline": past}),
            json!({"brief": 1, "lease": 5000}),
            json!({"brief": 1, "timeout": 5000}),
            json!([]),
            json!(null),
            json!([{"brief": 1}]),
        ];
        for b in bodies {
            let r = s.enqueue("v", b.clone());
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "invalid_input"),
                "[{}] {b}: {} {}",
                s.name,
                r.status,
                r.body
            );
        }
        // Batches: one bad task, none in.
        let r = s.call(
            "POST",
            "/v1/ns/atk/queues/v/tasks/batch",
            Some(
                &json!({"tasks": [{"brief": 1, "id": "okb"}, {"brief": 2, "lease_ms": 0}]})
                    .to_string(),
            ),
        );
        assert_eq!(r.status, 400, "[{}] batch {}", s.name, r.body);
        assert_eq!(
            s.call("GET", "/v1/ns/atk/tasks/okb", None).status,
            404,
            "[{}]",
            s.name
        );
        // Nothing got in.
        assert_eq!(
            s.claim("v").status,
            204,
            "[{}] a refused task was enqueued",
            s.name
        );
    });
}

/// Edge values are accepted and every claim path on them answers without
/// a 5xx.
#[test]
fn http_enqueue_accepts_edges() {
    each(|s| {
        let bodies = [
            json!({"brief": 1, "lease_ms": 1}),
            json!({"brief": 1, "lease_ms": 86_400_000}),
            json!({"brief": 1, "timeout_ms": 316_224_000_000_i64}),
            json!({"brief": 1, "deadline": "9999-12-31T23:59:59.999Z"}),
            json!({"brief": 1, "deadline": "2040-01-01T00:00:00+02:00"}),
            json!({"brief": 1, "deadline": null, "lease_ms": null, "timeout_ms": null}),
        ];
        for b in bodies {
            let r = s.enqueue("e", b.clone());
            assert_eq!(r.status, 201, "[{}] {b}: {}", s.name, r.body);
        }
        let r = s.call(
            "POST",
            "/v1/ns/atk/queues/e/claims/batch",
            Some(&json!({"count": 3}).to_string()),
        );
        assert_eq!(r.status, 200, "[{}] batch claim {}", s.name, r.body);
        for _ in 0..4 {
            let r = s.claim("e");
            assert!(
                r.status == 200 || r.status == 204,
                "[{}] claim {} {}",
                s.name,
                r.status,
                r.body
            );
            if r.status == 200 {
                let v = r.json();
                let t = v["task"]["id"].as_str().unwrap();
                let hb = s.call(
                    "POST",
                    &format!("/v1/ns/atk/tasks/{t}/heartbeat"),
                    Some(&json!({"version": 1, "token": v["lease"]["token"]}).to_string()),
                );
                assert!(
                    hb.status == 200 || hb.status == 409,
                    "[{}] heartbeat {} {}",
                    s.name,
                    hb.status,
                    hb.body
                );
            }
        }
    });
}

/// lease_ms sets the lease of the claim and of each heartbeat; a deadline
/// caps both; past the deadline nothing is granted and the attempt is
/// discarded with deadline_exceeded.
#[test]
fn http_lease_ms_and_deadline_applied() {
    each(|s| {
        s.enqueue("l", json!({"brief": 1, "id": "own", "lease_ms": 4000}));
        let c = s.claim("l").json();
        assert_eq!(
            ms_between(&c["lease"]["granted_at"], &c["lease"]["expires_at"]),
            4000,
            "[{}] {c}",
            s.name
        );
        std::thread::sleep(Duration::from_millis(200));
        let hb = s.call(
            "POST",
            "/v1/ns/atk/tasks/own/heartbeat",
            Some(&json!({"version": 1, "token": c["lease"]["token"]}).to_string()),
        );
        assert_eq!(hb.status, 200, "[{}] {}", s.name, hb.body);
        let ext = ms_between(&c["lease"]["granted_at"], &hb.json()["expires_at"]);
        assert!(
            (4000..5500).contains(&ext),
            "[{}] heartbeat extended to granted+{ext} ms (lease_ms 4000): {}",
            s.name,
            hb.body
        );

        s.enqueue(
            "d",
            json!({"brief": 1, "id": "dl", "lease_ms": 60_000, "timeout_ms": 1500}),
        );
        let task = s.call("GET", "/v1/ns/atk/tasks/dl", None).json();
        let deadline = task["record"]["deadline"].clone();
        let c = s.claim("d").json();
        assert_eq!(
            c["lease"]["expires_at"], deadline,
            "[{}] lease not capped at the deadline: {c} vs {deadline}",
            s.name
        );
        let hb = s.call(
            "POST",
            "/v1/ns/atk/tasks/dl/heartbeat",
            Some(&json!({"version": 1, "token": c["lease"]["token"]}).to_string()),
        );
        assert!(
            ms_between(&hb.json()["expires_at"], &deadline) >= 0,
            "[{}] heartbeat past the deadline: {}",
            s.name,
            hb.body
        );
        std::thread::sleep(Duration::from_millis(1600));
        let sb = s.raw(
            "POST",
            "/v1/ns/atk/tasks/dl/submit",
            Some(&s.admin),
            &[
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "k1"),
            ],
            Some(&json!({"version": 1, "token": c["lease"]["token"], "output": 1}).to_string()),
        );
        assert_eq!(
            sb.status, 409,
            "[{}] submit after the deadline: {}",
            s.name, sb.body
        );
        assert_eq!(s.claim("d").status, 204, "[{}]", s.name);
        let task = s.call("GET", "/v1/ns/atk/tasks/dl", None);
        assert!(
            task.body.contains("deadline_exceeded"),
            "[{}] {}",
            s.name,
            task.body
        );
    });
}

/// Snooze: input checks, fencing, idempotent retries, no try spent.
#[test]
fn http_snooze() {
    each(|s| {
        s.enqueue("s", json!({"brief": 1, "id": "sz", "max_tries": 1}));
        let c = s.claim("s").json();
        let tok = c["lease"]["token"].clone();
        let path = "/v1/ns/atk/tasks/sz/snooze";
        for b in [
            json!({}),
            json!({"version": 1, "token": tok}),
            json!({"version": 1, "token": tok, "delay_ms": -1}),
            json!({"version": 1, "token": tok, "delay_ms": 604_800_001}),
            json!({"version": 1, "token": tok, "delay_ms": null}),
            json!({"version": 1, "token": tok, "delay_ms": 1.5}),
            json!({"version": 1, "token": tok, "delay_ms": "1"}),
            json!({"version": 1, "token": 0, "delay_ms": 0}),
            json!({"version": 1, "token": tok, "delay_ms": 0, "extra": 1}),
            json!([]),
            json!(null),
        ] {
            let r = s.call("POST", path, Some(&b.to_string()));
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "invalid_input"),
                "[{}] {b}: {}",
                s.name,
                r.body
            );
        }
        let r = s.call(
            "POST",
            path,
            Some(&json!({"version": 1, "token": 7, "delay_ms": 0}).to_string()),
        );
        assert_eq!(r.status, 409, "[{}] unknown token {}", s.name, r.body);
        let first = s.call(
            "POST",
            path,
            Some(&json!({"version": 1, "token": tok, "delay_ms": 300}).to_string()),
        );
        assert_eq!(first.status, 200, "[{}] {}", s.name, first.body);
        assert_eq!(
            first.json()["state"]["state"],
            "backoff",
            "[{}] {}",
            s.name,
            first.body
        );
        let again = s.call(
            "POST",
            path,
            Some(&json!({"version": 1, "token": tok, "delay_ms": 60_000}).to_string()),
        );
        assert_eq!(
            (again.status, again.json()),
            (200, first.json()),
            "[{}] retried snooze {}",
            s.name,
            again.body
        );
        let hb = s.call(
            "POST",
            "/v1/ns/atk/tasks/sz/heartbeat",
            Some(&json!({"version": 1, "token": tok}).to_string()),
        );
        assert_eq!(
            hb.status, 409,
            "[{}] heartbeat after snooze {}",
            s.name, hb.body
        );
        std::thread::sleep(Duration::from_millis(350));
        let c2 = s.claim("s");
        assert_eq!(
            c2.status, 200,
            "[{}] one-try task not claimable after snooze: {}",
            s.name, c2.body
        );
        let tok2 = c2.json()["lease"]["token"].clone();
        assert_ne!(tok2, tok);
        // The old token now: 409, and the new lease untouched.
        let stale = s.call(
            "POST",
            path,
            Some(&json!({"version": 1, "token": tok, "delay_ms": 0}).to_string()),
        );
        assert_eq!(
            stale.status, 409,
            "[{}] stale snooze {}",
            s.name, stale.body
        );
        let hb = s.call(
            "POST",
            "/v1/ns/atk/tasks/sz/heartbeat",
            Some(&json!({"version": 1, "token": tok2}).to_string()),
        );
        assert_eq!(hb.status, 200, "[{}] {}", s.name, hb.body);
        // Claim-less key: 403.
        let reader = s.key(&["read"]);
        let r = s.call_as(
            &reader,
            "POST",
            path,
            Some(&json!({"version": 1, "token": tok2, "delay_ms": 0}).to_string()),
        );
        assert_eq!(r.status, 403, "[{}] {}", s.name, r.body);
        // Audited.
        let audit = s.call("GET", "/v1/audit?limit=100", None);
        assert!(
            audit.body.contains("\"snooze\""),
            "[{}] no snooze audit row: {}",
            s.name,
            &audit.body[..audit.body.len().min(500)]
        );
    });
}

/// Retention routes: validation, permissions, reset.
#[test]
fn http_queue_retention_routes() {
    each(|s| {
        let path = "/v1/ns/atk/queues/r/retention";
        for b in [
            "{}",
            r#"{"done":1000}"#,
            r#"{"done":-1,"discarded":null,"cancelled":null}"#,
            r#"{"done":316224000001,"discarded":null,"cancelled":null}"#,
            r#"{"done":1.5,"discarded":null,"cancelled":null}"#,
            r#"{"done":"1","discarded":null,"cancelled":null}"#,
            r#"{"done":1,"discarded":1,"cancelled":1,"extra":1}"#,
            "[]",
            "null",
            "",
            r#"[{"done":1,"discarded":1,"cancelled":1}]"#,
        ] {
            let r = s.call("PUT", path, Some(b));
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "invalid_input"),
                "[{}] {b}: {}",
                s.name,
                r.body
            );
        }
        let r = s.call(
            "PUT",
            path,
            Some(r#"{"done":null,"discarded":0,"cancelled":316224000000}"#),
        );
        assert_eq!(r.status, 200, "[{}] {}", s.name, r.body);
        assert_eq!(
            r.json(),
            json!({"queue": "r", "retention": {"done": null, "discarded": 0, "cancelled": 316_224_000_000_i64}, "own": true})
        );
        assert_eq!(s.call("GET", path, None).json(), r.json(), "[{}]", s.name);
        let other_ns = s.call("GET", "/v1/ns/atk2/queues/r/retention", None).json();
        assert_eq!(
            other_ns["own"], false,
            "[{}] override leaked into another namespace: {other_ns}",
            s.name
        );
        let d = s.call("DELETE", path, None);
        assert_eq!(d.json()["own"], false, "[{}] {}", s.name, d.body);
        assert_eq!(
            d.json()["retention"],
            json!({"done": 86_400_000, "discarded": 604_800_000, "cancelled": 604_800_000})
        );
        // Permissions.
        let claimer = s.key(&["claim"]);
        let reader = s.key(&["read"]);
        let body = Some(r#"{"done":1,"discarded":1,"cancelled":1}"#);
        assert_eq!(
            s.call_as(&claimer, "PUT", path, body).status,
            403,
            "[{}]",
            s.name
        );
        assert_eq!(
            s.call_as(&claimer, "GET", path, None).status,
            403,
            "[{}]",
            s.name
        );
        assert_eq!(
            s.call_as(&reader, "PUT", path, body).status,
            403,
            "[{}]",
            s.name
        );
        assert_eq!(
            s.call_as(&reader, "DELETE", path, None).status,
            403,
            "[{}]",
            s.name
        );
        assert_eq!(
            s.call_as(&reader, "GET", path, None).status,
            200,
            "[{}]",
            s.name
        );
        assert_eq!(
            s.raw(
                "PUT",
                path,
                None,
                &[("Content-Type", "application/json")],
                body
            )
            .status,
            401
        );
    });
}

/// MCP: the new enqueue arguments and the snooze tool; tool arguments
/// outside a tool's inputSchema (additionalProperties: false) are refused
/// as HTTP refuses them.
#[test]
fn mcp_timing_tools() {
    each(|s| {
        for args in [
            json!({"namespace": "atk", "queue": "m", "brief": 1, "lease_ms": 0}),
            json!({"namespace": "atk", "queue": "m", "brief": 1, "lease_ms": 86_400_001}),
            json!({"namespace": "atk", "queue": "m", "brief": 1, "timeout_ms": 0}),
            json!({"namespace": "atk", "queue": "m", "brief": 1, "deadline": "2020-01-01T00:00:00Z"}),
            json!({"namespace": "atk", "queue": "m", "brief": 1, "deadline": "nope"}),
        ] {
            let r = s.mcp("enqueue", args.clone());
            assert_eq!(r["isError"], true, "[{}] {args}: {r}", s.name);
            assert_eq!(
                r["structuredContent"]["code"], "invalid_input",
                "[{}] {args}: {r}",
                s.name
            );
        }
        let r = s.mcp("enqueue", json!({"namespace": "atk", "queue": "m", "brief": 1, "id": "mz", "lease_ms": 3000, "timeout_ms": 600_000}));
        assert_eq!(r["isError"], false, "[{}] {r}", s.name);
        let c = s.mcp("claim", json!({"namespace": "atk", "queue": "m"}));
        let lease = c["structuredContent"]["lease"].clone();
        assert_eq!(
            ms_between(&lease["granted_at"], &lease["expires_at"]),
            3000,
            "[{}] {c}",
            s.name
        );
        let tok = lease["token"].clone();
        let a = s.mcp(
            "snooze",
            json!({"namespace": "atk", "task": "mz", "token": tok, "delay_ms": 50}),
        );
        assert_eq!(a["isError"], false, "[{}] {a}", s.name);
        let b = s.mcp(
            "snooze",
            json!({"namespace": "atk", "task": "mz", "token": tok, "delay_ms": 5000}),
        );
        assert_eq!(
            a["structuredContent"], b["structuredContent"],
            "[{}] retried snooze",
            s.name
        );
        for args in [
            json!({"namespace": "atk", "task": "mz", "token": tok}),
            json!({"namespace": "atk", "task": "mz", "token": tok, "delay_ms": -1}),
            json!({"namespace": "atk", "task": "mz", "token": tok, "delay_ms": 604_800_001}),
            json!([1]),
        ] {
            let r = s.mcp("snooze", args.clone());
            assert_eq!(
                r["structuredContent"]["code"], "invalid_input",
                "[{}] {args}: {r}",
                s.name
            );
        }
        // A misspelt timing argument: refused, not silently dropped.
        let typo = s.mcp("enqueue", json!({"namespace": "atk", "queue": "typo", "brief": 1, "id": "typo", "timeout": 1000, "lease": 5}));
        let dropped = typo["isError"] != true;
        let view = s.call("GET", "/v1/ns/atk/tasks/typo", None).json();
        assert!(
            !dropped,
            "[{}] enqueue tool accepted unknown arguments `timeout`/`lease` (inputSchema has additionalProperties: false; HTTP answers 400): task made with deadline {} and lease {}",
            s.name, view["record"]["deadline"], view["record"]["lease_duration"]
        );
    });
}
