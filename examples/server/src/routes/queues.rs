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
use std::time::Duration;
use tessera_store::{
    Caller, ConcurrencyLimit, Error as StoreError, Namespace, QueueName, QueueRetention,
    QueueSettings, Retention, Store,
};

use super::{AppState, Route, object, queue_doc, queue_names};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path};
use crate::limits::{KEEP_MS, PARTITION_LIMIT, QUEUE_LIMIT};
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

/// The keep times of each final state, in milliseconds (null: forever).
fn keep_times_schema() -> Value {
    let keep = || {
        let mut schema = KEEP_MS.schema();
        schema["nullable"] = json!(true);
        schema
    };
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["done", "discarded", "cancelled"],
        "properties": { "done": keep(), "discarded": keep(), "cancelled": keep() },
    })
}

/// The schema of a queue's keep times.
fn retention_schema() -> Value {
    json!({
        "type": "object",
        "required": ["queue", "retention", "own"],
        "properties": {
            "queue": { "type": "string" },
            "retention": keep_times_schema(),
            "own": { "type": "boolean" },
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
            Method::PUT,
            "/v1/ns/{ns}/queues/{queue}/retention",
            Some("set_queue_retention"),
            queue_doc(Doc::new(
                "set_queue_retention",
                "give a queue keep times of its own for finished tasks, in milliseconds by final state (done; discarded, also failed; cancelled), each required, null keeping them for good; retention purges the queue's finished tasks by them from its next run on",
            ))
            .keyed()
            .body(keep_times_schema())
            .answers("200", "the keep times in force for the queue", Some(retention_schema())),
            put(set_retention),
        ),
        Route::new(
            Method::DELETE,
            "/v1/ns/{ns}/queues/{queue}/retention",
            Some("set_queue_retention"),
            queue_doc(Doc::new(
                "reset_queue_retention",
                "hand a queue back to the server's keep times for finished tasks",
            ))
            .keyed()
            .answers("200", "the keep times in force for the queue", Some(retention_schema())),
            axum::routing::delete(reset_retention),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/queues/{queue}/retention",
            Some("queue_retention"),
            queue_doc(Doc::new(
                "queue_retention",
                "how long a queue's finished tasks are kept: its own keep times, or the server's (`own` false)",
            ))
            .keyed()
            .answers("200", "the keep times in force for the queue", Some(retention_schema())),
            get(retention),
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

/// `PUT .../retention`: every field required, null keeping for good.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeepTimes {
    #[serde(deserialize_with = "Option::deserialize")]
    done: Option<i64>,
    #[serde(deserialize_with = "Option::deserialize")]
    discarded: Option<i64>,
    #[serde(deserialize_with = "Option::deserialize")]
    cancelled: Option<i64>,
}

impl KeepTimes {
    /// The keep times, each checked against [`KEEP_MS`].
    fn retention(&self) -> Result<Retention, StoreError> {
        let keep = |value: Option<i64>| -> Result<Option<Duration>, StoreError> {
            value
                .map(|ms| Ok(Duration::from_millis(KEEP_MS.integer(ms)? as u64)))
                .transpose()
        };
        Ok(Retention {
            done: keep(self.done)?,
            discarded: keep(self.discarded)?,
            cancelled: keep(self.cancelled)?,
        })
    }
}

/// Sets (`Some`) or resets a queue's keep times and answers those in force.
async fn put_retention(
    state: Arc<AppState>,
    caller: Caller,
    parts: Result<Path<(String, String)>, PathRejection>,
    retention: Option<Retention>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let kept: QueueRetention = state
        .call(move |store| store.set_queue_retention(&caller, &ns, &queue, retention))
        .await?;
    Ok(Json(kept).into_response())
}

async fn set_retention(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<KeepTimes>,
) -> Result<Response, ApiError> {
    let retention = request.retention()?;
    put_retention(state, caller, parts, Some(retention)).await
}

async fn reset_retention(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    put_retention(state, caller, parts, None).await
}

async fn retention(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let kept = state
        .call(move |store| store.queue_retention(&caller, &ns, &queue))
        .await?;
    Ok(Json(kept).into_response())
}
