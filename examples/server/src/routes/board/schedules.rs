//! The board's schedules view, `/board/schedules`: each schedule's cron
//! and zone, queue, next run and last fire, paused or not, with the forms
//! that pause and resume it. One audited `list_schedules` read a page.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tessera_store::limits::MAX_SCHEDULES_LISTED;
use tessera_store::{Namespace, ScheduleName, SchedulePage};

use super::super::{AppState, Route};
use super::html::{escape, page, query_value, time_to_come, time_with_age};
use super::key::{caller, form_caller, see_other};
use super::{ask_for_key, namespace_of};
use crate::errors::{ApiError, path, query};
use crate::limits::{NAMESPACE, SCHEDULE};
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    let ns = crate::limits::Input {
        name: "ns",
        ..NAMESPACE
    };
    let control = |id: &str, summary: &str| {
        Doc::new(id, summary)
            .path(NAMESPACE, "reports")
            .path(SCHEDULE, "nightly")
            .key_optional()
            .answers("303", "done: back to the schedules view", None)
    };
    vec![
        Route::new(
            Method::GET,
            "/board/schedules",
            Some("list_schedules"),
            Doc::new(
                "board_schedules",
                "the board's schedules view: each schedule's cron and zone, queue, next run and last fire, paused or not, with pause and resume; HTML, with the board's key",
            )
            .key_optional()
            .query(ns, "ns")
            .query(SCHEDULE, "after")
            .answers("200", "an HTML page", None),
            get(view),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/schedules/{name}/pause",
            Some("pause_schedule"),
            control(
                "board_pause_schedule",
                "the board's pause of a schedule: it fires no more until resumed",
            ),
            post(pause),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/schedules/{name}/resume",
            Some("resume_schedule"),
            control(
                "board_resume_schedule",
                "the board's resume of a schedule: its run-ats count from now",
            ),
            post(resume),
        ),
    ]
}

/// The view's query.
#[derive(Deserialize)]
// Unknown query parameters are ignored, as the board's own are.
struct ViewFields {
    ns: Option<String>,
    after: Option<String>,
}

async fn view(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<ViewFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let after = fields
        .after
        .as_deref()
        .map(ScheduleName::parse)
        .transpose()?;
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, "schedules", fields.ns.as_deref());
    };
    let Some(namespace) = namespace_of(&state, &caller, fields.ns.as_deref())? else {
        return Ok(page(
            "schedules",
            None,
            true,
            "<p class=\"note\">Add <code>?ns=NAME</code>.</p>",
        ));
    };
    let ns = namespace.clone();
    let listed = state
        .call(move |store| store.list_schedules(&caller, &ns, after.as_ref(), MAX_SCHEDULES_LISTED))
        .await?;
    let now = state.store.clock().now_utc();
    Ok(page(
        "schedules",
        Some(&namespace),
        true,
        &render(&namespace, &listed, now),
    ))
}

fn render(namespace: &Namespace, listed: &SchedulePage, now: DateTime<Utc>) -> String {
    let ns_query = query_value(namespace.as_str());
    let rows: String = listed
        .schedules
        .iter()
        .map(|schedule| {
            let name = escape(schedule.name.as_str());
            let action = format!(
                "/board/ns/{ns_query}/schedules/{}",
                query_value(schedule.name.as_str())
            );
            let (status, toggle) = if schedule.paused {
                (
                    "<span class=\"paused\">paused</span>",
                    format!("<form method=\"post\" action=\"{action}/resume\" class=\"inline\"><button data-action=\"resume\">resume</button></form>"),
                )
            } else {
                (
                    "active",
                    format!("<form method=\"post\" action=\"{action}/pause\" class=\"inline\"><button data-action=\"pause\">pause</button></form>"),
                )
            };
            format!(
                "<tr data-schedule=\"{name}\"><th scope=\"row\">{name}</th><td><code>{cron}</code> ({zone})</td><td>{queue}</td><td data-field=\"status\">{status}</td><td data-field=\"next\">{next}</td><td data-field=\"last\">{last}</td><td>{toggle}</td></tr>",
                cron = escape(&schedule.schedule.cron),
                zone = escape(&schedule.schedule.zone),
                queue = escape(schedule.queue.as_str()),
                next = schedule
                    .next_run_at
                    .map_or_else(|| "–".to_owned(), |at| time_to_come(at, now)),
                last = schedule
                    .last_run_at
                    .map_or_else(|| "never".to_owned(), |at| time_with_age(at, now)),
            )
        })
        .collect();
    let next = listed
        .next
        .as_ref()
        .map(|name| {
            format!(
                "<a href=\"/board/schedules?ns={ns_query}&amp;after={}\" id=\"next\">next page</a>",
                query_value(name.as_str())
            )
        })
        .unwrap_or_default();
    let empty = if listed.schedules.is_empty() {
        "<p class=\"note\">No schedule in this namespace.</p>"
    } else {
        ""
    };
    format!(
        r#"<section class="wide">
<h2>Schedules</h2>
{empty}
<table class="schedules"><thead><tr><th>schedule</th><th>cron (zone)</th><th>queue</th><th>state</th><th>next run</th><th>last fire</th><th>controls</th></tr></thead>
<tbody>{rows}</tbody></table>
<p>{next}</p>
</section>"#
    )
}

async fn pause(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    toggle(state, headers, parts, true).await
}

async fn resume(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    toggle(state, headers, parts, false).await
}

/// Pauses or resumes a schedule, then back to the view.
async fn toggle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<(String, String)>, PathRejection>,
    pause: bool,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (namespace, name) = (Namespace::parse(&ns)?, ScheduleName::parse(&name)?);
    let caller = form_caller(&state, &headers).await?;
    let back = format!("/board/schedules?ns={}", query_value(namespace.as_str()));
    state
        .call(move |store| {
            if pause {
                store.pause_schedule(&caller, &namespace, &name)
            } else {
                store.resume_schedule(&caller, &namespace, &name)
            }
        })
        .await?;
    Ok(see_other(&back))
}
