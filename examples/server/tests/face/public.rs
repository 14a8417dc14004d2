//! Public reads answer 200 with every write refused; a write is 503.

use serde_json::json;

use crate::{Service, drop_schema, postgres_store};

fn public_reads_outlive_refused_writes(service: &Service) {
    let worker = service.worker();
    for n in 0..2 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    service.store.refuse_writes(true);

    let health = service.send("GET", "/v1/health", None, None);
    assert_eq!(health.status, 200, "{}", health.text());
    let health = health.json();
    assert_eq!(health["writes_refused"], true);
    assert_eq!(health["namespaces"][0]["namespace"], "renders");
    assert_eq!(health["namespaces"][0]["attempts"]["ready"], 2);

    let healthz = service.send("GET", "/healthz", None, None);
    assert_eq!(healthz.status, 200);
    assert_eq!(healthz.json()["writes_refused"], true);

    let activity = service.send("GET", "/v1/public/activity", None, None);
    assert_eq!(activity.status, 200, "{}", activity.text());
    assert_eq!(activity.json()["namespaces"][0]["attempts"]["ready"], 2);
    assert!(activity.json()["admission"]["limit"].as_u64().unwrap() >= 1);

    let board = service.send("GET", "/board", None, None);
    assert_eq!(board.status, 200, "{}", board.text());
    assert!(board.content_type.starts_with("text/html"));
    let page = board.text();
    assert!(page.contains(r#"<td data-count="ready">2</td>"#), "{page}");
    assert!(
        page.contains("Storage refuses writes: reads answer"),
        "{page}"
    );

    let feed = service.send("GET", "/board/feed.json", None, None);
    assert_eq!(feed.status, 200, "{}", feed.text());
    assert_eq!(feed.json()["health"]["attempts"]["ready"], 2);
    // The enqueues ran this server's first retention run, which the
    // board shows.
    let retention = &feed.json()["retention"];
    assert!(retention["ran_at"].is_string(), "{retention}");
    assert_eq!(retention["tasks_purged"], 0, "{retention}");
    assert!(board.text().contains("data-retention=\"ran_at\""));

    // A write is refused as the provider's quota.
    let refused = service.enqueue(&worker, json!(3));
    assert_eq!(refused.status, 503, "{}", refused.text());
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "storage_quota_exhausted");
    assert!(error["retry_after"].as_u64().unwrap() >= 1);
    assert!(error["reset_at"].as_str().unwrap().ends_with("T00:00:00Z"));

    // And through MCP, as the tool-error envelope.
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "enqueue",
        "arguments": { "namespace": "renders", "queue": "frames", "brief": 3 } } });
    let reply = service
        .send("POST", "/mcp", Some(&worker), Some(&call))
        .json();
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    assert_eq!(result["structuredContent"]["status"], 503);
    assert_eq!(
        result["structuredContent"]["code"],
        "storage_quota_exhausted"
    );
    assert!(result["structuredContent"]["retry_after"].as_u64().unwrap() >= 1);
    assert!(result["structuredContent"]["reset_at"].is_string());

    service.store.refuse_writes(false);
    assert_eq!(service.enqueue(&worker, json!(3)).status, 201);
    let health = service.send("GET", "/v1/health", None, None).json();
    assert_eq!(health["namespaces"][0]["attempts"]["ready"], 3);
}

#[test]
fn public_reads_outlive_refused_writes_on_sqlite() {
    public_reads_outlive_refused_writes(&Service::sqlite());
}

#[test]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn public_reads_outlive_refused_writes_on_postgres() {
    let (store, url, schema) = postgres_store("public");
    let service = Service::over(store);
    public_reads_outlive_refused_writes(&service);
    drop(service);
    drop_schema(&url, &schema);
}

#[test]
fn a_namespace_not_marked_public_needs_a_key() {
    let service = Service::sqlite();
    let feed = service.send("GET", "/board/feed.json?ns=private", None, None);
    assert_eq!(feed.status, 401, "{}", feed.text());
    let board = service.send("GET", "/board?ns=private", None, None);
    assert_eq!(board.status, 200);
    assert!(board.text().contains("This namespace is not public"));
    // A key that grants it sees it.
    let worker = service.worker();
    assert_eq!(service.enqueue(&worker, json!(1)).status, 201);
    let feed = service.send("GET", "/board/feed.json?ns=renders", Some(&worker), None);
    assert_eq!(feed.status, 200, "{}", feed.text());
    assert_eq!(feed.json()["grants"], json!(["renders"]));
    assert_eq!(feed.json()["health"]["attempts"]["ready"], 1);
}
