//! Queue settings: pause, resume, concurrency limits, and reading them.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::{
    Caller, ConcurrencyLimit, Error as StoreError, Namespace, QueueName, QueueSettings, Store,
};

use super::{AppState, Route, object, queue_doc, queue_names};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path};
use crate::limits::{PARTITION_LIMIT, QUEUE_LIMIT};
use crate::openapi::Doc;

/// The schema of a queue's settings.
fn settings_schema() -> Value {
    json!({
        "type": "object",
        "required": ["queue", "limit"],
        "properties": {
            "queue": { "type": "string" },
            "paused_at": { "type": "string", "format": "date-time", "nullable": true },
            "limit": { "type": "object", "properties": {
                "queue": { "type": "integer", "nullable": true },
                "per_partition": { "type": "integer", "nullable": true },
            } },
        },
    })
}

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::PUT,
            "/v1/ns/{ns}/queues/{queue}/pause",
            Some("pause_queue"),
            queue_doc(Doc::new(
                "pause_queue",
                "pause a queue: enqueues go on, live leases finish, claims answer 204 with X-Claim-Empty-Reason: paused and Retry-After; stored, so it holds across restarts and servers",
            ))
            .keyed()
            .answers("200", "the queue's settings", Some(settings_schema())),
            put(pause),
        ),
        Route::new(
            Method::PUT,
            "/v1/ns/{ns}/queues/{queue}/resume",
            Some("resume_queue"),
            queue_doc(Doc::new("resume_queue", "resume a paused queue"))
                .keyed()
                .answers("200", "the queue's settings", Some(settings_schema())),
            put(resume),
        ),
        Route::new(
            Method::PUT,
            "/v1/ns/{ns}/queues/{queue}/limits",
            Some("set_queue_limits"),
            queue_doc(Doc::new(
                "set_queue_limits",
                "set a queue's concurrency limits: at most `queue` of its tasks leased at once, and `per_partition` per partition key (0 or null: no limit); a claim past them answers 204 with X-Claim-Empty-Reason: limited",
            ))
            .keyed()
            .body(object(
                json!({ "queue": QUEUE_LIMIT.schema(), "per_partition": PARTITION_LIMIT.schema() }),
                &[],
            ))
            .answers("200", "the queue's settings", Some(settings_schema())),
            put(set_limits),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/queues/{queue}/settings",
            Some("queue_settings"),
            queue_doc(Doc::new(
                "queue_settings",
                "a queue's settings: when it was paused, and its concurrency limits",
            ))
            .keyed()
            .answers("200", "the queue's settings", Some(settings_schema())),
            get(settings),
        ),
    ]
}

/// Runs `op` on the queue the path names and answers its settings: the
/// shape of `pause`, `resume` and `settings`.
async fn on_queue(
    state: Arc<AppState>,
    caller: Caller,
    parts: Result<Path<(String, String)>, PathRejection>,
    op: fn(&Store, &Caller, &Namespace, &QueueName) -> Result<QueueSettings, StoreError>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let settings = state
        .call(move |store| op(store, &caller, &ns, &queue))
        .await?;
    Ok(Json(settings).into_response())
}

async fn pause(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    on_queue(state, caller, parts, Store::pause_queue).await
}

async fn resume(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    on_queue(state, caller, parts, Store::resume_queue).await
}

/// `PUT .../limits`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    queue: Option<i64>,
    per_partition: Option<i64>,
}

async fn set_limits(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<Limits>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let mut limit = ConcurrencyLimit::NONE;
    if let Some(value) = request.queue {
        limit.queue = NonZeroU32::new(QUEUE_LIMIT.integer(value)? as u32);
    }
    if let Some(value) = request.per_partition {
        limit.per_partition = NonZeroU32::new(PARTITION_LIMIT.integer(value)? as u32);
    }
    let settings = state
        .call(move |store| store.set_queue_limits(&caller, &ns, &queue, limit))
        .await?;
    Ok(Json(settings).into_response())
}

async fn settings(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    on_queue(state, caller, parts, Store::queue_settings).await
}
