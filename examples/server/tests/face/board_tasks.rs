//! The board's task views, bulk actions by filter, schedules and charts,
//! over plain HTTP (as a browser without JavaScript sends them) and in
//! headless Chromium; and the screenshots of the keyed views.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_store::Namespace;

use crate::board::Browser;
use crate::board_views::{keep_key, once_at, page, without_javascript};
use crate::{Service, post_form};

/// Enqueues `id` in `queue` of `renders`, with a partition key if given.
fn enqueue_in(service: &Service, key: &str, queue: &str, id: &str, partition: Option<&str>) {
    let mut body = json!({ "id": id, "brief": { "id": id, "note": "<b>bold</b>" } });
    if let Some(partition) = partition {
        body["partition_key"] = json!(partition);
    }
    let reply = service.send(
        "POST",
        &format!("/v1/ns/renders/queues/{queue}/tasks"),
        Some(key),
        Some(&body),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
}

/// The tasks a list page shows, by id.
fn listed(page: &str) -> Vec<String> {
    page.split("<tr data-task=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_owned())
        .collect()
}

/// A board page's refusal: its status and code.
fn refusal(service: &Service, path: &str, cookie: &str) -> (u16, String) {
    let reply = service.send_with("GET", path, None, &[("cookie", cookie)], None);
    let code = if reply.status == 200 {
        String::new()
    } else {
        reply.json()["error"]["code"].as_str().unwrap().to_owned()
    };
    (reply.status, code)
}

#[test]
fn the_task_list_filters_searches_and_pages_without_javascript() {
    let service = Service::sqlite();
    let worker = service.worker();
    for id in ["f0", "f1", "f2"] {
        enqueue_in(&service, &worker, "frames", id, None);
    }
    enqueue_in(&service, &worker, "emails", "e0", Some("acme"));
    enqueue_in(&service, &worker, "emails", "e1", None);
    let cookie = keep_key(&service, &service.admin);

    let all = page(&service, "/board/tasks?ns=renders&state=ready", &cookie);
    assert_eq!(listed(&all), ["f0", "f1", "f2", "e0", "e1"]);
    let newest = page(
        &service,
        "/board/tasks?ns=renders&state=ready&order=newest",
        &cookie,
    );
    assert_eq!(listed(&newest), ["e1", "e0", "f2", "f1", "f0"]);
    let emails = page(&service, "/board/tasks?ns=renders&queue=emails", &cookie);
    assert_eq!(listed(&emails), ["e0", "e1"]);
    let acme = page(
        &service,
        "/board/tasks?ns=renders&state=ready&partition_key=acme&queue=",
        &cookie,
    );
    assert_eq!(listed(&acme), ["e0"]);
    let later = "2999-01-01T00:00:00Z";
    let none = page(
        &service,
        &format!("/board/tasks?ns=renders&since={later}"),
        &cookie,
    );
    assert!(listed(&none).is_empty());
    let before = page(
        &service,
        &format!("/board/tasks?ns=renders&before={later}"),
        &cookie,
    );
    assert_eq!(listed(&before).len(), 5);
    // The form's choice of how recently: all of them reached ready now.
    let recent = page(
        &service,
        "/board/tasks?ns=renders&within=5m&queue=&partition_key=",
        &cookie,
    );
    assert_eq!(listed(&recent).len(), 5);
    assert!(recent.contains("now: since "), "{recent}");
    assert!(all.contains(" ago</time>"), "an age for each waiting task");

    // Pages of 50: the next link goes on where the page ended.
    let tasks: Vec<Value> = (0..53).map(|n| json!({ "brief": n })).collect();
    let batch = service.send(
        "POST",
        "/v1/ns/renders/queues/bulk/tasks/batch",
        Some(&worker),
        Some(&json!({ "tasks": tasks })),
    );
    assert_eq!(batch.status, 201, "{}", batch.text());
    let first = page(&service, "/board/tasks?ns=renders&queue=bulk", &cookie);
    assert_eq!(listed(&first).len(), 45, "the first page's 50, less five");
    let next = first
        .split("id=\"next\"")
        .next()
        .unwrap()
        .rsplit("href=\"")
        .next()
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&");
    let second = page(&service, &next, &cookie);
    assert_eq!(listed(&second).len(), 8);
    assert!(!second.contains("id=\"next\""));

    // A search by id opens the task's detail.
    let searched = crate::get_unfollowed(
        service.address,
        "/board/tasks?ns=renders&id=f1",
        &[("cookie", &cookie)],
    );
    assert_eq!(searched.status, 303);
    let detail = searched.header("location").unwrap();
    assert_eq!(detail, "/board/task?ns=renders&id=f1&version=1");
    assert!(page(&service, detail, &cookie).contains("<h2>Task f1 v1</h2>"));

    // Hostile input: typed 400s.
    for (query, code) in [
        ("state=bogus", "invalid_input"),
        ("since=yesterday", "invalid_input"),
        ("queue=a%20b", "invalid_input"),
        ("after=xyz", "invalid_input"),
        ("order=sideways", "invalid_input"),
        ("ns=..", "invalid_input"),
        ("version=0&id=f1", "invalid_input"),
        ("within=2h", "invalid_input"),
        ("since=", "invalid_input"),
        ("id=", "invalid_input"),
        // Past the year 9999 in UTC: it could not be written back.
        ("before=9999-12-31T23:59:59-23:59", "invalid_input"),
        ("since=0000-01-01T00:00:00%2B23:59", "invalid_input"),
    ] {
        assert_eq!(
            refusal(&service, &format!("/board/tasks?{query}"), &cookie),
            (400, code.to_owned()),
            "{query}"
        );
    }
}

#[test]
fn a_tasks_detail_shows_its_attempts_output_errors_and_audit_and_its_controls_work() {
    let service = Service::sqlite();
    let worker = service.worker();
    crate::board::discard(
        &service,
        &worker,
        "broken",
        "the <renderer> ran out of memory",
    );
    enqueue_in(&service, &worker, "frames", "good", None);
    let claimed = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/claims",
        Some(&worker),
        None,
    );
    assert_eq!(claimed.status, 200);
    let claimed = claimed.json();
    assert_eq!(claimed["task"]["id"], "good");
    let token = claimed["lease"]["token"].clone();
    let submitted = service.send_with(
        "POST",
        "/v1/ns/renders/tasks/good/submit",
        Some(&worker),
        &[("idempotency-key", "good-once")],
        Some(&json!({ "version": 1, "token": token, "output": { "pixels": 42 } })),
    );
    assert_eq!(submitted.status, 200, "{}", submitted.text());
    let cookie = keep_key(&service, &service.admin);

    let good = page(&service, "/board/task?ns=renders&id=good", &cookie);
    assert!(
        good.contains("&quot;note&quot;: &quot;&lt;b&gt;bold&lt;/b&gt;&quot;"),
        "{good}"
    );
    assert!(
        good.contains("data-field=\"output\">{&quot;pixels&quot;:42}"),
        "{good}"
    );
    assert!(
        good.contains(&format!("data-field=\"token\">{token}<")),
        "{good}"
    );
    assert!(good.contains("idempotency key good-once"), "{good}");
    let events = good.split("id=\"task-events\">").nth(1).unwrap();
    for action in ["enqueue", "claim", "submit"] {
        assert!(
            events.contains(&format!("<td>{action}</td>")),
            "{action}: {events}"
        );
    }

    let broken = page(
        &service,
        "/board/task?ns=renders&id=broken&version=1",
        &cookie,
    );
    assert!(
        broken.contains("data-field=\"last_error\">the &lt;renderer&gt; ran out of memory<"),
        "{broken}"
    );
    // Retry, then cancel, by the detail's forms.
    let with = [("cookie", cookie.as_str())];
    let retried = post_form(
        service.address,
        "/board/ns/renders/tasks/broken/retry?version=1",
        &with,
        "",
    );
    assert_eq!(retried.status, 303, "{}", retried.text());
    assert_eq!(
        retried.header("location"),
        Some("/board/task?ns=renders&id=broken&version=1")
    );
    let caller = service.store.authenticate(Some(&service.admin)).unwrap();
    let task = tessera_store::TaskRef::new(
        Namespace::parse("renders").unwrap(),
        tessera_store::TaskId::parse("broken").unwrap(),
        tessera_store::BriefVersion::new(1).unwrap(),
    );
    let last_state = |service: &Service| {
        let view = service.store.read_task(&caller, &task).unwrap();
        view.record
            .attempts
            .last()
            .unwrap()
            .state
            .name()
            .to_string()
    };
    assert_eq!(last_state(&service), "ready");
    let cancelled = post_form(
        service.address,
        "/board/ns/renders/tasks/broken/cancel?version=1",
        &with,
        "",
    );
    assert_eq!(cancelled.status, 303);
    assert_eq!(last_state(&service), "cancelled");

    // A task that is not there, and bad input.
    assert_eq!(
        refusal(&service, "/board/task?ns=renders&id=missing", &cookie),
        (404, "not_found".to_owned())
    );
    assert_eq!(refusal(&service, "/board/task?ns=renders", &cookie).0, 400);
    assert_eq!(
        refusal(&service, "/board/task?ns=renders&id=a%20b", &cookie).0,
        400
    );
    let bad = post_form(
        service.address,
        "/board/ns/renders/tasks/broken/retry?version=x",
        &with,
        "",
    );
    assert_eq!(bad.status, 400);
}

#[test]
fn bulk_retry_and_cancel_show_the_count_then_change_the_store() {
    let service = Service::sqlite();
    let worker = service.worker();
    for n in 0..3 {
        crate::board::discard(&service, &worker, &format!("broken-{n}"), "out of memory");
    }
    enqueue_in(&service, &worker, "emails", "e0", None);
    enqueue_in(&service, &worker, "emails", "e1", None);
    enqueue_in(&service, &worker, "frames", "f0", None);
    let cookie = keep_key(&service, &service.admin);

    let list = page(&service, "/board/tasks?ns=renders&state=discarded", &cookie);
    assert!(
        list.contains("href=\"/board/bulk/retry?ns=renders&amp;state=discarded\""),
        "{list}"
    );
    let confirm = page(
        &service,
        "/board/bulk/retry?ns=renders&state=discarded",
        &cookie,
    );
    assert!(confirm.contains("<b id=\"match-count\">3</b>"), "{confirm}");
    // The confirmation is pinned to what it counted: its action carries
    // the count's time as `before`.
    let action = form_action(&confirm);
    assert!(
        action.starts_with("/board/ns/renders/bulk/retry?state=discarded&before="),
        "{action}"
    );
    // A task discarded after the count is not retried by its confirmation.
    std::thread::sleep(Duration::from_millis(5));
    crate::board::discard(&service, &worker, "broken-late", "out of memory");
    let with = [("cookie", cookie.as_str())];
    let retried = post_form(service.address, &action, &with, "");
    assert_eq!(retried.status, 303, "{}", retried.text());
    let counts = crate::board::store_counts(&service);
    assert_eq!(
        (counts["discarded"].as_u64(), counts["ready"].as_u64()),
        (Some(1), Some(6))
    );
    // A bulk action names its state.
    let stateless = post_form(service.address, "/board/ns/renders/bulk/cancel", &with, "");
    assert_eq!(stateless.status, 400, "{}", stateless.text());

    let confirm = page(
        &service,
        "/board/bulk/cancel?ns=renders&state=ready&queue=emails",
        &cookie,
    );
    assert!(confirm.contains("<b id=\"match-count\">2</b>"), "{confirm}");
    let cancelled = post_form(
        service.address,
        "/board/ns/renders/bulk/cancel?state=ready&queue=emails",
        &with,
        "",
    );
    assert_eq!(cancelled.status, 303);
    let counts = crate::board::store_counts(&service);
    assert_eq!(
        (counts["cancelled"].as_u64(), counts["ready"].as_u64()),
        (Some(2), Some(4))
    );

    // Without a key nothing is done; a bad filter is a typed 400.
    let keyless = post_form(
        service.address,
        "/board/ns/renders/bulk/cancel?state=ready",
        &[],
        "",
    );
    assert_eq!(keyless.status, 401);
    let bad = post_form(
        service.address,
        "/board/ns/renders/bulk/cancel?state=gone",
        &with,
        "",
    );
    assert_eq!(bad.status, 400);
    assert_eq!(crate::board::store_counts(&service)["ready"], 4);
}

#[test]
fn the_schedules_view_shows_next_runs_and_pauses_and_resumes() {
    let service = Service::sqlite();
    let admin = service.admin.clone();
    for (ns, name, cron) in [
        ("renders", "nightly", "0 3 * * *"),
        ("renders", "often", "*/5 * * * *"),
        ("elsewhere", "theirs", "0 3 * * *"),
    ] {
        let put = service.send(
            "PUT",
            &format!("/v1/ns/{ns}/schedules/{name}"),
            Some(&admin),
            Some(&json!({ "queue": "frames", "cron": cron, "brief": { "from": name } })),
        );
        assert!(put.status == 201 || put.status == 200, "{}", put.text());
    }
    let cookie = keep_key(&service, &admin);
    let shown = page(&service, "/board/schedules?ns=renders", &cookie);
    assert!(shown.contains("<tr data-schedule=\"nightly\">"), "{shown}");
    assert!(shown.contains("<tr data-schedule=\"often\">"));
    assert!(!shown.contains("theirs"), "another namespace's schedule");
    let row = |page: &str, name: &str| {
        page.split(&format!("<tr data-schedule=\"{name}\">"))
            .nth(1)
            .unwrap()
            .split("</tr>")
            .next()
            .unwrap()
            .to_owned()
    };
    assert!(
        row(&shown, "often").contains("data-field=\"next\"><time"),
        "{shown}"
    );
    assert!(row(&shown, "often").contains(">in "), "{shown}");
    assert!(row(&shown, "often").contains("data-field=\"last\">never"));

    let with = [("cookie", cookie.as_str())];
    let caller = service.store.authenticate(Some(&admin)).unwrap();
    let paused = |service: &Service| {
        service
            .store
            .read_schedule(
                &caller,
                &Namespace::parse("renders").unwrap(),
                &tessera_store::ScheduleName::parse("nightly").unwrap(),
            )
            .unwrap()
            .paused
    };
    let reply = post_form(
        service.address,
        "/board/ns/renders/schedules/nightly/pause",
        &with,
        "",
    );
    assert_eq!(reply.status, 303, "{}", reply.text());
    assert_eq!(
        reply.header("location"),
        Some("/board/schedules?ns=renders")
    );
    assert!(paused(&service));
    let shown = page(&service, "/board/schedules?ns=renders", &cookie);
    assert!(row(&shown, "nightly").contains("data-action=\"resume\""));
    let reply = post_form(
        service.address,
        "/board/ns/renders/schedules/nightly/resume",
        &with,
        "",
    );
    assert_eq!(reply.status, 303);
    assert!(!paused(&service));
    let missing = post_form(
        service.address,
        "/board/ns/renders/schedules/missing/pause",
        &with,
        "",
    );
    assert_eq!(missing.status, 404);
    assert_eq!(
        refusal(&service, "/board/schedules?ns=renders&after=a%20b", &cookie).0,
        400
    );
}

/// The values of a chart's series on a charts page, oldest first.
/// The `action` of the bulk form on `page`, unescaped.
fn form_action(page: &str) -> String {
    let start = page.find("action=\"/board/ns/").expect("a bulk form") + "action=\"".len();
    let end = start + page[start..].find('"').expect("the action ends");
    page[start..end].replace("&amp;", "&")
}

fn chart_values(page: &str, series: &str) -> Vec<String> {
    page.split(&format!("data-series=\"{series}\" data-minute=\""))
        .skip(1)
        .map(|rest| {
            rest.split("data-value=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn the_charts_draw_the_last_hour_from_memory() {
    let service = Service::sqlite();
    let worker = service.worker();
    for n in 0..3 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let claimed = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/claims",
        Some(&worker),
        None,
    );
    assert_eq!(claimed.status, 200);
    let cookie = keep_key(&service, &service.admin);
    let (shown, cost) = service
        .store
        .measure(|_| page(&service, "/board/charts?ns=renders", &cookie));
    assert_eq!(shown.matches("<svg class=\"chart\"").count(), 4, "{shown}");
    let counts = crate::board::store_counts(&service);
    assert_eq!(
        chart_values(&shown, "ready").last().map(String::as_str),
        Some(counts["ready"].to_string().as_str())
    );
    assert_eq!(
        chart_values(&shown, "leased").last().map(String::as_str),
        Some("1")
    );
    assert!(!chart_values(&shown, "p50").is_empty(), "{shown}");
    assert_eq!(
        chart_values(&shown, "limit").last().map(String::as_str),
        Some("32")
    );
    // The key's check and the snapshot are all it reads; it writes nothing
    // of its own (the key's check may write its coalesced last use).
    assert!(cost.rows_written <= 1, "{cost:?}");
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
fn the_charts_render_in_chromium_without_javascript() {
    the_charts_render_in_chromium_without_javascript_over(&Service::sqlite());
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn the_charts_render_in_chromium_without_javascript_on_postgres() {
    crate::on_postgres(
        "the_charts_render_in",
        the_charts_render_in_chromium_without_javascript_over,
    );
}

fn the_charts_render_in_chromium_without_javascript_over(service: &Service) {
    let worker = service.worker();
    for n in 0..2 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let mut browser = without_javascript(&format!("http://{}/board?ns=renders", service.address));
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
    once_at(
        &mut browser,
        "/board/queues?ns=renders",
        "document.querySelector('[data-queue=frames]') && true",
    );
    browser.page_command(
        "Page.navigate",
        json!({ "url": format!("http://{}/board/charts?ns=renders", service.address) }),
    );
    let drawn = once_at(
        &mut browser,
        "/board/charts?ns=renders",
        "(() => { const svgs = [...document.querySelectorAll('svg.chart')]; \
           const ready = [...document.querySelectorAll('circle[data-series=ready]')].pop(); \
           return svgs.length === 4 && svgs.every(svg => svg.getBoundingClientRect().width > 100) \
             && ready ? ready.dataset.value : null; })()",
    );
    assert_eq!(drawn, json!("2"));
}

/// Claims one task of `queue` in `renders`: its id and token.
fn claim_one(service: &Service, key: &str, queue: &str) -> (String, Value) {
    let claimed = service.send(
        "POST",
        &format!("/v1/ns/renders/queues/{queue}/claims"),
        Some(key),
        None,
    );
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    let claimed = claimed.json();
    (
        claimed["task"]["id"].as_str().unwrap().to_owned(),
        claimed["lease"]["token"].clone(),
    )
}

#[test]
#[ignore = "takes the keyed views' screenshots: TESSERA_BOARD_SCREENSHOTS=docs"]
fn screenshots_of_the_queues_view_and_a_task_detail() {
    let folder = std::env::var_os("TESSERA_BOARD_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let service = Service::sqlite();
    let worker = service.worker();
    let admin = service.admin.clone();
    // Three queues: frames busy, emails paused, reports limited.
    for (queue, count) in [("frames", 240), ("emails", 35), ("reports", 12)] {
        let tasks: Vec<Value> = (0..count)
            .map(|n| json!({ "brief": { "n": n }, "max_tries": 1, "partition_key": format!("customer-{}", n % 3) }))
            .collect();
        let batch = service.send(
            "POST",
            &format!("/v1/ns/renders/queues/{queue}/tasks/batch"),
            Some(&worker),
            Some(&json!({ "tasks": tasks })),
        );
        assert_eq!(batch.status, 201, "{}", batch.text());
    }
    for n in 0..60 {
        let (id, token) = claim_one(&service, &worker, "frames");
        let path = format!("/v1/ns/renders/tasks/{id}");
        match n % 20 {
            0 => {
                let failure = json!({ "version": 1, "token": token, "retry": "backoff", "error": "the renderer ran out of memory" });
                let failed = service.send(
                    "POST",
                    &format!("{path}/fail"),
                    Some(&worker),
                    Some(&failure),
                );
                assert_eq!(failed.status, 200);
            }
            n if n < 14 => {
                let key = format!("{id}-once");
                let body = json!({ "version": 1, "token": token, "output": { "pixels": 42 } });
                let submitted = service.send_with(
                    "POST",
                    &format!("{path}/submit"),
                    Some(&worker),
                    &[("idempotency-key", &key)],
                    Some(&body),
                );
                assert_eq!(submitted.status, 200);
            }
            _ => {}
        }
    }
    let cookie = keep_key(&service, &admin);
    let with = &[("cookie", cookie.as_str())];
    assert_eq!(
        post_form(
            service.address,
            "/board/ns/renders/queues/emails/pause",
            with,
            ""
        )
        .status,
        303
    );
    assert_eq!(
        post_form(
            service.address,
            "/board/ns/renders/queues/reports/limits",
            with,
            "queue=4&per_partition=1"
        )
        .status,
        303
    );
    // A task with two alternatives: one submitted, one failed for good.
    let body = json!({ "id": "frame-7", "brief": { "scene": "harbour", "frame": 7, "quality": "final" }, "alternatives": 2, "max_tries": 1, "partition_key": "customer-1" });
    let made = service.send(
        "POST",
        "/v1/ns/renders/queues/hero/tasks",
        Some(&worker),
        Some(&body),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let (first, first_token) = claim_one(&service, &worker, "hero");
    let (second, second_token) = claim_one(&service, &admin, "hero");
    assert_eq!((first.as_str(), second.as_str()), ("frame-7", "frame-7"));
    let beat =
        json!({ "version": 1, "token": first_token, "progress": { "rows": 1080, "of": 1080 } });
    assert_eq!(
        service
            .send(
                "POST",
                "/v1/ns/renders/tasks/frame-7/heartbeat",
                Some(&worker),
                Some(&beat)
            )
            .status,
        200
    );
    let body = json!({ "version": 1, "token": first_token, "output": { "pixels": 2073600, "file": "frame-7.exr" } });
    assert_eq!(
        service
            .send_with(
                "POST",
                "/v1/ns/renders/tasks/frame-7/submit",
                Some(&worker),
                &[("idempotency-key", "frame-7-a1")],
                Some(&body)
            )
            .status,
        200
    );
    let failure = json!({ "version": 1, "token": second_token, "retry": "backoff", "error": "GPU lost: device reset during tile 12" });
    assert_eq!(
        service
            .send(
                "POST",
                "/v1/ns/renders/tasks/frame-7/fail",
                Some(&admin),
                Some(&failure)
            )
            .status,
        200
    );

    let mut browser = Browser::open(&format!("http://{}/board?ns=renders", service.address));
    browser.until_live();
    browser.evaluate(&format!(
        "document.getElementById('key').value = '{admin}'; \
         document.getElementById('key-form').requestSubmit(); true"
    ));
    // The live board posts the key to the board too, so the views open.
    browser.until(Duration::from_secs(30), |browser| {
        (browser.evaluate("document.getElementById('keyed').hidden") == json!(false)).then_some(())
    });
    for (path, file, ready) in [
        (
            "/board/queues?ns=renders",
            "board-queues.png",
            "document.querySelector('[data-queue=reports]') && true",
        ),
        (
            "/board/task?ns=renders&id=frame-7&version=1",
            "board-task.png",
            "document.querySelector('[data-attempt=\"2\"]') && true",
        ),
    ] {
        browser.page_command(
            "Page.navigate",
            json!({ "url": format!("http://{}{path}", service.address) }),
        );
        once_at(&mut browser, path, ready);
        browser.screenshot(&folder.join(file));
    }
}

/// Clicks the button `selector` on a page at `path` (JavaScript off: the
/// form posts), then waits until `done` holds of the store.
fn click(browser: &mut Browser, path: &str, selector: &str, mut done: impl FnMut() -> bool) {
    once_at(
        browser,
        path,
        &format!("document.querySelector('{selector}') && true"),
    );
    browser.evaluate(&format!(
        "document.querySelector('{selector}').click(); true"
    ));
    browser.until(Duration::from_secs(30), |_| done().then_some(()));
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
fn each_task_and_schedule_control_changes_the_store_in_chromium_without_javascript() {
    each_task_and_schedule_control_changes_the_store_in_chromium_without_javascript_over(
        &Service::sqlite(),
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn each_task_and_schedule_control_changes_the_store_in_chromium_without_javascript_on_postgres() {
    crate::on_postgres(
        "each_task_and_schedu",
        each_task_and_schedule_control_changes_the_store_in_chromium_without_javascript_over,
    );
}

fn each_task_and_schedule_control_changes_the_store_in_chromium_without_javascript_over(
    service: &Service,
) {
    let worker = service.worker();
    let admin = service.admin.clone();
    for n in 0..3 {
        crate::board::discard(service, &worker, &format!("broken-{n}"), "out of memory");
    }
    let put = service.send(
        "PUT",
        "/v1/ns/renders/schedules/nightly",
        Some(&admin),
        Some(&json!({ "queue": "frames", "cron": "0 3 * * *", "brief": {} })),
    );
    assert!(put.status == 201 || put.status == 200, "{}", put.text());
    let counts = || crate::board::store_counts(service);
    let caller = service.store.authenticate(Some(&admin)).unwrap();
    let renders = Namespace::parse("renders").unwrap();
    let schedule_paused = || {
        service
            .store
            .read_schedule(
                &caller,
                &renders,
                &tessera_store::ScheduleName::parse("nightly").unwrap(),
            )
            .unwrap()
            .paused
    };

    let base = format!("http://{}", service.address);
    let mut browser = without_javascript(&format!("{base}/board?ns=renders"));
    once_at(
        &mut browser,
        "/board?ns=renders",
        "document.getElementById('key') && true",
    );
    browser.evaluate(&format!(
        "document.getElementById('key').value = '{admin}'; \
         document.getElementById('key-form').submit(); true"
    ));
    once_at(
        &mut browser,
        "/board/queues?ns=renders",
        "document.body && true",
    );

    // A task's retry and cancel, from its detail.
    let detail = "/board/task?ns=renders&id=broken-0&version=1";
    browser.page_command("Page.navigate", json!({ "url": format!("{base}{detail}") }));
    click(&mut browser, detail, "button[data-action=retry]", || {
        counts()["discarded"] == 2
    });
    click(&mut browser, detail, "button[data-action=cancel]", || {
        counts()["cancelled"] == 1
    });

    // The list's bulk retry: its count, then the store changed.
    let list = "/board/tasks?ns=renders&state=discarded";
    browser.page_command("Page.navigate", json!({ "url": format!("{base}{list}") }));
    once_at(
        &mut browser,
        list,
        "document.getElementById('bulk-retry') && true",
    );
    browser.evaluate("document.getElementById('bulk-retry').click(); true");
    let count = once_at(
        &mut browser,
        "/board/bulk/retry?ns=renders&state=discarded",
        "document.getElementById('match-count')?.textContent ?? null",
    );
    assert_eq!(count, json!("2"));
    browser.evaluate("document.querySelector('button[data-action=retry]').click(); true");
    browser.until(Duration::from_secs(30), |_| {
        (counts()["discarded"] == 0 && counts()["ready"] == 2).then_some(())
    });

    // A schedule's pause and resume.
    let schedules = "/board/schedules?ns=renders";
    browser.page_command(
        "Page.navigate",
        json!({ "url": format!("{base}{schedules}") }),
    );
    click(
        &mut browser,
        schedules,
        "[data-schedule=nightly] button[data-action=pause]",
        &schedule_paused,
    );
    click(
        &mut browser,
        schedules,
        "[data-schedule=nightly] button[data-action=resume]",
        || !schedule_paused(),
    );
}
