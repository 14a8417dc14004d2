//! Claims: one, a batch, and the long-poll before them.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tessera_store::{ClaimOutcome, ClaimedBatch, EmptyReason};

use super::{AppState, Route, object, queue_doc, queue_names, shutting_down};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path, retry_after_header};
use crate::limits::{CLAIM_COUNT, TIMEOUT_MS};
use crate::openapi::Doc;
use tessera_client::wire::{self, ClaimCount, WaitTimeout};

/// Links from a granted lease at `lease` (a JSON pointer) to the routes
/// that work under it.
fn lease_links(doc: Doc, lease: &str) -> Doc {
    let parameters = json!({
        "ns": format!("$response.body#{lease}/task/namespace"),
        "task": format!("$response.body#{lease}/task/id"),
    });
    let held = json!({
        "version": format!("$response.body#{lease}/task/version"),
        "token": format!("$response.body#{lease}/lease/token"),
    });
    let mut output = held.clone();
    output["output"] = json!({ "pixels": 42 });
    // The grant's artifact key is a fine idempotency key: one per grant.
    let mut keyed = parameters.clone();
    keyed["header.Idempotency-Key"] = json!(format!("$response.body#{lease}/lease/artifact"));
    let mut failure = held.clone();
    failure["retry"] = json!("backoff");
    doc.link(
        "200",
        "heartbeat",
        "heartbeat",
        parameters.clone(),
        Some(held),
    )
    .link("200", "submit", "submit", parameters.clone(), Some(output))
    .link("200", "fail", "fail", parameters, Some(failure))
}

pub(super) fn routes() -> Vec<Route> {
    let claimed = json!({ "type": "object", "required": ["task", "lease", "brief"] });
    vec![
        Route::at(
            wire::CLAIM,
            Some("claim"),
            lease_links(
                queue_doc(Doc::new(
                    "claim",
                    "claim the next task under a lease: waits its turn for admission; X-Claim-Wait-Ms and X-Claim-Concurrency on every answer",
                ))
                .keyed()
                .answers("200", "a lease, its task, brief and artifact key", Some(claimed.clone()))
                .answers("204", "nothing granted; Retry-After, and X-Claim-Empty-Reason: empty, paused or limited", None)
                .answers("429", "overloaded; Retry-After", Some(json!({ "$ref": "#/components/schemas/Error" }))),
                "",
            ),
            post(claim),
        ),
        Route::at(
            wire::CLAIM_BATCH,
            Some("claim_batch"),
            lease_links(
                queue_doc(Doc::new(
                    "claim_batch",
                    "claim up to `count` tasks at once, as one turn of admission",
                ))
                .keyed()
                .body(object(json!({ "count": CLAIM_COUNT.schema() }), &["count"]))
                .answers(
                    "200",
                    "the leases granted, in claim order",
                    Some(json!({ "type": "object", "required": ["claimed"],
                        "properties": { "claimed": { "type": "array", "items": claimed } } })),
                )
                .answers("204", "nothing granted; Retry-After, and X-Claim-Empty-Reason: empty, paused or limited", None)
                .answers("429", "overloaded; Retry-After", Some(json!({ "$ref": "#/components/schemas/Error" }))),
                "/claimed/0",
            ),
            post(claim_batch),
        ),
        Route::at(
            wire::WAIT,
            Some("wait_for_work"),
            queue_doc(Doc::new(
                "wait_for_work",
                "long-poll: answers when the queue has a claimable task or receives one, or when the timeout (or the server's own cap) passes",
            ))
            .keyed()
            .body(object(json!({ "timeout_ms": TIMEOUT_MS.schema() }), &["timeout_ms"]))
            .answers(
                "200",
                "`work_available` or `timed_out`",
                Some(json!({ "type": "object", "required": ["outcome"],
                    "properties": { "outcome": { "type": "string", "enum": ["work_available", "timed_out"] } } })),
            ),
            post(wait_for_work),
        ),
    ]
}

async fn claim(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    // No SQL runs while it waits, so this stays on the async worker. A
    // shutdown drops the wait, which withdraws the claim.
    let permit = tokio::select! {
        permit = state.store.claim_permit(&caller, &ns, &queue) => permit?,
        () = state.closing() => return Err(shutting_down()),
    };
    let outcome = state.call(move |store| store.finish_claim(permit)).await?;
    state.remember(|history, now| {
        history.claim(
            now,
            std::time::Duration::from_millis(outcome.wait_ms()),
            outcome.concurrency_limit(),
        );
    });
    let mut response = match &outcome {
        // The store's JSON of a claim: task, queue, brief, and the lease
        // with the artifact key the worker writes its output under.
        ClaimOutcome::Granted(claimed) => Json(claimed_json(claimed)).into_response(),
        _ => StatusCode::NO_CONTENT.into_response(),
    };
    admission_headers(
        response.headers_mut(),
        outcome.wait_ms(),
        outcome.concurrency_limit(),
        outcome.retry_after(),
        outcome.empty_reason(),
    );
    Ok(response)
}

pub(crate) fn claimed_json(claimed: &tessera_store::Claimed) -> Value {
    json!(wire::Claim::from(claimed))
}

fn admission_headers(
    headers: &mut HeaderMap,
    wait_ms: u64,
    limit: u32,
    retry_after: Option<std::time::Duration>,
    empty: Option<EmptyReason>,
) {
    headers.insert("x-claim-wait-ms", HeaderValue::from(wait_ms));
    headers.insert("x-claim-concurrency", HeaderValue::from(limit));
    if let Some(wait) = retry_after {
        headers.insert(RETRY_AFTER, retry_after_header(wait));
    }
    if let Some(reason) = empty {
        headers.insert(
            "x-claim-empty-reason",
            HeaderValue::from_static(reason.as_str()),
        );
    }
}

async fn claim_batch(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<ClaimCount>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let count = CLAIM_COUNT.integer(request.count)? as usize;
    // A batch waits for admission on a blocking thread, at most the
    // admission's max_wait.
    let batch: ClaimedBatch = state
        .call(move |store| store.claim_batch(&caller, &ns, &queue, count))
        .await?;
    let limit = state.store.claim_stats().limit;
    state.remember(|history, now| history.claim(now, batch.waited, limit));
    let mut response = if batch.claimed.is_empty() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        Json(wire::Claims {
            claimed: batch.claimed.iter().map(wire::Claim::from).collect(),
            waited_ms: batch.waited.as_millis() as u64,
        })
        .into_response()
    };
    admission_headers(
        response.headers_mut(),
        batch.waited.as_millis() as u64,
        batch.concurrency_limit,
        batch.retry_after,
        batch.reason,
    );
    Ok(response)
}

async fn wait_for_work(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<WaitTimeout>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let timeout = std::time::Duration::from_millis(TIMEOUT_MS.integer(request.timeout_ms)? as u64)
        .min(state.max_long_poll);
    let outcome = tokio::select! {
        outcome = state.call(move |store| store.wait_for_work(&caller, &ns, &queue, timeout)) => outcome?,
        () = state.closing() => return Err(shutting_down()),
    };
    Ok(Json(json!({ "outcome": outcome })).into_response())
}
