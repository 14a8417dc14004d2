//! Work under a lease: heartbeat, submit (one or a batch), fail.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::lease::Failure;
use tessera_store::{FencingToken, IdempotencyKey, Namespace, Output, SubmitRequest, Submitted};

use super::{AppState, Route, object, task_doc, task_ref, with_task_ref};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, invalid, path};
use crate::limits::{
    self, BACKOFF_MS, ERROR_TEXT, IDEMPOTENCY_KEY, RETRY, SNOOZE_MS, TOKEN, VERSION, any_value,
};
use crate::limits::{NAMESPACE, SUBMIT_BATCH, TASK};
use crate::openapi::Doc;
use tessera_client::wire::{self, Beat, FailureReport, Snooze, Submission};

/// The header a submit is keyed by.
const IDEMPOTENCY_HEADER: &str = wire::IDEMPOTENCY_KEY;

pub(super) fn routes() -> Vec<Route> {
    let held = || json!({ "version": VERSION.schema(), "token": TOKEN.schema() });
    let mut beat = held();
    beat["progress"] = any_value();
    let lease = json!({ "type": "object", "required": ["task", "token", "expires_at"] });
    let mut output = held();
    output["output"] = any_value();
    let mut failure = held();
    failure["retry"] = RETRY.schema();
    failure["after_ms"] = BACKOFF_MS.schema();
    failure["error"] = ERROR_TEXT.schema();
    let mut snoozed = held();
    snoozed["delay_ms"] = SNOOZE_MS.schema();
    vec![
        Route::at(
            wire::HEARTBEAT,
            Some("heartbeat"),
            task_doc(Doc::new("heartbeat", "extend a lease, with the task's version and the fencing token from the claim, and optionally report progress: a small JSON value (at most 4096 bytes as compact text) kept on the attempt, shown by the task view and listings"))
                .keyed()
                .gone()
                .body(object(beat, &["version", "token"]))
                .answers("200", "the lease as it now stands", Some(lease)),
            post(heartbeat),
        ),
        Route::at(
            wire::SUBMIT,
            Some("submit"),
            task_doc(Doc::new("submit", "submit the output under an Idempotency-Key: the same key and output replay the receipt (Idempotent-Replayed: true); the same key with another output is 409"))
                .keyed()
                .gone()
                .header(IDEMPOTENCY_KEY)
                .body(object(output, &["version", "token", "output"]))
                .answers("200", "the receipt", Some(json!({ "type": "object", "required": ["task", "token", "artifact"] })))
                .link(
                    "200",
                    "receipt",
                    "read_receipt",
                    json!({
                        "ns": "$request.path.ns",
                        "task": "$request.path.task",
                        "attempt": "$response.body#/attempt",
                        "version": "$response.body#/task/version",
                    }),
                    None,
                ),
            post(submit),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/submissions/batch",
            Some("submit_batch"),
            Doc::new("submit_batch", "submit many outputs at once, each under its own lease and idempotency key, in one transaction: each answer is its receipt (`replayed` for a replay) or its own error, in order")
                .path(NAMESPACE, "renders")
                .keyed()
                .body(object(
                    json!({ "submissions": {
                        "type": "array", "items": batch_item(), "minItems": 1,
                        "maxItems": tessera_store::limits::MAX_SUBMIT_BATCH,
                    } }),
                    &["submissions"],
                ))
                .answers(
                    "200",
                    "each submission's receipt, or its error body with its status, in order",
                    Some(json!({ "type": "array", "items": { "type": "object" } })),
                ),
            post(submit_batch),
        ),
        Route::at(
            wire::FAIL,
            Some("fail"),
            task_doc(Doc::new("fail", "end a lease with a failure: retry never, after the default backoff, or after `after_ms` (which counts for `after` and `snooze` alone, 0 if absent); `snooze` steps back without spending the try, claimable again after `after_ms`"))
                .keyed()
                .gone()
                .body(object(failure, &["version", "token", "retry"]))
                .answers("200", "the attempt's new state", Some(json!({ "type": "object", "required": ["state"] }))),
            post(fail),
        ),
        Route::at(
            wire::SNOOZE,
            Some("snooze"),
            task_doc(Doc::new("snooze", "hand a leased task back to its queue, claimable again after `delay_ms`, without spending the try its lease took; fenced as a submit, and the same snooze retried (token and delay) answers the state its first call left"))
                .keyed()
                .gone()
                .body(object(snoozed, &["version", "token", "delay_ms"]))
                .answers("200", "the attempt's new state", Some(json!({ "type": "object", "required": ["state"] }))),
            post(snooze),
        ),
    ]
}

async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<Beat>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task_path)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(TOKEN.integer(request.token)?)?;
    let reference = task.clone();
    let lease = state
        .call(move |store| match &request.progress {
            Some(progress) => store.heartbeat_with_progress(&caller, &task, token, progress),
            None => store.heartbeat(&caller, &task, token),
        })
        .await?;
    Ok(Json(wire::Lease::of(&reference, &lease)).into_response())
}

async fn submit(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<Submission>,
) -> Result<Response, ApiError> {
    let mut keys = headers.get_all(IDEMPOTENCY_HEADER).iter();
    let key = match (keys.next(), keys.next()) {
        (Some(key), None) => key,
        (None, _) => return Err(invalid("an idempotency-key header is required")),
        (Some(_), Some(_)) => return Err(invalid("one idempotency-key header, not several")),
    };
    let key = key
        .to_str()
        .map_err(|_| invalid("the idempotency-key header is not visible ascii"))?;
    let key = IdempotencyKey::parse(key)?;
    let (ns, task) = path(task_path)?;
    let task = task_ref(&ns, &task, request.version)?;
    let reference = task.clone();
    let token = FencingToken::new(TOKEN.integer(request.token)?)?;
    let output = Output::bytes(request.output.to_string());
    let submitted = state
        .call(move |store| store.submit(&caller, &task, token, &key, &output))
        .await?;
    let (receipt, replayed) = match submitted {
        Submitted::Accepted(receipt) => (receipt, false),
        Submitted::Replayed(receipt) => (receipt, true),
    };
    let mut response = Json(wire::Receipt::of(&reference, receipt)).into_response();
    if replayed {
        response.headers_mut().insert(
            HeaderName::from_static(wire::REPLAYED),
            HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

/// One submission of a batch: its task, lease, key and output.
fn batch_item() -> Value {
    object(
        json!({
            "task": TASK.schema(),
            "version": VERSION.schema(),
            "token": TOKEN.schema(),
            "key": IDEMPOTENCY_KEY.schema(),
            "output": any_value(),
        }),
        &["task", "version", "token", "key", "output"],
    )
}

/// `POST .../submissions/batch`'s items.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchSubmission {
    task: String,
    version: i64,
    token: i64,
    key: String,
    output: Value,
}

/// `POST .../submissions/batch`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSubmissions {
    submissions: Vec<BatchSubmission>,
}

async fn submit_batch(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    ns: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<NewSubmissions>,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    SUBMIT_BATCH.integer(request.submissions.len() as i64)?;
    let submissions = (request.submissions.into_iter())
        .map(|item| {
            Ok(SubmitRequest {
                task: task_ref(ns.as_str(), &item.task, item.version)?,
                token: FencingToken::new(TOKEN.integer(item.token)?)?,
                key: IdempotencyKey::parse(&item.key)?,
                output: Output::bytes(item.output.to_string()),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let references: Vec<_> = submissions.iter().map(|item| item.task.clone()).collect();
    let answers = state
        .call(move |store| store.submit_batch(&caller, &submissions))
        .await?;
    let answers: Vec<Value> = (answers.into_iter().zip(&references))
        .map(|(answer, reference)| match answer {
            Ok(Submitted::Accepted(receipt)) => {
                json!({ "receipt": with_task_ref(json!(receipt), reference), "replayed": false })
            }
            Ok(Submitted::Replayed(receipt)) => {
                json!({ "receipt": with_task_ref(json!(receipt), reference), "replayed": true })
            }
            Err(error) => {
                // The error as a request of its own would answer it, and
                // that request's status.
                let mut body = json!(error.body());
                body["status"] = json!(error.status());
                body
            }
        })
        .collect();
    Ok(Json(answers).into_response())
}

async fn fail(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<FailureReport>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task_path)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(TOKEN.integer(request.token)?)?;
    let retry = limits::retry(&request.retry, request.after_ms.unwrap_or(0))?;
    let failure = Failure {
        retry,
        error: match &request.error {
            Some(text) => Some(ERROR_TEXT.text(text)?.to_owned()),
            None => None,
        },
    };
    let new_state = state
        .call(move |store| store.fail(&caller, &task, token, failure))
        .await?;
    Ok(Json(wire::NewState { state: new_state }).into_response())
}

async fn snooze(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<Snooze>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task_path)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(TOKEN.integer(request.token)?)?;
    let delay = std::time::Duration::from_millis(SNOOZE_MS.integer(request.delay_ms)? as u64);
    let new_state = state
        .call(move |store| store.snooze(&caller, &task, token, delay))
        .await?;
    Ok(Json(wire::NewState { state: new_state }).into_response())
}
