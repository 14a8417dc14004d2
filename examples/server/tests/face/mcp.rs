//! MCP at `/mcp`: what costs nothing, the tools, the error envelope and
//! batches run one call at a time.

use serde_json::{Value, json};
use tessera_store::{AdmissionConfig, Store};

use crate::{Service, config};

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

fn tool(id: u64, name: &str, arguments: Value) -> Value {
    rpc(
        id,
        "tools/call",
        json!({ "name": name, "arguments": arguments }),
    )
}

fn call(service: &Service, key: Option<&str>, message: &Value) -> Value {
    let reply = service.send("POST", "/mcp", key, Some(message));
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

#[test]
fn initialize_ping_tools_list_and_notifications_read_only_the_key() {
    let service = Service::sqlite();
    let worker = service.worker();
    service.store.refuse_writes(true);
    {
        let key = Some(worker.as_str());
        let before = service.store.meter();
        let initialized = call(
            &service,
            key,
            &rpc(
                1,
                "initialize",
                json!({ "protocolVersion": "2025-06-18",
                "capabilities": {}, "clientInfo": { "name": "test", "version": "1" } }),
            ),
        );
        assert_eq!(initialized["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(
            initialized["result"]["serverInfo"]["name"],
            "tessera-server"
        );
        let notified = service.send(
            "POST",
            "/mcp",
            key,
            Some(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })),
        );
        assert_eq!(notified.status, 202);
        assert_eq!(
            call(&service, key, &rpc(2, "ping", json!({})))["result"],
            json!({})
        );
        let listed = call(&service, key, &rpc(3, "tools/list", json!({})));
        let names: Vec<&str> = listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "enqueue",
                "claim",
                "heartbeat",
                "submit",
                "snooze",
                "cancel",
                "list_tasks",
                "health",
                "audit",
                "read_task",
                "alternatives",
                "retry_task",
                "cancel_tasks",
                "retry_tasks",
                "enqueue_batch",
                "pause_queue",
                "resume_queue",
                "set_queue_limits",
                "queue_settings",
                "put_schedule",
                "read_schedule",
                "list_schedules",
                "pause_schedule",
                "resume_schedule",
                "delete_schedule"
            ]
        );
        // A route tool's schema is its route's: path parameters and the
        // body required, nothing else taken.
        let limits = listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == "set_queue_limits")
            .unwrap();
        assert_eq!(
            limits["inputSchema"]["required"],
            json!(["ns", "queue", "body"])
        );
        assert_eq!(limits["inputSchema"]["additionalProperties"], false);
        let batch = json!([rpc(4, "ping", json!({})), rpc(5, "tools/list", json!({}))]);
        assert_eq!(call(&service, key, &batch).as_array().unwrap().len(), 2);
        let cost = service.store.meter().since(&before);
        // Five requests, each reading its key's row and nothing else.
        assert_eq!(cost.rows_written, 0, "key {key:?}");
        assert!(cost.rows_read <= 5 * 2, "{cost:?}");
    }
}

#[test]
fn without_a_working_key_every_message_is_401_naming_the_resource_metadata() {
    let service = Service::sqlite();
    let initialize = rpc(
        1,
        "initialize",
        json!({ "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": { "name": "test", "version": "1" } }),
    );
    for key in [None, Some("not-a-key")] {
        for message in [&initialize, &rpc(2, "tools/list", json!({}))] {
            let reply = service.send("POST", "/mcp", key, Some(message));
            assert_eq!(reply.status, 401, "{}", reply.text());
            assert_eq!(reply.json()["error"]["code"], "unauthorized");
            let challenge = reply.header("www-authenticate").unwrap_or_default();
            assert!(challenge.starts_with("Bearer "), "{challenge}");
            assert!(
                challenge.contains("/.well-known/oauth-protected-resource\""),
                "{challenge}"
            );
        }
    }
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let metadata = service.send("GET", path, None, None);
        assert_eq!(metadata.status, 200, "{}", metadata.text());
        let resource = metadata.json()["resource"].as_str().unwrap().to_owned();
        assert!(resource.ends_with("/mcp"), "{resource}");
        assert_eq!(
            metadata.json()["bearer_methods_supported"],
            json!(["header"])
        );
    }
}

#[test]
fn a_foreign_origin_an_unknown_protocol_version_and_a_long_batch_are_refused() {
    let service = Service::sqlite();
    let worker = service.worker();
    let ping = rpc(1, "ping", json!({}));
    let address = service.address.to_string();
    let evil = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("origin", "http://evil.example")],
        Some(&ping),
    );
    assert_eq!(evil.status, 403, "{}", evil.text());
    assert_eq!(evil.json()["error"]["code"], "origin_refused");
    // A name rebound to this address sends a Host that agrees with it.
    let rebound = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("origin", "http://evil.example"), ("host", "evil.example")],
        Some(&ping),
    );
    assert_eq!(rebound.status, 403, "{}", rebound.text());
    // A JSON-RPC 1.0 call and ids a client could not match are refused.
    for message in [
        json!({ "jsonrpc": "1.0", "id": 1, "method": "ping" }),
        json!({ "jsonrpc": "2.0", "id": { "a": 1 }, "method": "ping" }),
        json!({ "jsonrpc": "2.0", "id": 1.5, "method": "ping" }),
        json!({ "jsonrpc": "2.0", "id": [1], "method": "ping" }),
    ] {
        let answer = call(&service, Some(&worker), &message);
        assert_eq!(answer["error"]["code"], -32600, "{message}: {answer}");
    }
    let answer = call(
        &service,
        Some(&worker),
        &json!({ "jsonrpc": "2.0", "id": "a-1", "method": "ping" }),
    );
    assert_eq!(answer["id"], "a-1", "{answer}");
    let own = format!("http://{address}");
    let same = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("origin", &own)],
        Some(&ping),
    );
    assert_eq!(same.status, 200, "{}", same.text());
    let old = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("mcp-protocol-version", "1999-01-01")],
        Some(&ping),
    );
    assert_eq!(old.status, 400, "{}", old.text());
    let known = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("mcp-protocol-version", "2025-06-18")],
        Some(&ping),
    );
    assert_eq!(known.status, 200, "{}", known.text());
    let long: Vec<Value> = (0..33).map(|n| rpc(n, "ping", json!({}))).collect();
    let refused = call(&service, Some(&worker), &json!(long));
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let most: Vec<Value> = (0..32).map(|n| rpc(n, "ping", json!({}))).collect();
    assert_eq!(
        call(&service, Some(&worker), &json!(most))
            .as_array()
            .unwrap()
            .len(),
        32
    );
}

#[test]
fn a_message_must_be_json_and_name_each_member_once() {
    let service = Service::sqlite();
    let worker = service.worker();
    let ping = rpc(1, "ping", json!({}));
    let plain = service.send_with(
        "POST",
        "/mcp",
        Some(&worker),
        &[("content-type", "text/plain")],
        Some(&ping),
    );
    assert_eq!(plain.status, 415, "{}", plain.text());
    assert_eq!(plain.json()["error"]["code"], "unsupported_media_type");
    // A member named twice, in the arguments or the call: a parse error,
    // and nothing runs.
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"enqueue","arguments":{"namespace":"renders","namespace":"other","queue":"q","brief":1,"id":"twice"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"}"#,
    ] {
        let answer = raw_post(&service, &worker, body);
        assert_eq!(answer["error"]["code"], -32700, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("duplicate field"),
            "{answer}"
        );
    }
    let listed = service.send(
        "GET",
        "/v1/ns/renders/tasks?state=ready",
        Some(&worker),
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(!listed.text().contains("twice"), "{}", listed.text());
}

/// A JSON-RPC message sent as it is written, over a plain connection.
fn raw_post(service: &Service, key: &str, body: &str) -> Value {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(service.address).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        service.address,
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, json) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(json).unwrap_or_else(|error| panic!("{error}: {json}"))
}

#[test]
fn tool_arguments_are_checked_against_the_tool_s_own_schema() {
    let service = Service::sqlite();
    let worker = service.worker();
    let refused = |message: Value, needle: &str| {
        let reply = call(&service, Some(&worker), &message);
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        let text = reply["error"]["message"].as_str().unwrap().to_owned();
        assert!(text.contains(needle), "{text}");
    };
    // Without its required brief; with a null one; with an argument the
    // schema does not name; a missing token; params as an array.
    refused(
        tool(
            1,
            "enqueue",
            json!({ "namespace": "renders", "queue": "q" }),
        ),
        "brief",
    );
    refused(
        tool(
            2,
            "enqueue",
            json!({ "namespace": "renders", "queue": "q", "brief": null }),
        ),
        "brief",
    );
    refused(
        tool(
            3,
            "enqueue",
            json!({ "namespace": "renders", "queue": "q", "brief": 1, "colour": "red" }),
        ),
        "colour",
    );
    refused(
        tool(
            4,
            "heartbeat",
            json!({ "namespace": "renders", "task": "t" }),
        ),
        "token",
    );
    refused(
        json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": ["enqueue"] }),
        "params",
    );
    // Nothing was enqueued.
    let listed = call(
        &service,
        Some(&worker),
        &tool(
            6,
            "list_tasks",
            json!({ "namespace": "renders", "state": "ready" }),
        ),
    );
    assert_eq!(listed["result"]["isError"], false, "{listed}");
    assert_eq!(
        listed["result"]["structuredContent"]["tasks"]
            .as_array()
            .map(Vec::len),
        Some(0),
        "{listed}"
    );
}

#[test]
fn the_tools_run_a_lease_from_enqueue_to_submit() {
    let service = Service::sqlite();
    let worker = service.worker();
    let key = Some(worker.as_str());
    let at = |namespace: &str| json!({ "namespace": namespace, "queue": "frames" });

    let empty = call(&service, key, &tool(1, "claim", at("renders")));
    let empty = &empty["result"];
    assert_eq!(empty["isError"], false, "{empty}");
    assert_eq!(empty["structuredContent"]["lease"], Value::Null);
    assert_eq!(empty["structuredContent"]["retry_after"], 5);

    let mut enqueue = at("renders");
    enqueue["brief"] = json!({ "frame": 7 });
    enqueue["id"] = json!("frame-7");
    let enqueued = call(&service, key, &tool(2, "enqueue", enqueue));
    assert_eq!(
        enqueued["result"]["structuredContent"]["task"]["id"],
        "frame-7"
    );

    let claimed = call(&service, key, &tool(3, "claim", at("renders")));
    let lease = &claimed["result"]["structuredContent"]["lease"];
    let token = lease["token"].as_i64().expect("a lease");
    let held = json!({ "namespace": "renders", "task": "frame-7", "token": token });
    let beat = call(&service, key, &tool(4, "heartbeat", held.clone()));
    assert_eq!(beat["result"]["isError"], false, "{beat}");

    let mut stale = held.clone();
    stale["token"] = json!(token + 1);
    let refused = call(&service, key, &tool(5, "heartbeat", stale));
    let refused = &refused["result"];
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["status"], 409);
    assert!(refused["structuredContent"].get("retry_after").is_some());
    assert!(refused["structuredContent"].get("reset_at").is_some());

    let mut submit = held.clone();
    submit["output"] = json!({ "pixels": 42 });
    submit["idempotency_key"] = json!("frame-7-once");
    let done = call(&service, key, &tool(6, "submit", submit.clone()));
    assert_eq!(
        done["result"]["structuredContent"]["replayed"], false,
        "{done}"
    );
    let again = call(&service, key, &tool(7, "submit", submit));
    assert_eq!(again["result"]["structuredContent"]["replayed"], true);

    let listed = call(
        &service,
        key,
        &tool(
            8,
            "list_tasks",
            json!({ "namespace": "renders", "state": "done" }),
        ),
    );
    assert_eq!(
        listed["result"]["structuredContent"]["tasks"][0]["task"]["id"],
        "frame-7"
    );
    let health = call(
        &service,
        key,
        &tool(9, "health", json!({ "namespace": "renders" })),
    );
    assert_eq!(health["result"]["structuredContent"]["attempts"]["done"], 1);
    let audit = call(&service, key, &tool(10, "audit", json!({ "limit": 5 })));
    assert!(
        !audit["result"]["structuredContent"]["events"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // No key: HTTP 401. A key without the grant, bad arguments: each its
    // envelope or error.
    let unkeyed = service.send(
        "POST",
        "/mcp",
        None,
        Some(&tool(11, "claim", at("renders"))),
    );
    assert_eq!(unkeyed.status, 401, "{}", unkeyed.text());
    let forbidden = call(&service, key, &tool(12, "claim", at("elsewhere")));
    assert_eq!(forbidden["result"]["structuredContent"]["status"], 403);
    let bad = call(
        &service,
        key,
        &tool(13, "heartbeat", json!({ "namespace": "renders" })),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let unknown = call(&service, key, &tool(14, "drop_tables", json!({})));
    assert_eq!(unknown["error"]["code"], -32602);
}

#[test]
fn a_batch_runs_one_call_at_a_time_through_authentication_and_admission() {
    // A window of one and one waiting slot: calls run side by side would
    // be refused 429 (queue full) from the third on.
    let admission = AdmissionConfig {
        initial_concurrency: 1,
        max_concurrency: 1,
        max_pending: 1,
        ..AdmissionConfig::default()
    };
    let service = Service::over(Store::open_in_memory(config().with_admission(admission)).unwrap());
    let worker = service.worker();
    let key = Some(worker.as_str());
    for n in 0..20 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let claims: Vec<Value> = (0..20)
        .map(|n| {
            tool(
                n,
                "claim",
                json!({ "namespace": "renders", "queue": "frames" }),
            )
        })
        .collect();
    let answers = call(&service, key, &Value::Array(claims));
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 20);
    let mut tasks = Vec::new();
    for (n, answer) in answers.iter().enumerate() {
        assert_eq!(answer["id"], n as u64, "in order");
        let claimed = &answer["result"]["structuredContent"];
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        assert_eq!(claimed["concurrency_limit"], 1);
        tasks.push(claimed["task"]["id"].as_str().unwrap().to_owned());
    }
    tasks.sort();
    tasks.dedup();
    assert_eq!(tasks.len(), 20, "twenty leases, none twice");
    let stats = service.store.claim_stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0));

    // A batch with no key is refused as a whole, before any call runs.
    let batch = json!([
        tool(
            1,
            "claim",
            json!({ "namespace": "renders", "queue": "frames" })
        ),
        rpc(2, "ping", json!({})),
    ]);
    let refused = service.send("POST", "/mcp", None, Some(&batch));
    assert_eq!(refused.status, 401, "{}", refused.text());
}
