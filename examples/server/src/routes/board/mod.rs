//! The board at `/board`: one page an operator keeps open.
//!
//! Server-rendered HTML (it reads well with JavaScript off), and a little
//! script (`/board/board.js`, no build step) that keeps it live from
//! `/board/feed.json`:
//! - without a key, a public namespace's health snapshot and admission as
//!   it stands: the snapshot is served from the store's cache, so a poll
//!   reads nothing until the namespace changes, and writes nothing;
//! - with a key (typed into the page, kept in the tab's session storage),
//!   also the namespaces it grants, the recent audit events and counters,
//!   the oldest ready task and the discarded tasks with their last error.
//!   These are audited reads, so the script asks for them no more often
//!   than the snapshot is kept (15 s). Retry and cancel buttons call the
//!   task routes with the same key.
//!
//! An operator's key also opens the server-rendered views beside it
//! (each works with JavaScript off; the key is kept as [`key`] says):
//! [`queues`] and its controls, the task list and a task's detail
//! ([`tasks`]), bulk retry and cancel by filter ([`bulk`]), and
//! [`schedules`], and [`charts`] of the last hour.

mod bulk;
mod charts;
mod html;
mod key;
mod queues;
mod schedules;
mod tasks;

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::lease::StateName;
use tessera_store::{
    AuditQuery, Caller, Grant, HealthSnapshot, ListOrder, Namespace, Store, TaskQuery, TaskRef,
};

use self::html::{escape, query_value, time_with_age};
use super::{AppState, Route};
use crate::auth::bearer_key;
use crate::errors::{ApiError, query};
use crate::openapi::Doc;

const SCRIPT: &str = include_str!("../../../board/board.js");
const STYLE: &str = include_str!("../../../board/board.css");

/// The discarded tasks a keyed feed lists, each with its last error (one
/// audited read each, at most once per snapshot lifetime).
const DISCARDED_LISTED: usize = 20;

/// The newest audit events a keyed feed shows, of the namespace shown.
const EVENTS_SHOWN: usize = 20;

/// The audit events a keyed feed reads to find [`EVENTS_SHOWN`] of its
/// namespace: the audit read is a caller's (or for an admin everyone's),
/// newest first, not one namespace's.
const EVENTS_READ: usize = 500;

pub(super) fn routes() -> Vec<Route> {
    let ns = crate::limits::Input {
        name: "ns",
        ..crate::limits::NAMESPACE
    };
    let mut routes = vec![
        Route::new(
            Method::GET,
            "/board",
            Some("public_health"),
            Doc::new(
                "board",
                "the board: a namespace's attempts per state, admission, and for a key its audit and discarded tasks; HTML",
            )
            .query(ns, "ns")
            .answers("200", "an HTML page", None),
            get(board),
        ),
        Route::new(
            Method::GET,
            "/board/feed.json",
            Some("public_health"),
            Doc::new(
                "board_feed",
                "the board's live feed: the health snapshot and admission; with a key and `details`, its audit, oldest ready task and discarded tasks",
            )
            .key_optional()
            .query(ns, "ns")
            .query(crate::limits::DETAILS, "details")
            .answers("200", "the feed", Some(json!({ "type": "object", "required": ["admission"] }))),
            get(feed),
        ),
        Route::new(
            Method::GET,
            "/board/board.js",
            None,
            Doc::new("board_script", "the board's script").answers("200", "JavaScript", None),
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        ),
        Route::new(
            Method::GET,
            "/board/board.css",
            None,
            Doc::new("board_style", "the board's style sheet").answers("200", "CSS", None),
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        ),
    ];
    routes.extend(key::routes());
    routes.extend(queues::routes());
    routes.extend(tasks::routes());
    routes.extend(bulk::routes());
    routes.extend(schedules::routes());
    routes.extend(charts::routes());
    routes
}

/// A keyed view's query: the namespace it shows.
#[derive(Deserialize)]
// Unknown query parameters are ignored, as the board's own are.
struct NsQuery {
    ns: Option<String>,
}

/// The namespace a keyed view shows: the one asked for, else the first
/// the key grants by name, else the first public one.
fn namespace_of(
    state: &AppState,
    caller: &Caller,
    asked: Option<&str>,
) -> Result<Option<Namespace>, ApiError> {
    if let Some(name) = asked {
        return Ok(Some(Namespace::parse(name)?));
    }
    let granted = caller.grants().iter().find_map(|grant| match grant {
        Grant::Namespace(namespace) => Some(namespace.clone()),
        _ => None,
    });
    Ok(granted.or_else(|| state.public.namespaces.first().cloned()))
}

/// A keyed view asked for without a key: a page with the key's form.
fn ask_for_key(state: &AppState, view: &str, asked: Option<&str>) -> Result<Response, ApiError> {
    let namespace = chosen(state, asked)?;
    Ok(html::page(
        view,
        namespace.as_ref(),
        false,
        "<p class=\"note\" id=\"need-key\">This view is an operator's: enter a key above. It is kept in a cookie for this board only (HttpOnly, SameSite=Strict) until you forget it.</p>",
    ))
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "public, max-age=300"),
        ],
        text,
    )
        .into_response()
}

/// The board's query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct BoardQuery {
    ns: Option<String>,
    details: Option<i64>,
}

/// The namespace asked for, else the first public one.
fn chosen(state: &AppState, asked: Option<&str>) -> Result<Option<Namespace>, ApiError> {
    match asked {
        Some(name) => Ok(Some(Namespace::parse(name)?)),
        None => Ok(state.public.namespaces.first().cloned()),
    }
}

async fn board(
    State(state): State<Arc<AppState>>,
    fields: Result<Query<BoardQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let namespace = chosen(&state, fields.ns.as_deref())?;
    // The read-only view: a public namespace's snapshot, no key read.
    let snapshot = match &namespace {
        Some(namespace) if state.public.namespaces.contains(namespace) => {
            let namespace = namespace.clone();
            Some(
                state
                    .call(move |store| store.public_health(&namespace))
                    .await?,
            )
        }
        _ => None,
    };
    if let Some(snapshot) = &snapshot {
        state.remember(|history, now| history.snapshot(now, snapshot));
    }
    let admission = super::public::admission(&state.store, state.public.max_pending);
    let page = render(
        &state.public.namespaces,
        namespace.as_ref(),
        snapshot.as_ref(),
        &admission,
        state.store.is_refusing_writes(),
        state.store.clock().now_utc(),
    );
    Ok(html::html(page))
}

async fn feed(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<BoardQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let namespace = chosen(&state, fields.ns.as_deref())?;
    let details = match &fields.details {
        Some(details) => crate::limits::DETAILS.integer(*details)? == 1,
        None => false,
    };
    let key = bearer_key(&headers).map(str::to_owned);
    let keyed = key.is_some() || headers.contains_key(AUTHORIZATION);
    let mut body = json!({
        "namespace": namespace,
        "writes_refused": state.store.is_refusing_writes(),
        "admission": super::public::admission(&state.store, state.public.max_pending),
        "retention": state.store.last_retention(),
        "health": null,
    });
    if !keyed {
        if let Some(namespace) = namespace {
            let snapshot = state
                .call(move |store| store.public_health(&namespace))
                .await?;
            state.remember(|history, now| history.snapshot(now, &snapshot));
            body["health"] = json!(snapshot);
        }
        return Ok(Json(body).into_response());
    }
    let keyed = state
        .call(move |store| {
            let caller = store.authenticate(key.as_deref())?;
            keyed_feed(store, &caller, namespace.as_ref(), details)
        })
        .await?;
    for (field, value) in keyed.as_object().into_iter().flatten() {
        body[field] = value.clone();
    }
    Ok(Json(body).into_response())
}

/// What a key adds: the namespaces it grants, the namespace's health, and
/// with `details` the audited reads (audit, oldest ready, discarded).
fn keyed_feed(
    store: &Store,
    caller: &Caller,
    namespace: Option<&Namespace>,
    details: bool,
) -> Result<Value, tessera_store::Error> {
    let grants: Vec<String> = caller
        .grants()
        .iter()
        .map(|grant| match grant {
            Grant::Namespace(namespace) => namespace.as_str().to_owned(),
            Grant::AllNamespaces => "*".to_owned(),
            _ => "admin".to_owned(),
        })
        .collect();
    let mut feed = json!({ "grants": grants, "account": caller.account() });
    let Some(namespace) = namespace else {
        return Ok(feed);
    };
    feed["health"] = json!(store.health(caller, namespace)?);
    if !details {
        return Ok(feed);
    }
    let mut audit = store.audit(
        caller,
        &AuditQuery {
            limit: EVENTS_READ,
            ..AuditQuery::default()
        },
    )?;
    // Only the namespace shown: another namespace's schedule fires or
    // claims are not this board's.
    audit
        .events
        .retain(|event| event.namespace.as_str() == namespace.as_str());
    audit.events.truncate(EVENTS_SHOWN);
    audit
        .counters
        .retain(|counter| counter.key.namespace().as_str() == namespace.as_str());
    audit.counters.truncate(EVENTS_SHOWN);
    audit.next = None;
    let mut oldest = TaskQuery::new(StateName::Ready);
    oldest.order = ListOrder::Oldest;
    oldest.limit = 1;
    let oldest = store.list_tasks(caller, namespace, &oldest)?;
    let mut discarded = TaskQuery::new(StateName::Discarded);
    discarded.order = ListOrder::Newest;
    discarded.limit = DISCARDED_LISTED;
    let discarded = store.list_tasks(caller, namespace, &discarded)?;
    let mut rows = Vec::new();
    for listing in &discarded.tasks {
        let mut row = json!(listing);
        let task = TaskRef::new(
            listing.task.namespace.clone(),
            listing.task.id.clone(),
            listing.task.version,
        );
        let view = store.read_task(caller, &task)?;
        let attempt = view
            .record
            .attempts
            .iter()
            .find(|attempt| attempt.number == listing.attempt);
        row["last_error"] = json!(attempt.and_then(|attempt| attempt.last_error.clone()));
        rows.push(row);
    }
    feed["audit"] = json!(audit);
    feed["oldest_ready"] = json!(oldest.tasks.first());
    feed["discarded"] = json!(rows);
    Ok(feed)
}

/// The states the board counts, in its order, with their labels.
pub(super) const STATES: &[(&str, &str)] = &[
    ("ready", "ready"),
    ("scheduled", "scheduled"),
    ("backoff", "backoff"),
    ("leased", "leased"),
    ("done", "done"),
    ("failed", "failed"),
    ("discarded", "discarded"),
    ("cancelled", "cancelled"),
    ("waiting", "waiting for parents"),
];

fn render(
    public: &[Namespace],
    namespace: Option<&Namespace>,
    snapshot: Option<&HealthSnapshot>,
    admission: &Value,
    refusing: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> String {
    let name = namespace.map(|ns| escape(ns.as_str())).unwrap_or_default();
    let counts = snapshot.map(|snapshot| json!(snapshot.attempts));
    let mut cells = String::new();
    for (field, label) in STATES {
        let value = counts
            .as_ref()
            .map(|counts| counts[field].to_string())
            .unwrap_or_else(|| "–".to_owned());
        cells.push_str(&format!(
            "<tr><th scope=\"row\">{label}</th><td data-count=\"{field}\">{value}</td></tr>"
        ));
    }
    let expired = snapshot
        .map(|snapshot| snapshot.expired_leases.to_string())
        .unwrap_or_else(|| "–".to_owned());
    let taken = snapshot
        .map(|snapshot| snapshot.taken_at.to_rfc3339())
        .unwrap_or_default();
    let waiting_work: String = snapshot
        .map(|snapshot| {
            snapshot
                .depths
                .iter()
                .map(|depth| {
                    let oldest = depth
                        .oldest_ready_at
                        .map_or_else(|| "–".to_owned(), |at| time_with_age(at, now));
                    format!(
                        "<tr data-queue=\"{queue}\"><th scope=\"row\">{queue}</th><td>{}</td><td>{}</td><td>{}</td><td data-field=\"oldest\">{oldest}</td></tr>",
                        depth.ready,
                        depth.delayed,
                        depth.leased,
                        queue = escape(depth.queue.as_str()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let admission_rows: String = ADMISSION
        .iter()
        .map(|(field, label)| {
            format!(
                "<tr><th scope=\"row\">{label}</th><td data-admission=\"{field}\">{}</td></tr>",
                admission[field]
            )
        })
        .collect();
    let links: String = public
        .iter()
        .map(|ns| {
            format!(
                "<a href=\"/board?ns={}\">{}</a> ",
                query_value(ns.as_str()),
                escape(ns.as_str())
            )
        })
        .collect();
    let note = match (namespace, snapshot) {
        (None, _) => {
            "<p class=\"note\">No namespace is public. Enter a key to see one it grants.</p>"
                .to_owned()
        }
        (Some(_), None) => {
            "<p class=\"note\">This namespace is not public: enter a key that grants it.</p>"
                .to_owned()
        }
        _ => String::new(),
    };
    let refused = if refusing {
        "<p class=\"alert\" id=\"refused\">Storage refuses writes: reads answer, writes are 503 storage_quota_exhausted.</p>"
    } else {
        "<p class=\"alert\" id=\"refused\" hidden>Storage refuses writes.</p>"
    };
    let navigation = html::navigation(namespace, false);
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tessera board · {name}</title>
<link rel="stylesheet" href="/board/board.css">
</head>
<body data-namespace="{name}">
<header>
<h1>Tessera <span class="namespace">{name}</span></h1>
<nav>public: {links}<a href="/llms.txt">llms.txt</a> <a href="/v1/openapi.json">OpenAPI</a></nav>
{navigation}
</header>
{refused}
{note}
<main>
<section>
<h2>Attempts by state</h2>
<table class="counts">{cells}
<tr><th scope="row">lapsed leases</th><td data-count="expired_leases">{expired}</td></tr></table>
<p class="small">snapshot taken <time id="taken">{taken}</time> · all queues of the namespace</p>
</section>
<section>
<h2>Admission</h2>
<table class="admission">{admission_rows}</table>
<p class="small">Claims past the slots wait their turn in the waiting places; while several keys wait, none may hold more than its fair share of the places, so one busy key cannot crowd out the rest.</p>
</section>
<section>
<h2>Waiting work</h2>
<table class="waiting"><thead><tr><th>queue</th><th>ready</th><th>delayed</th><th>leased</th><th>oldest ready</th></tr></thead><tbody>{waiting_work}</tbody></table>
<p class="small">Oldest ready: when the queue's first-enqueued ready task was enqueued, as of the snapshot.</p>
</section>
<section>
<h2>Finished work</h2>
<p id="retention">Last purge: <time data-retention="ran_at">–</time> · <span data-retention="tasks_purged">–</span> tasks, <span data-retention="rows_deleted">–</span> rows deleted (this server's retention runs)</p>
</section>
<section id="operator">
<h2>Operator</h2>
<noscript><p class="note">Without JavaScript, a key (entered above) opens the queues, tasks and schedules views; this page's live operator panel needs JavaScript.</p></noscript>
<div id="keyed" hidden>
<p>Account <b id="account"></b>; grants: <span id="grants"></span> <button type="button" id="forget">Forget key</button></p>
<h3>Oldest ready task</h3><p id="oldest">–</p>
<h3>Discarded tasks</h3>
<table><thead><tr><th>task</th><th>attempt</th><th>tries</th><th>reason</th><th>last error</th><th></th></tr></thead><tbody id="discarded"></tbody></table>
<h3>Recent audit events of this namespace</h3>
<table><thead><tr><th>time</th><th>action</th><th>outcome</th><th>resource</th></tr></thead><tbody id="events"></tbody></table>
<h3>Counters of this namespace</h3>
<table><thead><tr><th>minute</th><th>action</th><th>outcome</th><th>count</th></tr></thead><tbody id="counters"></tbody></table>
</div>
</section>
</main>
<footer class="small">Live: <span id="live">off (JavaScript)</span></footer>
<script src="/board/board.js" defer></script>
</body>
</html>
"#
    )
}

/// Admission's fields, in an operator's words.
const ADMISSION: &[(&str, &str)] = &[
    ("limit", "claims served at once (the concurrency limit)"),
    ("in_flight", "claims being served now"),
    ("waiting", "claims waiting for their turn"),
    ("waiting_keys", "keys with claims waiting"),
    (
        "share_per_waiting_key",
        "most claims one key may have waiting now (its fair share)",
    ),
    ("max_pending", "waiting places in all"),
];
