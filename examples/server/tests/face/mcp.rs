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
fn initialize_ping_tools_list_and_notifications_make_no_storage_call() {
    let service = Service::sqlite();
    let worker = service.worker();
    service.store.refuse_writes(true);
    for key in [None, Some(worker.as_str()), Some("not-a-key")] {
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
                "audit"
            ]
        );
        let batch = json!([rpc(4, "ping", json!({})), rpc(5, "tools/list", json!({}))]);
        assert_eq!(call(&service, key, &batch).as_array().unwrap().len(), 2);
        let cost = service.store.meter().since(&before);
        assert_eq!((cost.rows_read, cost.rows_written), (0, 0), "key {key:?}");
    }
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

    // No key, a key without the grant, bad arguments: each its envelope.
    let unkeyed = call(&service, None, &tool(11, "claim", at("renders")));
    assert_eq!(unkeyed["result"]["structuredContent"]["status"], 401);
    let forbidden = call(&service, key, &tool(12, "claim", at("elsewhere")));
    assert_eq!(forbidden["result"]["structuredContent"]["status"], 403);
    let bad = call(
        &service,
        key,
        &tool(13, "heartbeat", json!({ "namespace": "renders" })),
    );
    assert_eq!(bad["result"]["structuredContent"]["code"], "invalid_input");
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

    // Each call authenticates: a batch with no key is refused call by call.
    let batch = json!([
        tool(
            1,
            "claim",
            json!({ "namespace": "renders", "queue": "frames" })
        ),
        rpc(2, "ping", json!({})),
    ]);
    let answers = call(&service, None, &batch);
    assert_eq!(answers[0]["result"]["structuredContent"]["status"], 401);
    assert_eq!(answers[1]["result"], json!({}));
}
