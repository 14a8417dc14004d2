//! The board's keyed views: the key kept in the board's cookie, the
//! queues view and its controls, over plain HTTP (as a browser without
//! JavaScript sends them) and in headless Chromium.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_store::{Namespace, QueueName};

use crate::board::Browser;
use crate::{Reply, Service, post_form};

/// The `Cookie` header a `/board/key` answer sets.
pub(crate) fn cookie_of(reply: &Reply) -> String {
    let set = reply.header("set-cookie").expect("a cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/board"),
        "{set}"
    );
    set.split(';').next().unwrap().to_owned()
}

/// The board's cookie for `key`, as its form keeps it.
pub(crate) fn keep_key(service: &Service, key: &str) -> String {
    let kept = post_form(
        service.address,
        "/board/key",
        &[],
        &format!("key={key}&ns=renders"),
    );
    assert_eq!(kept.status, 303, "{}", kept.text());
    assert_eq!(kept.header("location"), Some("/board/queues?ns=renders"));
    cookie_of(&kept)
}

/// An HTML page read with the board's cookie.
pub(crate) fn page(service: &Service, path: &str, cookie: &str) -> String {
    let reply = service.send_with("GET", path, None, &[("cookie", cookie)], None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.content_type.starts_with("text/html"));
    reply.text()
}

pub(crate) fn settings(service: &Service, queue: &str) -> tessera_store::QueueSettings {
    let caller = service.store.authenticate(Some(&service.admin)).unwrap();
    service
        .store
        .queue_settings(
            &caller,
            &Namespace::parse("renders").unwrap(),
            &QueueName::parse(queue).unwrap(),
        )
        .unwrap()
}

/// The text of the cell `field` of queue `queue` on a queues page.
pub(crate) fn cell(page: &str, queue: &str, field: &str) -> String {
    let row = page
        .split(&format!("<tr data-queue=\"{queue}\">"))
        .nth(1)
        .unwrap_or_else(|| panic!("no row for {queue}: {page}"));
    let row = row.split("</tr>").next().unwrap();
    let cell = row
        .split(&format!("data-field=\"{field}\">"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} in {row}"));
    cell.split("</td>").next().unwrap().to_owned()
}

#[test]
fn the_queues_view_and_its_controls_work_without_javascript() {
    let service = Service::sqlite();
    let worker = service.worker();
    for n in 0..3 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let emails = json!({ "brief": { "to": "<script>alert(1)</script>" } });
    let queued = service.send(
        "POST",
        "/v1/ns/renders/queues/emails/tasks",
        Some(&worker),
        Some(&emails),
    );
    assert_eq!(queued.status, 201);
    let claimed = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/claims",
        Some(&worker),
        None,
    );
    assert_eq!(claimed.status, 200);

    // Without a key the view asks for one; a key the store does not know
    // is refused, and never kept.
    let asked = service.send("GET", "/board/queues?ns=renders", None, None);
    assert_eq!(asked.status, 200);
    assert!(asked.text().contains("id=\"need-key\""));
    assert!(asked.text().contains("action=\"/board/key\""));
    let unknown = post_form(
        service.address,
        "/board/key",
        &[],
        "key=tsk_0123456789abcdef_00",
    );
    assert_eq!(unknown.status, 401, "{}", unknown.text());
    assert!(unknown.header("set-cookie").is_none());

    let cookie = keep_key(&service, &service.admin);
    let shown = page(&service, "/board/queues?ns=renders", &cookie);
    // The counts are the store's.
    let caller = service.store.authenticate(Some(&service.admin)).unwrap();
    let health = service
        .store
        .health(&caller, &Namespace::parse("renders").unwrap())
        .unwrap();
    for depth in &health.depths {
        let queue = depth.queue.as_str();
        assert_eq!(cell(&shown, queue, "ready"), depth.ready.to_string());
        assert_eq!(cell(&shown, queue, "delayed"), depth.delayed.to_string());
        assert_eq!(cell(&shown, queue, "leased"), depth.leased.to_string());
        assert!(cell(&shown, queue, "oldest").contains(" ago"), "{shown}");
    }
    assert_eq!(cell(&shown, "frames", "ready"), "2");
    assert_eq!(cell(&shown, "frames", "leased"), "1");
    assert_eq!(cell(&shown, "emails", "ready"), "1");
    assert!(
        !shown.contains("<script>alert"),
        "the brief is never shown raw"
    );

    // Each control changes the store and answers back to the view.
    let with = [("cookie", cookie.as_str())];
    let paused = post_form(
        service.address,
        "/board/ns/renders/queues/frames/pause",
        &with,
        "",
    );
    assert_eq!(paused.status, 303, "{}", paused.text());
    assert_eq!(paused.header("location"), Some("/board/queues?ns=renders"));
    assert!(settings(&service, "frames").paused_at.is_some());
    let shown = page(&service, "/board/queues?ns=renders", &cookie);
    assert!(
        cell(&shown, "frames", "status").contains("paused"),
        "{shown}"
    );
    let resumed = post_form(
        service.address,
        "/board/ns/renders/queues/frames/resume",
        &with,
        "",
    );
    assert_eq!(resumed.status, 303);
    assert!(settings(&service, "frames").paused_at.is_none());
    let limited = post_form(
        service.address,
        "/board/ns/renders/queues/frames/limits",
        &with,
        "queue=5&per_partition=2",
    );
    assert_eq!(limited.status, 303, "{}", limited.text());
    let limit = settings(&service, "frames").limit;
    assert_eq!(limit.queue.map(|n| n.get()), Some(5));
    assert_eq!(limit.per_partition.map(|n| n.get()), Some(2));
    let shown = page(&service, "/board/queues?ns=renders", &cookie);
    assert_eq!(cell(&shown, "frames", "limit"), "5");

    // Hostile input: typed 400s, a form from another site refused, and no
    // control without a key.
    for (form, what) in [
        ("queue=five&per_partition=2", "queue is not a whole number"),
        ("queue=-1&per_partition=2", "queue is -1"),
        ("queue=1", "per_partition"),
    ] {
        let refused = post_form(
            service.address,
            "/board/ns/renders/queues/frames/limits",
            &with,
            form,
        );
        assert_eq!(refused.status, 400, "{form}: {}", refused.text());
        assert_eq!(refused.json()["error"]["code"], "invalid_input");
        assert!(refused.text().contains(what), "{form}: {}", refused.text());
    }
    let bad_queue = post_form(
        service.address,
        "/board/ns/renders/queues/fr%20ames/pause",
        &with,
        "",
    );
    assert_eq!(bad_queue.status, 400, "{}", bad_queue.text());
    let forged = post_form(
        service.address,
        "/board/ns/renders/queues/frames/pause",
        &[
            ("cookie", cookie.as_str()),
            ("origin", "https://elsewhere.example"),
        ],
        "",
    );
    assert_eq!(forged.status, 403, "{}", forged.text());
    assert_eq!(forged.json()["error"]["code"], "origin_refused");
    let keyless = post_form(
        service.address,
        "/board/ns/renders/queues/frames/pause",
        &[],
        "",
    );
    assert_eq!(keyless.status, 401);
    assert!(settings(&service, "frames").paused_at.is_none());

    // Forgetting drops the cookie.
    let forgotten = post_form(service.address, "/board/forget", &with, "");
    assert_eq!(forgotten.status, 303);
    assert!(
        forgotten
            .header("set-cookie")
            .is_some_and(|set| set.contains("Max-Age=0"))
    );
}

/// Chromium with JavaScript off, at `url`.
pub(crate) fn without_javascript(url: &str) -> Browser {
    let mut browser = Browser::open("about:blank");
    browser.page_command(
        "Emulation.setScriptExecutionDisabled",
        json!({ "value": true }),
    );
    browser.page_command("Page.navigate", json!({ "url": url }));
    browser
}

/// Waits until the page is `path` (and loaded), then answers `expression`.
pub(crate) fn once_at(browser: &mut Browser, path: &str, expression: &str) -> Value {
    browser.until(Duration::from_secs(30), |browser| {
        let at = browser.try_evaluate(&format!(
            "document.readyState === 'complete' && location.pathname + location.search === '{path}'"
        ))?;
        if at != json!(true) {
            return None;
        }
        browser
            .try_evaluate(expression)
            .filter(|value| !value.is_null())
    })
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
fn the_queues_view_in_chromium_without_javascript_counts_and_controls_the_store() {
    the_queues_view_in_chromium_without_javascript_counts_and_controls_the_store_over(
        &Service::sqlite(),
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn the_queues_view_in_chromium_without_javascript_counts_and_controls_the_store_on_postgres() {
    crate::on_postgres(
        "the_queues_view_in_c",
        the_queues_view_in_chromium_without_javascript_counts_and_controls_the_store_over,
    );
}

fn the_queues_view_in_chromium_without_javascript_counts_and_controls_the_store_over(
    service: &Service,
) {
    let worker = service.worker();
    for n in 0..4 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let claimed = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/claims",
        Some(&worker),
        None,
    );
    assert_eq!(claimed.status, 200);

    let mut browser = without_javascript(&format!("http://{}/board?ns=renders", service.address));
    // The key typed into the overview's form: posted, kept, and on to the
    // queues view.
    once_at(
        &mut browser,
        "/board?ns=renders",
        "document.getElementById('key') && true",
    );
    browser.evaluate(&format!(
        "document.getElementById('key').value = '{}'; \
         document.getElementById('key-form').submit(); true",
        service.admin
    ));
    let ready = once_at(
        &mut browser,
        "/board/queues?ns=renders",
        "document.querySelector('[data-queue=frames] [data-field=ready]')?.textContent ?? null",
    );
    assert_eq!(ready, json!("3"));
    let leased = browser
        .evaluate("document.querySelector('[data-queue=frames] [data-field=leased]').textContent");
    assert_eq!(leased, json!("1"));
    // The namespace's counts are the store's too.
    let counts = browser.counts();
    assert_eq!(counts, crate::board::store_counts(service));

    // Pause, by its button: the store's queue is paused, the page says so.
    browser.evaluate(
        "document.querySelector('[data-queue=frames] button[data-action=pause]').click(); true",
    );
    browser.until(Duration::from_secs(30), |_| {
        settings(service, "frames")
            .paused_at
            .is_some()
            .then_some(())
    });
    once_at(
        &mut browser,
        "/board/queues?ns=renders",
        "document.querySelector('[data-queue=frames] button[data-action=resume]') && true",
    );
    browser.evaluate(
        "document.querySelector('[data-queue=frames] button[data-action=resume]').click(); true",
    );
    browser.until(Duration::from_secs(30), |_| {
        settings(service, "frames")
            .paused_at
            .is_none()
            .then_some(())
    });
    // Limits, typed into the form.
    once_at(
        &mut browser,
        "/board/queues?ns=renders",
        "document.querySelector('[data-queue=frames] button[data-action=pause]') && true",
    );
    browser.evaluate(
        "const form = document.querySelector('[data-queue=frames] form.limits'); \
         form.querySelector('[name=queue]').value = '7'; \
         form.querySelector('[name=per_partition]').value = '3'; \
         form.querySelector('button').click(); true",
    );
    browser.until(Duration::from_secs(30), |_| {
        let limit = settings(service, "frames").limit;
        (limit.queue.map(|n| n.get()) == Some(7) && limit.per_partition.map(|n| n.get()) == Some(3))
            .then_some(())
    });
}

#[test]
fn the_keyed_feed_keeps_to_its_namespace_and_shows_every_discarded_tasks_error() {
    let service = Service::sqlite();
    let worker = service.worker();
    for n in 0..7 {
        crate::board::discard(
            &service,
            &worker,
            &format!("broken-{n}"),
            &format!("error number {n}"),
        );
    }
    // Another namespace's work, by the admin: not this board's.
    let elsewhere = service.send(
        "POST",
        "/v1/ns/elsewhere/queues/q/tasks",
        Some(&service.admin),
        Some(&json!({ "brief": 1 })),
    );
    assert_eq!(elsewhere.status, 201, "{}", elsewhere.text());
    let feed = service
        .send(
            "GET",
            "/board/feed.json?ns=renders&details=1",
            Some(&service.admin),
            None,
        )
        .json();
    let discarded = feed["discarded"].as_array().unwrap();
    assert_eq!(discarded.len(), 7);
    for row in discarded {
        let id = row["task"]["id"].as_str().unwrap();
        let n = id.strip_prefix("broken-").unwrap();
        assert_eq!(row["last_error"], format!("error number {n}"), "{row}");
    }
    let events = feed["audit"]["events"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|event| event["namespace"] == "renders"),
        "{events:?}"
    );
    let counters = feed["audit"]["counters"].as_array().unwrap();
    assert!(
        counters
            .iter()
            .all(|counter| counter["namespace"] == "renders"),
        "{counters:?}"
    );
}

#[test]
fn the_overview_shows_waiting_work_and_admission_in_an_operators_words() {
    let service = Service::sqlite();
    let worker = service.worker();
    assert_eq!(service.enqueue(&worker, json!(1)).status, 201);
    let page = service.send("GET", "/board", None, None).text();
    assert!(
        page.contains("<tr data-queue=\"frames\"><th scope=\"row\">frames</th><td>1</td>"),
        "{page}"
    );
    assert!(page.contains(" ago</time>"), "{page}");
    assert!(page.contains("claims served at once (the concurrency limit)"));
    assert!(!page.contains("share of the slots"));
}
