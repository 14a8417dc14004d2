//! The board's queues view, `/board/queues`: per queue its work by state,
//! whether it is paused or limited, how long its oldest ready task has
//! waited, and the forms that pause, resume and limit it.
//!
//! Everything it shows is the namespace's health snapshot (queue depths
//! and settings included), so the view reads nothing while the snapshot
//! is fresh and writes nothing. Each control is a form posted to its own
//! route, which calls the store operation of the same name and answers
//! `303` back to the view.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use tessera_store::{ConcurrencyLimit, HealthSnapshot, Namespace, QueueDepth, QueueSettings};

use super::super::{AppState, Route, object, queue_doc, queue_names};
use super::html::{escape, page, query_value, time_with_age};
use super::key::{caller, form_caller, see_other};
use super::{NsQuery, ask_for_key, namespace_of};
use crate::errors::{ApiError, invalid, path, query};
use crate::limits::{PARTITION_LIMIT, QUEUE_LIMIT};
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    let ns = crate::limits::Input {
        name: "ns",
        ..crate::limits::NAMESPACE
    };
    let control = |id: &str, summary: &str| {
        queue_doc(Doc::new(id, summary)).key_optional().answers(
            "303",
            "done: back to the queues view",
            None,
        )
    };
    vec![
        Route::new(
            Method::GET,
            "/board/queues",
            Some("health"),
            Doc::new(
                "board_queues",
                "the board's queues view: per queue its ready, delayed and leased tasks, the oldest ready task's wait, paused or limited, with their controls; from the health snapshot; HTML, with the board's key",
            )
            .key_optional()
            .query(ns, "ns")
            .answers("200", "an HTML page", None),
            get(view),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/queues/{queue}/pause",
            Some("pause_queue"),
            control("board_pause_queue", "the board's pause: pauses the queue"),
            post(pause),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/queues/{queue}/resume",
            Some("resume_queue"),
            control("board_resume_queue", "the board's resume: resumes the queue"),
            post(resume),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/queues/{queue}/limits",
            Some("set_queue_limits"),
            control(
                "board_set_queue_limits",
                "the board's limits: sets the queue's concurrency limits, in all and per partition key (0 for none); a form",
            )
            .form(object(
                json!({ "queue": QUEUE_LIMIT.schema(), "per_partition": PARTITION_LIMIT.schema() }),
                &["queue", "per_partition"],
            )),
            post(limits),
        ),
    ]
}

async fn view(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, "queues", fields.ns.as_deref());
    };
    let namespace = namespace_of(&state, &caller, fields.ns.as_deref())?;
    let Some(namespace) = namespace else {
        return Ok(page(
            "queues",
            None,
            true,
            "<p class=\"note\">This key grants no namespace by name: open <code>/board/queues?ns=NAME</code>.</p>",
        ));
    };
    let ns = namespace.clone();
    let snapshot = state.call(move |store| store.health(&caller, &ns)).await?;
    state.remember(|history, now| history.snapshot(now, &snapshot));
    let now = state.store.clock().now_utc();
    let body = render(&namespace, &snapshot, now);
    Ok(page("queues", Some(&namespace), true, &body))
}

/// One row of the view: a queue's depth and settings, either possibly
/// absent (a queue with no work, or never configured).
#[derive(Default)]
struct QueueRow<'a> {
    depth: Option<&'a QueueDepth>,
    settings: Option<&'a QueueSettings>,
}

fn render(namespace: &Namespace, snapshot: &HealthSnapshot, now: DateTime<Utc>) -> String {
    let mut rows: BTreeMap<&str, QueueRow<'_>> = BTreeMap::new();
    for depth in &snapshot.depths {
        rows.entry(depth.queue.as_str()).or_default().depth = Some(depth);
    }
    for settings in &snapshot.queues {
        rows.entry(settings.queue.as_str()).or_default().settings = Some(settings);
    }
    let ns = escape(namespace.as_str());
    let ns_query = query_value(namespace.as_str());
    let mut body = String::new();
    for (name, row) in &rows {
        let queue = escape(name);
        let action = format!("/board/ns/{ns_query}/queues/{}", query_value(name));
        let count = |field: fn(&QueueDepth) -> u64| row.depth.map_or(0, field);
        let oldest = row
            .depth
            .and_then(|depth| depth.oldest_ready_at)
            .map_or_else(|| "–".to_owned(), |at| time_with_age(at, now));
        let paused = row.settings.and_then(|settings| settings.paused_at);
        let limit = row
            .settings
            .map(|settings| settings.limit)
            .unwrap_or(ConcurrencyLimit::NONE);
        let number = |value: Option<NonZeroU32>| value.map_or(0, NonZeroU32::get);
        let status = match paused {
            Some(at) => format!(
                "<span class=\"paused\">paused</span> {}",
                time_with_age(at, now)
            ),
            None => "running".to_owned(),
        };
        let toggle = if paused.is_some() {
            format!(
                "<form method=\"post\" action=\"{action}/resume\" class=\"inline\"><button data-action=\"resume\">resume</button></form>"
            )
        } else {
            format!(
                "<form method=\"post\" action=\"{action}/pause\" class=\"inline\"><button data-action=\"pause\">pause</button></form>"
            )
        };
        let (all, per_partition) = (number(limit.queue), number(limit.per_partition));
        let limits = format!(
            "<form method=\"post\" action=\"{action}/limits\" class=\"inline limits\">\
             <label>in all <input type=\"number\" name=\"queue\" min=\"0\" max=\"{max}\" value=\"{all}\" required></label> \
             <label>per partition <input type=\"number\" name=\"per_partition\" min=\"0\" max=\"{max}\" value=\"{per_partition}\" required></label> \
             <button data-action=\"limits\">set limits</button></form>",
            max = u32::MAX,
        );
        let shown = |value: u32| {
            if value == 0 {
                "none".to_owned()
            } else {
                value.to_string()
            }
        };
        body.push_str(&format!(
            "<tr data-queue=\"{queue}\"><th scope=\"row\"><a href=\"/board/tasks?ns={ns_query}&amp;queue={q}\">{queue}</a></th>\
             <td data-field=\"ready\">{ready}</td><td data-field=\"delayed\">{delayed}</td><td data-field=\"leased\">{leased}</td>\
             <td data-field=\"oldest\">{oldest}</td><td data-field=\"status\">{status}</td>\
             <td data-field=\"limit\">{limit_all}</td><td data-field=\"per_partition\">{limit_partition}</td>\
             <td>{toggle} {limits}</td></tr>",
            q = query_value(name),
            ready = count(|depth| depth.ready),
            delayed = count(|depth| depth.delayed),
            leased = count(|depth| depth.leased),
            limit_all = shown(all),
            limit_partition = shown(per_partition),
        ));
    }
    let empty = if rows.is_empty() {
        "<p class=\"note\">No queue has unfinished work or settings.</p>"
    } else {
        ""
    };
    let attempts = json!(snapshot.attempts);
    let states: String = super::STATES
        .iter()
        .map(|(field, label)| {
            format!(
                "<tr><th scope=\"row\">{label}</th><td data-count=\"{field}\">{}</td></tr>",
                attempts[field]
            )
        })
        .collect();
    format!(
        r#"<section class="wide">
<h2>Queues of {ns}</h2>
<p class="small">Ready: a claim could take it now (a paused or full queue's included). Delayed: waiting out a backoff or a not-before time. Oldest ready: when the queue's first-enqueued ready task was enqueued. Limits: leases held at once, 0 for none.</p>
{empty}
<table class="queues"><thead><tr><th>queue</th><th>ready</th><th>delayed</th><th>leased</th><th>oldest ready</th><th>state</th><th>limit in all</th><th>per partition</th><th>controls</th></tr></thead>
<tbody>{body}</tbody></table>
<p class="small">snapshot taken {taken} · <a href="/board/queues?ns={ns_query}">refresh</a></p>
</section>
<section>
<h2>Attempts of the namespace by state</h2>
<table class="counts">{states}
<tr><th scope="row">lapsed leases</th><td data-count="expired_leases">{expired}</td></tr></table>
</section>
"#,
        taken = time_with_age(snapshot.taken_at, now),
        expired = snapshot.expired_leases,
    )
}

async fn pause(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let caller = form_caller(&state, &headers).await?;
    let back = back_to(&ns);
    state
        .call(move |store| store.pause_queue(&caller, &ns, &queue))
        .await?;
    Ok(see_other(&back))
}

async fn resume(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let caller = form_caller(&state, &headers).await?;
    let back = back_to(&ns);
    state
        .call(move |store| store.resume_queue(&caller, &ns, &queue))
        .await?;
    Ok(see_other(&back))
}

/// The limits form: both fields, as the page's number inputs send them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsForm {
    queue: String,
    per_partition: String,
}

/// A whole number a form field carries, within `input`'s range; 0 is no
/// limit.
fn form_limit(input: crate::limits::Input, text: &str) -> Result<Option<NonZeroU32>, ApiError> {
    let value: i64 = text
        .trim()
        .parse()
        .map_err(|_| invalid(format!("{} is not a whole number", input.name)))?;
    let value = input.integer(value)?;
    Ok(u32::try_from(value).ok().and_then(NonZeroU32::new))
}

async fn limits(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<LimitsForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let Form(form) = form.map_err(crate::errors::rejected)?;
    let limit = ConcurrencyLimit {
        queue: form_limit(QUEUE_LIMIT, &form.queue)?,
        per_partition: form_limit(PARTITION_LIMIT, &form.per_partition)?,
    };
    let caller = form_caller(&state, &headers).await?;
    let back = back_to(&ns);
    state
        .call(move |store| store.set_queue_limits(&caller, &ns, &queue, limit))
        .await?;
    Ok(see_other(&back))
}

/// The queues view of `namespace`.
fn back_to(namespace: &Namespace) -> String {
    format!("/board/queues?ns={}", query_value(namespace.as_str()))
}
