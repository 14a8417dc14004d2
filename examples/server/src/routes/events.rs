//! The claim-events long-poll: `GET /v1/ns/{ns}/claims/{task}/events?wait=N`.
//!
//! Waits up to `wait` seconds (at most the store's
//! [`MAX_LONG_POLL`](tessera_store::limits::MAX_LONG_POLL) and the
//! server's own cap) for the namespace to change, checking the health
//! snapshot, which is not audited and reads nothing while it is fresh (a
//! change drops it). Then it reads the task once. So a request is audited
//! once, as `read_task`, however many checks it made.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use super::{AppState, Route, shutting_down, task_doc, task_ref};
use crate::auth::Authenticated;
use crate::errors::{ApiError, path, query};
use crate::limits::{VERSION, WAIT_SECONDS};
use crate::openapi::Doc;

/// How often the health snapshot is checked while a long-poll waits.
const CHECK_EVERY: Duration = Duration::from_millis(250);

pub(super) fn routes() -> Vec<Route> {
    vec![Route::new(
        Method::GET,
        "/v1/ns/{ns}/claims/{task}/events",
        Some("read_task"),
        task_doc(Doc::new(
            "claim_events",
            "long-poll a task's claim events: answers when its namespace changes or `wait` seconds pass, with the task's attempts; audited once per request",
        ))
        .keyed()
        .query(VERSION, "version")
        .query(WAIT_SECONDS, "wait")
        .answers(
            "200",
            "the task's attempts and whether the namespace changed while it waited",
            Some(json!({ "type": "object", "required": ["task", "changed", "waited_ms"] })),
        ),
        get(events),
    )]
}

/// The long-poll's query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct EventsQuery {
    version: Option<i64>,
    /// Seconds.
    wait: Option<i64>,
}

async fn events(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(parts)?;
    let fields = query(fields)?;
    let task = task_ref(&ns, &task, fields.version.unwrap_or(1))?;
    let wait = match fields.wait {
        None => Duration::ZERO,
        Some(seconds) => Duration::from_secs(WAIT_SECONDS.integer(seconds)? as u64),
    };
    let wait = wait.min(state.max_long_poll);
    let started = tokio::time::Instant::now();
    let deadline = started + wait;
    let changed = if wait.is_zero() {
        false
    } else {
        let namespace = task.namespace.clone();
        let watching = caller.clone();
        let first = state
            .call(move |store| store.health(&watching, &namespace))
            .await?;
        let mut changed = false;
        while tokio::time::Instant::now() < deadline {
            let nap = CHECK_EVERY.min(deadline - tokio::time::Instant::now());
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = state.closing() => return Err(shutting_down()),
            }
            let namespace = task.namespace.clone();
            let watching = caller.clone();
            let now = state
                .call(move |store| store.health(&watching, &namespace))
                .await?;
            if now.attempts != first.attempts || now.expired_leases != first.expired_leases {
                changed = true;
                break;
            }
        }
        changed
    };
    let read = task.clone();
    let view = state
        .call(move |store| store.read_task(&caller, &read))
        .await?;
    Ok(Json(json!({
        "task": task,
        "queue": view.queue,
        "record": view.record,
        "changed": changed,
        "waited_ms": started.elapsed().as_millis() as u64,
    }))
    .into_response())
}
