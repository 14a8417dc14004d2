//! The board's task list, `/board/tasks`, and a task's detail,
//! `/board/task`, with the forms that retry and cancel one task.
//!
//! The list is the store's listing of one state (one index range a page,
//! audited as `list_tasks`), filtered here by queue, partition key and
//! when each attempt reached its state: a filtered page keeps what matches
//! of up to [`SCAN_PAGES`] store pages, and says how many attempts it
//! looked at. A search by id opens the task's detail. The detail is the
//! task's own read (`read_task`), its receipts with outputs
//! (`alternatives`, when an attempt is done) and the task's audit events
//! among the newest the key may read.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::lease::StateName;
use tessera_store::{
    AuditQuery, Brief, Caller, ListOrder, Namespace, PartitionKey, QueueName, StoredReceipt,
    TaskListing, TaskQuery, TaskRef, TaskView,
};

use super::super::{AppState, Route, task_doc, task_ref};
use super::html::{escape, page, query_value, time_with_age};
use super::key::{caller, form_caller, see_other};
use super::{EVENTS_READ, ask_for_key, namespace_of};
use crate::errors::{ApiError, path, query};
use crate::limits::{
    self, BOARD_PARTITION_KEY, BOARD_QUEUE, ORDER, STATE, TASK_CURSOR, TASK_ID, TIME, VERSION,
    WITHIN,
};
use crate::openapi::Doc;

/// Attempts a store page of the list holds.
const PAGE: usize = 50;
/// The most store pages one filtered page of the list reads.
const SCAN_PAGES: usize = 10;

pub(super) fn routes() -> Vec<Route> {
    let ns = limits::Input {
        name: "ns",
        ..limits::NAMESPACE
    };
    vec![
        Route::new(
            Method::GET,
            "/board/tasks",
            Some("list_tasks"),
            filters(Doc::new(
                "board_tasks",
                "the board's task list: one state's attempts a page at a time, filtered by queue, partition key and when they reached the state; `id` opens a task's detail; HTML, with the board's key",
            ))
            .key_optional()
            .query(ns, "ns")
            .query(TASK_ID, "id")
            .query(VERSION, "version")
            .query(ORDER, "order")
            .query(TASK_CURSOR, "after")
            .answers("200", "an HTML page", None)
            .answers("303", "a search by id: on to the task's detail", None),
            get(list),
        ),
        Route::new(
            Method::GET,
            "/board/task",
            Some("read_task"),
            Doc::new(
                "board_task",
                "the board's task detail: the brief, every attempt with its lease, token and holder, progress, outputs and receipts, last errors, and the task's audit events; HTML, with the board's key",
            )
            .key_optional()
            .query(ns, "ns")
            .parameter_required(TASK_ID, "id")
            .query(VERSION, "version")
            .answers("200", "an HTML page", None),
            get(detail),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/tasks/{task}/retry",
            Some("retry_task"),
            task_doc(Doc::new(
                "board_retry_task",
                "the board's retry of one task: its failed, discarded and cancelled attempts ready again",
            ))
            .key_optional()
            .query(VERSION, "version")
            .answers("303", "done: back to the task's detail", None),
            post(retry),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/tasks/{task}/cancel",
            Some("cancel_task"),
            task_doc(Doc::new(
                "board_cancel_task",
                "the board's cancel of one task: its attempts not yet final cancelled",
            ))
            .key_optional()
            .query(VERSION, "version")
            .answers("303", "done: back to the task's detail", None),
            post(cancel),
        ),
    ]
}

/// The list's filters in a route's document: state, queue and partition
/// key (empty for any, as the filter form sends them), the times an
/// attempt reached its state between, and how recently (`within`, the
/// form's choice, which the answer turns into `since`).
pub(super) fn filters(doc: Doc) -> Doc {
    narrowing(doc.query(STATE, "state"))
}

/// The filters beyond the state: queue, partition key, and times.
pub(super) fn narrowing(doc: Doc) -> Doc {
    doc.query(BOARD_QUEUE, "queue")
        .query(BOARD_PARTITION_KEY, "partition_key")
        .query(TIME, "since")
        .query(TIME, "before")
        .query(WITHIN, "within")
}

/// The list's query, as typed.
#[derive(Deserialize)]
// Unknown query parameters are ignored, as the board's own are.
pub(super) struct ListFields {
    pub(super) ns: Option<String>,
    pub(super) state: Option<String>,
    pub(super) queue: Option<String>,
    pub(super) partition_key: Option<String>,
    pub(super) since: Option<String>,
    pub(super) before: Option<String>,
    pub(super) within: Option<String>,
    id: Option<String>,
    version: Option<i64>,
    order: Option<String>,
    after: Option<String>,
}

/// The filters of the list (and of a bulk action), checked.
#[derive(Debug, Clone)]
pub(super) struct Filters {
    pub(super) state: StateName,
    pub(super) queue: Option<QueueName>,
    pub(super) partition_key: Option<PartitionKey>,
    pub(super) since: Option<DateTime<Utc>>,
    pub(super) before: Option<DateTime<Utc>>,
}

/// A name field the filter form left empty is no filter.
fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|text| !text.is_empty())
}

/// A time filter: RFC 3339 within the years 1 to 9999 in UTC (so the
/// board can write it back as it came), or the `400` naming the field.
fn time(name: &str, text: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    use chrono::Datelike;
    text.map(|text| {
        DateTime::parse_from_rfc3339(text)
            .map(|at| at.with_timezone(&Utc))
            .ok()
            .filter(|at| (1..=9999).contains(&at.year()))
            .ok_or_else(|| {
                crate::errors::invalid(format!(
                    "{name} is not an RFC 3339 time in the years 1 to 9999 (UTC)"
                ))
            })
    })
    .transpose()
}

impl Filters {
    /// The filters of `fields` at `now`; the state is `ready` when none
    /// is given, and `within` is the `since` it means now (the later of
    /// the two when both are given).
    pub(super) fn of(fields: &ListFields, now: DateTime<Utc>) -> Result<Self, ApiError> {
        let within = fields
            .within
            .as_deref()
            .map(limits::within)
            .transpose()?
            .flatten()
            .map(|back| now - chrono::TimeDelta::from_std(back).unwrap_or(chrono::TimeDelta::MAX));
        let since = time("since", fields.since.as_deref())?;
        Ok(Self {
            state: fields
                .state
                .as_deref()
                .map_or(Ok(StateName::Ready), limits::state)?,
            queue: given(&fields.queue).map(QueueName::parse).transpose()?,
            partition_key: given(&fields.partition_key)
                .map(PartitionKey::parse)
                .transpose()?,
            since: since.max(within),
            before: time("before", fields.before.as_deref())?,
        })
    }

    /// Whether a filter beyond the state is set.
    fn narrows(&self) -> bool {
        self.queue.is_some()
            || self.partition_key.is_some()
            || self.since.is_some()
            || self.before.is_some()
    }

    /// Whether `listing` passes the filters beyond the state.
    pub(super) fn keeps(&self, listing: &TaskListing) -> bool {
        self.queue
            .as_ref()
            .is_none_or(|queue| *queue == listing.queue)
            && self
                .partition_key
                .as_ref()
                .is_none_or(|key| listing.partition_key.as_ref() == Some(key))
            && self.since.is_none_or(|since| listing.changed_at >= since)
            && self.before.is_none_or(|before| listing.changed_at < before)
    }

    /// The filters as a query string (without `ns`), each value encoded.
    pub(super) fn query(&self) -> String {
        let mut query = format!("state={}", self.state);
        let mut add = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                query.push_str(&format!("&{name}={}", query_value(&value)));
            }
        };
        add("queue", self.queue.as_ref().map(|q| q.as_str().to_owned()));
        add(
            "partition_key",
            self.partition_key.as_ref().map(|k| k.as_str().to_owned()),
        );
        let instant = |at: DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        add("since", self.since.map(instant));
        add("before", self.before.map(instant));
        query
    }

    /// The filter form, with these filters in it.
    pub(super) fn form(&self, namespace: &Namespace) -> String {
        let options: String = StateName::ALL
            .iter()
            .map(|state| {
                let selected = if *state == self.state {
                    " selected"
                } else {
                    ""
                };
                format!("<option{selected}>{state}</option>")
            })
            .collect();
        let value = |text: Option<String>| escape(&text.unwrap_or_default());
        let instant = |at: DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        let within: String = [
            ("any", "any time"),
            ("5m", "the last 5 minutes"),
            ("15m", "the last 15 minutes"),
            ("1h", "the last hour"),
            ("6h", "the last 6 hours"),
            ("24h", "the last day"),
            ("7d", "the last week"),
        ]
        .iter()
        .map(|(word, label)| format!("<option value=\"{word}\">{label}</option>"))
        .collect();
        let range = match (self.since, self.before) {
            (None, None) => String::new(),
            (since, before) => format!(
                "<span class=\"small\">now: since {} before {}</span>",
                value(since.map(instant)),
                value(before.map(instant))
            ),
        };
        format!(
            r#"<form method="get" action="/board/tasks" class="filters">
<input type="hidden" name="ns" value="{ns}">
<label>state <select name="state">{options}</select></label>
<label>queue <input name="queue" value="{queue}" size="12"></label>
<label>partition key <input name="partition_key" value="{partition}" size="12"></label>
<label>reached its state in <select name="within">{within}</select></label>
<button>filter</button> {range}
</form>"#,
            ns = escape(namespace.as_str()),
            queue = value(self.queue.as_ref().map(|q| q.as_str().to_owned())),
            partition = value(self.partition_key.as_ref().map(|k| k.as_str().to_owned())),
        )
    }
}

/// A page of the list: the attempts kept, how many were looked at, and
/// where the next page starts.
struct Found {
    kept: Vec<TaskListing>,
    scanned: usize,
    next: Option<String>,
}

/// Reads store pages of `filters.state` from `after` until one keeps
/// something, or [`SCAN_PAGES`] were read (one page when nothing narrows).
fn find(
    store: &tessera_store::Store,
    caller: &Caller,
    namespace: &Namespace,
    filters: &Filters,
    order: ListOrder,
    after: Option<tessera_store::TaskCursor>,
) -> Result<Found, tessera_store::Error> {
    let mut query = TaskQuery::new(filters.state);
    query.order = order;
    query.limit = PAGE;
    query.after = after;
    let mut found = Found {
        kept: Vec::new(),
        scanned: 0,
        next: None,
    };
    for _ in 0..SCAN_PAGES {
        let page = store.list_tasks(caller, namespace, &query)?;
        found.scanned += page.tasks.len();
        found
            .kept
            .extend(page.tasks.into_iter().filter(|task| filters.keeps(task)));
        found.next = page.next.map(|cursor| cursor.to_string());
        match page.next {
            Some(next) if found.kept.is_empty() && filters.narrows() => query.after = Some(next),
            _ => break,
        }
    }
    Ok(found)
}

async fn list(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let now = state.store.clock().now_utc();
    let filters = Filters::of(&fields, now)?;
    let order = fields
        .order
        .as_deref()
        .map_or(Ok(ListOrder::Oldest), limits::order)?;
    let after = fields
        .after
        .as_deref()
        .map(|after| TASK_CURSOR.cursor(after)?.parse())
        .transpose()?;
    let version = fields.version.map(|v| VERSION.integer(v)).transpose()?;
    let id = fields
        .id
        .as_deref()
        .map(tessera_store::TaskId::parse)
        .transpose()?;
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, "tasks", fields.ns.as_deref());
    };
    let Some(namespace) = namespace_of(&state, &caller, fields.ns.as_deref())? else {
        return Ok(page("tasks", None, true, NO_NAMESPACE));
    };
    if let Some(id) = id {
        return Ok(see_other(&detail_path(
            &namespace,
            id.as_str(),
            version.unwrap_or(1),
        )));
    }
    let (ns, shown) = (namespace.clone(), filters.clone());
    let found = state
        .call(move |store| find(store, &caller, &ns, &shown, order, after))
        .await?;
    Ok(page(
        "tasks",
        Some(&namespace),
        true,
        &render_list(&namespace, &filters, order, &found, now),
    ))
}

/// A keyed view whose key grants no namespace by name, asked for none.
const NO_NAMESPACE: &str =
    "<p class=\"note\">This key grants no namespace by name: add <code>?ns=NAME</code>.</p>";

/// The detail page of a task.
fn detail_path(namespace: &Namespace, id: &str, version: i64) -> String {
    format!(
        "/board/task?ns={}&id={}&version={version}",
        query_value(namespace.as_str()),
        query_value(id)
    )
}

/// A state as the board shows it: its name, and a backoff's end or a
/// discard's reason.
fn state_text(state: &Value) -> String {
    let mut text = state["state"].as_str().unwrap_or("?").to_owned();
    for (field, value) in state.as_object().into_iter().flatten() {
        if field != "state" {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            text.push_str(&format!(" ({field} {value})"));
        }
    }
    escape(&text)
}

fn render_list(
    namespace: &Namespace,
    filters: &Filters,
    order: ListOrder,
    found: &Found,
    now: DateTime<Utc>,
) -> String {
    let ns_query = query_value(namespace.as_str());
    let rows: String = found
        .kept
        .iter()
        .map(|listing| {
            let id = listing.task.id.as_str();
            let version = listing.task.version.as_u32();
            format!(
                "<tr data-task=\"{task}\"><td><a href=\"{href}\">{task}</a> v{version}</td><td>{queue}</td><td>{attempt}</td><td data-field=\"state\">{state}</td><td>{tries}</td><td>{partition}</td><td>{since}</td><td>{progress}</td></tr>",
                task = escape(id),
                href = escape(&detail_path(namespace, id, i64::from(version))),
                queue = escape(listing.queue.as_str()),
                attempt = listing.attempt,
                state = state_text(&json!(listing.state)),
                tries = listing.tries,
                partition = escape(listing.partition_key.as_ref().map_or("", |k| k.as_str())),
                since = time_with_age(listing.changed_at, now),
                progress = escape(&listing.progress.as_ref().map_or_else(String::new, Value::to_string)),
            )
        })
        .collect();
    let order_word = match order {
        ListOrder::Newest => "newest",
        _ => "oldest",
    };
    let next = found
        .next
        .as_ref()
        .map(|next| {
            format!(
                "<a href=\"/board/tasks?ns={ns_query}&amp;{filters}&amp;order={order_word}&amp;after={next}\" id=\"next\">next page</a>",
                filters = escape(&filters.query()),
                next = query_value(next),
            )
        })
        .unwrap_or_default();
    let flip = if order_word == "oldest" {
        "newest"
    } else {
        "oldest"
    };
    let bulk = super::bulk::offer(namespace, filters);
    format!(
        r#"<section class="wide">
<h2>Tasks</h2>
<form method="get" action="/board/tasks" class="search"><input type="hidden" name="ns" value="{ns}"><label>task id <input name="id" size="24" required></label> <label>version <input type="number" name="version" min="1" value="1"></label> <button>open</button></form>
{form}
<p class="small" id="scanned">{kept} shown of {scanned} {state} attempts looked at, {order_word} first · <a href="/board/tasks?ns={ns_query}&amp;{query}&amp;order={flip}">{flip} first</a></p>
<table class="tasks"><thead><tr><th>task</th><th>queue</th><th>attempt</th><th>state</th><th>tries</th><th>partition key</th><th>in this state since</th><th>progress</th></tr></thead>
<tbody>{rows}</tbody></table>
<p>{next}</p>
{bulk}
</section>"#,
        ns = escape(namespace.as_str()),
        form = filters.form(namespace),
        kept = found.kept.len(),
        scanned = found.scanned,
        state = filters.state,
        query = escape(&filters.query()),
    )
}

/// The detail's query.
#[derive(Deserialize)]
// Unknown query parameters are ignored, as the board's own are.
struct DetailFields {
    ns: Option<String>,
    id: Option<String>,
    version: Option<i64>,
}

/// What the detail shows: the task, its receipts, its audit events.
struct Detail {
    view: TaskView,
    receipts: Vec<StoredReceipt>,
    events: Vec<tessera_store::AuditEvent>,
}

async fn detail(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<DetailFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let id = fields
        .id
        .as_deref()
        .ok_or_else(|| crate::errors::invalid("id is required"))?;
    let id = tessera_store::TaskId::parse(id)?;
    let version = VERSION.integer(fields.version.unwrap_or(1))?;
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, "task", fields.ns.as_deref());
    };
    let Some(namespace) = namespace_of(&state, &caller, fields.ns.as_deref())? else {
        return Ok(page("task", None, true, NO_NAMESPACE));
    };
    let task = task_ref(namespace.as_str(), id.as_str(), version)?;
    let read = task.clone();
    let detail = state
        .call(move |store| {
            let view = store.read_task(&caller, &read)?;
            let done = view
                .record
                .attempts
                .iter()
                .any(|attempt| attempt.state.name() == StateName::Done);
            let receipts = if done {
                store.alternatives(&caller, &read)?
            } else {
                Vec::new()
            };
            let resource = format!("task:{}@{}", read.id, read.version);
            let mut events = store
                .audit(
                    &caller,
                    &AuditQuery {
                        limit: EVENTS_READ,
                        ..AuditQuery::default()
                    },
                )?
                .events;
            events.retain(|event| {
                event.namespace.as_str() == read.namespace.as_str()
                    && event.resource.as_ref().is_some_and(|r| {
                        let r = r.as_str();
                        r == resource || r.starts_with(&format!("{resource}/"))
                    })
            });
            Ok(Detail {
                view,
                receipts,
                events,
            })
        })
        .await?;
    let now = state.store.clock().now_utc();
    Ok(page(
        "task",
        Some(&namespace),
        true,
        &render_detail(&task, &detail, now),
    ))
}

/// A brief or an output as text: JSON pretty, bytes as UTF-8 when they
/// are, else their length.
fn shown_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => escape(text),
        Err(_) => format!("({} bytes, not text)", bytes.len()),
    }
}

fn render_detail(task: &TaskRef, detail: &Detail, now: DateTime<Utc>) -> String {
    let view = &detail.view;
    let brief = match &view.brief {
        Brief::Json(value) => {
            escape(&serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()))
        }
        Brief::Bytes(bytes) => shown_bytes(bytes),
    };
    let attempts: String = view
        .record
        .attempts
        .iter()
        .map(|attempt| {
            let lease = json!(attempt.lease);
            let progress = view
                .progress
                .iter()
                .find(|progress| progress.attempt == attempt.number)
                .map(|progress| escape(&progress.progress.to_string()))
                .unwrap_or_default();
            let output = detail
                .receipts
                .iter()
                .find(|stored| stored.receipt.attempt == attempt.number)
                .map(|stored| {
                    let receipt = json!(stored.receipt);
                    format!(
                        "<pre data-field=\"output\">{}</pre><div class=\"small\">receipt: token {}, by {}, idempotency key {}</div>",
                        stored.output.as_deref().map(shown_bytes).unwrap_or_default(),
                        escape(&receipt["token"].to_string()),
                        escape(receipt["principal"].as_str().unwrap_or("")),
                        escape(receipt["idempotency_key"].as_str().unwrap_or("")),
                    )
                })
                .unwrap_or_default();
            let lease_cells = match attempt.lease.as_ref() {
                Some(held) => format!(
                    "<td data-field=\"token\">{}</td><td data-field=\"holder\">{}</td><td>{}</td><td>{}</td>",
                    escape(&lease["token"].to_string()),
                    escape(held.holder.as_str()),
                    time_with_age(held.granted_at, now),
                    escape(&held.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                ),
                None => "<td></td><td></td><td></td><td></td>".to_owned(),
            };
            format!(
                "<tr data-attempt=\"{number}\"><td>{number}</td><td data-field=\"state\">{state}</td><td>{tries}</td>{lease_cells}<td data-field=\"last_error\">{error}</td><td>{progress}</td><td>{output}</td></tr>",
                number = attempt.number,
                state = state_text(&json!(attempt.state)),
                tries = attempt.tries,
                error = escape(attempt.last_error.as_deref().unwrap_or("")),
            )
        })
        .collect();
    let events: String = detail
        .events
        .iter()
        .map(|event| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                time_with_age(event.time, now),
                escape(event.action.as_str()),
                escape(event.outcome.as_str()),
                escape(event.principal.as_str()),
                escape(event.resource.as_ref().map_or("", |r| r.as_str())),
            )
        })
        .collect();
    let ns = query_value(task.namespace.as_str());
    let action = format!("/board/ns/{ns}/tasks/{}", query_value(task.id.as_str()));
    let version = task.version.as_u32();
    format!(
        r#"<section class="wide" data-task="{id}">
<h2>Task {id} v{version}</h2>
<p>queue <a href="/board/tasks?ns={ns}&amp;queue={queue_query}">{queue}</a> · enqueued {created} · partition key {partition} · unique key {unique} · tries allowed {max_tries} · priority {priority}</p>
<form method="post" action="{action}/retry?version={version}" class="inline"><button data-action="retry">retry</button></form>
<form method="post" action="{action}/cancel?version={version}" class="inline"><button data-action="cancel">cancel</button></form>
<h3>Brief</h3>
<pre id="brief">{brief}</pre>
<h3>Attempts</h3>
<table class="attempts"><thead><tr><th>attempt</th><th>state</th><th>tries</th><th>token</th><th>holder</th><th>granted</th><th>expires</th><th>last error</th><th>progress</th><th>output and receipt</th></tr></thead>
<tbody>{attempts}</tbody></table>
<h3>Audit events of this task</h3>
<p class="small">Among the newest {read} events this key may read.</p>
<table class="events"><thead><tr><th>time</th><th>action</th><th>outcome</th><th>principal</th><th>resource</th></tr></thead><tbody id="task-events">{events}</tbody></table>
</section>"#,
        id = escape(task.id.as_str()),
        queue = escape(view.queue.as_str()),
        queue_query = query_value(view.queue.as_str()),
        created = time_with_age(view.created_at, now),
        partition = escape(view.partition_key.as_ref().map_or("none", |k| k.as_str())),
        unique = escape(view.unique_key.as_ref().map_or("none", |k| k.as_str())),
        max_tries = view.record.max_tries,
        priority = view.record.priority,
        read = EVENTS_READ,
    )
}

/// The path of a board form on one task, and its version.
#[derive(Deserialize)]
// Unknown query parameters are ignored, as the board's own are.
struct VersionField {
    version: Option<i64>,
}

async fn retry(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    on_task(state, headers, parts, fields, false).await
}

async fn cancel(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    on_task(state, headers, parts, fields, true).await
}

/// Retries or cancels one task, then back to its detail.
async fn on_task(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
    cancel: bool,
) -> Result<Response, ApiError> {
    let (ns, id) = path(parts)?;
    let version = query(fields)?.version.unwrap_or(1);
    let task = task_ref(&ns, &id, version)?;
    let caller = form_caller(&state, &headers).await?;
    let back = detail_path(&task.namespace, task.id.as_str(), version);
    state
        .call(move |store| {
            if cancel {
                store.cancel_task(&caller, &task)
            } else {
                store.retry_task(&caller, &task)
            }
        })
        .await?;
    Ok(see_other(&back))
}
