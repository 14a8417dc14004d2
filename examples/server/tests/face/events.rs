//! The claim-events long-poll is audited once per request.

use serde_json::json;
use tessera_store::AuditQuery;

use crate::Service;

/// The `read_task` audit rows of `key`'s principal.
fn read_task_rows(service: &Service, key: &str) -> usize {
    let caller = service.store.authenticate(Some(key)).unwrap();
    let page = service
        .store
        .audit(
            &caller,
            &AuditQuery {
                limit: 1000,
                ..AuditQuery::default()
            },
        )
        .unwrap();
    page.events
        .iter()
        .filter(|event| event.action.as_str() == "read_task")
        .count()
}

#[test]
fn a_long_poll_writes_one_audit_row_however_long_it_waits() {
    let service = Service::sqlite();
    let worker = service.worker();
    let task = service.enqueue(&worker, json!(1)).json();
    let id = task["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/ns/renders/claims/{id}/events?wait=2");
    for request in 1..=3 {
        let reply = service.send("GET", &path, Some(&worker), None);
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["changed"], false);
        // It ran to its deadline: nothing changed, and it says how long.
        assert!(body["waited_ms"].is_u64(), "{body}");
        assert_eq!(
            body["record"]["attempts"][0]["state"]["state"], "ready",
            "{body}"
        );
        assert_eq!(read_task_rows(&service, &worker), request);
    }
}

#[test]
fn a_long_poll_answers_when_its_namespace_changes() {
    let service = Service::sqlite();
    let worker = service.worker();
    let id = service.enqueue(&worker, json!(1)).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/ns/renders/claims/{id}/events?wait=30");
    let polled = std::thread::scope(|scope| {
        let poll = scope.spawn(|| service.send("GET", &path, Some(&worker), None));
        // The claim changes the namespace while the poll waits (or before
        // it first looks, in which case it is already there to see).
        let claim = service.send(
            "POST",
            "/v1/ns/renders/queues/frames/claims",
            Some(&worker),
            None,
        );
        assert_eq!(claim.status, 200, "{}", claim.text());
        poll.join().unwrap()
    });
    assert_eq!(polled.status, 200, "{}", polled.text());
    let body = polled.json();
    assert_eq!(
        body["record"]["attempts"][0]["state"]["state"], "leased",
        "{body}"
    );
    assert_eq!(read_task_rows(&service, &worker), 1);
}

#[test]
fn a_wait_past_the_library_limit_is_refused() {
    let service = Service::sqlite();
    let worker = service.worker();
    let limit = tessera_store::limits::MAX_LONG_POLL.as_secs();
    let path = format!("/v1/ns/renders/claims/frame/events?wait={}", limit + 1);
    let reply = service.send("GET", &path, Some(&worker), None);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], "invalid_input");
}
