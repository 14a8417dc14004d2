//! Discovery answers from configuration alone: 0 rows read or written.

use serde_json::json;

use crate::Service;

#[test]
fn discovery_routes_read_and_write_no_row_even_while_writes_are_refused() {
    let service = Service::sqlite();
    assert!(service.store.meters_rows());
    for refusing in [false, true] {
        service.store.refuse_writes(refusing);
        for path in [
            "/",
            "/llms.txt",
            "/robots.txt",
            "/.well-known/agent-card.json",
            "/v1/openapi.json",
        ] {
            let before = service.store.meter();
            let reply = service.send("GET", path, None, None);
            let cost = service.store.meter().since(&before);
            assert_eq!(reply.status, 200, "{path}: {}", reply.text());
            assert_eq!(
                (cost.rows_read, cost.rows_written, cost.write_transactions),
                (0, 0, 0),
                "{path} touched storage"
            );
        }
    }
}

#[test]
fn discovery_depends_on_configuration_only() {
    let service = Service::sqlite();
    let index = service.send("GET", "/", None, None).json();
    assert_eq!(index["public_namespaces"], json!(["renders"]));
    assert_eq!(index["links"]["mcp"], "/mcp");
    let llms = service.send("GET", "/llms.txt", None, None);
    assert!(llms.content_type.starts_with("text/plain"), "{llms:?}");
    assert!(
        llms.text().contains("renders") && llms.text().contains("`claim`"),
        "{}",
        llms.text()
    );
    // The Python client's worker, as its README shows it.
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../clients/python/README.md"
    ))
    .unwrap();
    for line in [
        "from tessera_client import Client, Worker",
        "worker = Worker(client, \"renders\", \"frames\", lambda task: {\"frame\": task.brief})",
        "worker.run(threads=4)  # until worker.stop is set",
    ] {
        assert!(llms.text().contains(line), "{line} in {}", llms.text());
        assert!(readme.contains(line), "{line} in the client's README");
    }
    // The Rust client's worker, as its crate documentation (a compiled
    // doctest) and the server's README show it.
    let crate_docs = include_str!("../../../../tessera-client/src/lib.rs");
    let server_readme = include_str!("../../README.md");
    for line in [
        "use tessera_client::{Client, Worker};",
        "let worker = Worker::new(client, \"renders\", \"frames\", |claim| Ok(json!({ \"frame\": claim.brief_json() })))?;",
        "worker.run(4)?; // until worker.stopper().stop()",
    ] {
        assert!(llms.text().contains(line), "{line} in {}", llms.text());
        assert!(
            crate_docs.contains(line),
            "{line} in the client's crate docs"
        );
        assert!(
            server_readme.contains(line),
            "{line} in the server's README"
        );
    }
    let robots = service.send("GET", "/robots.txt", None, None).text();
    assert!(
        robots.contains("Allow: /board") && robots.contains("Disallow: /"),
        "{robots}"
    );
    let card = service
        .send("GET", "/.well-known/agent-card.json", None, None)
        .json();
    assert_eq!(card["url"], "/mcp");
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|skill| skill["id"].as_str().unwrap())
        .collect();
    for tool in [
        "enqueue",
        "claim",
        "heartbeat",
        "submit",
        "cancel",
        "list_tasks",
        "health",
        "audit",
    ] {
        assert!(skills.contains(&tool), "{tool} in {skills:?}");
    }
    // The same answers whatever the store holds.
    let worker = service.worker();
    assert_eq!(service.enqueue(&worker, json!(1)).status, 201);
    assert_eq!(service.send("GET", "/", None, None).json(), index);
    assert_eq!(
        service
            .send("GET", "/.well-known/agent-card.json", None, None)
            .json(),
        card
    );
}
