//! The board in headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol on a pipe (`--remote-debugging-pipe`: file
//! descriptors 3 and 4, given to Chromium through two FIFOs), so no
//! browser-driving crate is needed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_store::Namespace;

use crate::{Service, TASKS};

/// A headless Chromium with one page, and the protocol session to it.
pub(crate) struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    session: String,
    next: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Chromium opened at `url`, with a fresh profile.
    pub(crate) fn open(url: &str) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let dir = profile.path();
        let (to_path, from_path) = (dir.join("to-chromium"), dir.join("from-chromium"));
        for fifo in [&to_path, &from_path] {
            let made = Command::new("mkfifo").arg(fifo).status().unwrap();
            assert!(made.success(), "mkfifo");
        }
        let script = format!(
            "exec chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
             --disable-component-update --disable-sync --no-first-run --no-default-browser-check \
             --window-size=1280,1000 --user-data-dir={data} --remote-debugging-pipe '{url}' \
             3<{to} 4>{from}",
            data = dir.join("profile").display(),
            to = to_path.display(),
            from = from_path.display(),
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts (apt-get install chromium)");
        // The shell opens its end of each FIFO in turn; these opens meet them.
        let to = std::fs::OpenOptions::new()
            .write(true)
            .open(&to_path)
            .unwrap();
        let from = BufReader::new(std::fs::File::open(&from_path).unwrap());
        let mut browser = Self {
            child,
            to,
            from,
            session: String::new(),
            next: 0,
            _profile: profile,
        };
        let page = browser.until(Duration::from_secs(60), |browser| {
            let targets = browser.command(None, "Target.getTargets", json!({}));
            targets["targetInfos"]
                .as_array()
                .unwrap()
                .iter()
                .find(|target| target["type"] == "page")
                .map(|target| target["targetId"].as_str().unwrap().to_owned())
        });
        let attached = browser.command(
            None,
            "Target.attachToTarget",
            json!({ "targetId": page, "flatten": true }),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// Sends one command and returns its result, skipping events.
    pub(crate) fn command(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        match self.call(session, method, params) {
            Ok(result) => result,
            Err(answer) => panic!("{method}: {answer}"),
        }
    }

    /// Sends one command: its result, or the protocol's error answer.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Result<Value, Value> {
        self.next += 1;
        let mut message = json!({ "id": self.next, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.to.write_all(message.to_string().as_bytes()).unwrap();
        self.to.write_all(b"\0").unwrap();
        self.to.flush().unwrap();
        loop {
            let mut raw = Vec::new();
            self.from.read_until(0, &mut raw).unwrap();
            assert!(raw.pop() == Some(0), "chromium closed its pipe");
            let answer: Value = serde_json::from_slice(&raw).unwrap();
            if answer["id"] == self.next {
                if answer.get("error").is_some() {
                    return Err(answer);
                }
                return Ok(answer["result"].clone());
            }
        }
    }

    /// The value of a JavaScript expression in the page, or `None` while
    /// the page is between documents (a form's answer loading).
    pub(crate) fn try_evaluate(&mut self, expression: &str) -> Option<Value> {
        let session = self.session.clone();
        self.call(
            Some(&session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        )
        .ok()
        .map(|result| result["result"]["value"].clone())
    }

    /// Runs a command in the page's session.
    pub(crate) fn page_command(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.command(Some(&session), method, params)
    }

    /// The value of a JavaScript expression in the page.
    pub(crate) fn evaluate(&mut self, expression: &str) -> Value {
        let session = self.session.clone();
        let result = self.command(
            Some(&session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        result["result"]["value"].clone()
    }

    /// Retries `check` until it gives a value; panics after `limit`
    /// (a bound on waiting, not a measurement).
    pub(crate) fn until<T>(
        &mut self,
        limit: Duration,
        mut check: impl FnMut(&mut Self) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(value) = check(self) {
                return value;
            }
            assert!(Instant::now() < deadline, "the page never got there");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the page's script has updated it once.
    pub(crate) fn until_live(&mut self) {
        self.until(Duration::from_secs(30), |browser| {
            let live = browser.evaluate("document.getElementById('live').textContent");
            live.as_str()
                .is_some_and(|live| live.starts_with("updated"))
                .then_some(())
        });
    }

    /// The counts the page shows, by state.
    pub(crate) fn counts(&mut self) -> Value {
        self.evaluate(
            "JSON.stringify(Object.fromEntries([...document.querySelectorAll('[data-count]')]\
             .map(cell => [cell.dataset.count, Number(cell.textContent)])))",
        )
        .as_str()
        .map(|text| serde_json::from_str(text).unwrap())
        .unwrap_or(Value::Null)
    }

    /// A PNG of the page.
    pub(crate) fn screenshot(&mut self, to: &Path) {
        let session = self.session.clone();
        let shot = self.command(
            Some(&session),
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(to, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut rest = Vec::new();
        let _ = self.from.read_to_end(&mut rest);
    }
}

/// The store's counts of `renders`, as the board names them.
pub(crate) fn store_counts(service: &Service) -> Value {
    let snapshot = service
        .store
        .public_health(&Namespace::parse("renders").unwrap())
        .unwrap();
    let mut counts = json!(snapshot.attempts);
    counts["expired_leases"] = json!(snapshot.expired_leases);
    counts
}

/// A discarded task: one try, claimed, failed with its error.
pub(crate) fn discard(service: &Service, key: &str, id: &str, error: &str) {
    let body = json!({ "brief": { "id": id }, "id": id, "max_tries": 1, "priority": 3 });
    let enqueued = service.send("POST", TASKS, Some(key), Some(&body));
    assert_eq!(enqueued.status, 201, "{}", enqueued.text());
    let claimed = service.send(
        "POST",
        "/v1/ns/renders/queues/frames/claims",
        Some(key),
        None,
    );
    assert_eq!(claimed.status, 200, "{}", claimed.text());
    let claimed = claimed.json();
    assert_eq!(claimed["task"]["id"], id);
    let failure = json!({ "version": 1, "token": claimed["lease"]["token"], "retry": "backoff", "error": error });
    let failed = service.send(
        "POST",
        &format!("/v1/ns/renders/tasks/{id}/fail"),
        Some(key),
        Some(&failure),
    );
    assert_eq!(failed.status, 200, "{}", failed.text());
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
fn the_board_shows_the_stores_counts_and_updates_without_a_reload() {
    the_board_shows_the_stores_counts_and_updates_without_a_reload_over(&Service::sqlite());
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn the_board_shows_the_stores_counts_and_updates_without_a_reload_on_postgres() {
    crate::on_postgres(
        "the_board_shows_the_",
        the_board_shows_the_stores_counts_and_updates_without_a_reload_over,
    );
}

fn the_board_shows_the_stores_counts_and_updates_without_a_reload_over(service: &Service) {
    let worker = service.worker();
    discard(
        service,
        &worker,
        "broken-frame",
        "the renderer ran out of memory",
    );
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

    let mut browser = Browser::open(&format!("http://{}/board", service.address));
    browser.until_live();
    let expected = store_counts(service);
    assert_eq!(expected["ready"], 2);
    assert_eq!(expected["leased"], 1);
    assert_eq!(expected["discarded"], 1);
    assert_eq!(browser.counts(), expected);

    // A task enqueued elsewhere appears without a reload.
    browser.evaluate("window.sameDocument = true");
    assert_eq!(service.enqueue(&worker, json!("late")).status, 201);
    let shown = browser.until(Duration::from_secs(30), |browser| {
        let counts = browser.counts();
        (counts["ready"] == 3).then_some(counts)
    });
    assert_eq!(shown, store_counts(service));
    assert_eq!(
        browser.evaluate("window.sameDocument === true"),
        json!(true)
    );
    // The waiting work per queue follows too, with its oldest ready age.
    let waiting = browser.evaluate(
        "[...document.querySelectorAll('table.waiting [data-queue=frames] td')].map(td => td.textContent)",
    );
    assert_eq!(waiting[0], json!("3"), "{waiting}");
    assert!(waiting[3].as_str().unwrap().ends_with(" ago"), "{waiting}");

    // An operator's key shows its grants and the discarded task with its
    // last error, and retries it from the page.
    browser.evaluate(&format!(
        "document.getElementById('key').value = '{worker}'; \
         document.getElementById('key-form').requestSubmit(); true"
    ));
    let row = browser.until(Duration::from_secs(30), |browser| {
        let row = browser.evaluate("document.querySelector('#discarded tr')?.textContent ?? null");
        row.as_str().map(str::to_owned)
    });
    assert!(
        row.contains("broken-frame") && row.contains("the renderer ran out of memory"),
        "{row}"
    );
    assert_eq!(
        browser.evaluate("document.getElementById('grants').textContent"),
        json!("renders")
    );
    browser
        .evaluate("document.querySelector('#discarded button[data-action=retry]').click(); true");
    browser.until(Duration::from_secs(30), |_| {
        let counts = store_counts(service);
        (counts["discarded"] == 0 && counts["ready"] == 4).then_some(())
    });
    browser.until(Duration::from_secs(30), |browser| {
        (browser.counts()["ready"] == 4).then_some(())
    });
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
fn the_board_reads_without_javascript() {
    the_board_reads_without_javascript_over(&Service::sqlite());
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "drives Debian's chromium")]
#[cfg_attr(no_chromium, ignore = "needs Debian's chromium on the PATH")]
// Both reasons may hold; either keeps it out of the run.
#[allow(unused_attributes)]
#[cfg_attr(no_test_postgres, ignore = "TESSERA_TEST_POSTGRES_URL is not set")]
fn the_board_reads_without_javascript_on_postgres() {
    crate::on_postgres(
        "the_board_reads_with",
        the_board_reads_without_javascript_over,
    );
}

fn the_board_reads_without_javascript_over(service: &Service) {
    let worker = service.worker();
    for n in 0..2 {
        assert_eq!(service.enqueue(&worker, json!(n)).status, 201);
    }
    let page = service.send("GET", "/board", None, None).text();
    for (state, count) in [("ready", 2), ("leased", 0), ("done", 0), ("discarded", 0)] {
        assert!(
            page.contains(&format!(r#"<td data-count="{state}">{count}</td>"#)),
            "{state}: {page}"
        );
    }
    assert!(
        page.contains(r#"<td data-admission="limit">32</td>"#),
        "{page}"
    );
    assert!(page.contains("<noscript>"));
    let script = service.send("GET", "/board/board.js", None, None);
    assert!(script.content_type.starts_with("text/javascript"));
    assert!(script.text().contains("/board/feed.json"));
}

/// The quickstart's load over HTTP: 2,000 tasks, a heavy key running 90
/// workers and a light one running 10, each claiming, holding its lease a
/// second, heartbeating and submitting until `stop`; a few tasks fail for
/// good.
fn quickstart_load(service: &Service, stop: &std::sync::atomic::AtomicBool) -> usize {
    let (heavy, light) = (service.worker(), service.worker());
    for chunk in 0..2 {
        let tasks: Vec<Value> = (0..1000)
            .map(|n| json!({ "brief": { "frame": chunk * 1000 + n }, "max_tries": 1 }))
            .collect();
        let body = json!({ "tasks": tasks });
        let reply = service.send(
            "POST",
            "/v1/ns/renders/queues/frames/tasks/batch",
            Some(&heavy),
            Some(&body),
        );
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for worker in 0..100 {
            let key = if worker < 90 { &heavy } else { &light };
            let done = &done;
            scope.spawn(move || {
                let mut turn = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    turn += 1;
                    let claimed = service.send(
                        "POST",
                        "/v1/ns/renders/queues/frames/claims",
                        Some(key),
                        None,
                    );
                    if claimed.status != 200 {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                    let claimed = claimed.json();
                    let id = claimed["task"]["id"].as_str().unwrap().to_owned();
                    let held = json!({ "version": 1, "token": claimed["lease"]["token"] });
                    // The work itself: a lease held a while, as a render is.
                    std::thread::sleep(Duration::from_millis(1000));
                    let beat = service.send(
                        "POST",
                        &format!("/v1/ns/renders/tasks/{id}/heartbeat"),
                        Some(key),
                        Some(&held),
                    );
                    assert_eq!(beat.status, 200, "{}", beat.text());
                    if (worker * 7919 + turn) % 97 == 0 {
                        let mut failure = held.clone();
                        failure["retry"] = json!("backoff");
                        failure["error"] = json!("the renderer ran out of memory");
                        service.send(
                            "POST",
                            &format!("/v1/ns/renders/tasks/{id}/fail"),
                            Some(key),
                            Some(&failure),
                        );
                        continue;
                    }
                    let mut output = held.clone();
                    output["output"] = json!({ "pixels": 42 });
                    let submit = format!("/v1/ns/renders/tasks/{id}/submit");
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    let reply = agent
                        .post(format!("http://{}{submit}", service.address))
                        .header("authorization", format!("Bearer {key}"))
                        .header("idempotency-key", format!("{id}-once"))
                        .send_json(&output)
                        .unwrap();
                    assert_eq!(reply.status().as_u16(), 200);
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    done.into_inner()
}

#[test]
#[ignore = "takes the board's screenshot under load: TESSERA_BOARD_SCREENSHOT=docs/board.png"]
fn a_screenshot_of_the_board_under_the_quickstarts_load() {
    let to = std::env::var_os("TESSERA_BOARD_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("board-{}.png", std::process::id())));
    let service = Service::sqlite();
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the load however the scope ends, so a failure never hangs.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    std::thread::scope(|scope| {
        let load = scope.spawn(|| quickstart_load(&service, &stop));
        let _stop = StopOnDrop(&stop);
        let mut browser = Browser::open(&format!("http://{}/board", service.address));
        browser.until_live();
        browser.evaluate(&format!(
            "document.getElementById('key').value = '{}'; \
             document.getElementById('key-form').requestSubmit(); true",
            service.admin
        ));
        // Under way: work done, work left, something discarded.
        browser.until(Duration::from_secs(120), |browser| {
            let counts = browser.counts();
            let rows = browser.evaluate("document.querySelectorAll('#discarded tr').length");
            (counts["done"].as_u64() > Some(300)
                && counts["ready"].as_u64() > Some(0)
                && counts["discarded"].as_u64() > Some(0)
                && rows.as_u64() > Some(0))
            .then_some(())
        });
        browser.screenshot(&to);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(load.join().unwrap() > 300);
    });
    let png = std::fs::read(&to).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
