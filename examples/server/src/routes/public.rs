//! Public reads: `/v1/health`, `/healthz` and `/v1/public/activity`.
//!
//! No key is read and no identity is looked up: each answers from the
//! health snapshot of the namespaces the operator marked public (a reader
//! only when a snapshot is stale) and from admission's state in memory,
//! so they keep answering `200` while every write is refused.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tessera_store::{HealthSnapshot, Namespace, Store};

use super::{AppState, Route};
use crate::errors::ApiError;
use crate::openapi::Doc;

/// What the public face serves: the namespaces anyone may read, and the
/// admission's pending bound (each key's share of the waiting slots is
/// that bound over the keys waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicOptions {
    /// Namespaces whose health and board anyone may read, in the order
    /// the board shows them.
    pub namespaces: Vec<Namespace>,
    /// The admission's `max_pending`.
    pub max_pending: usize,
}

impl PublicOptions {
    /// `namespaces` public, under an admission of `max_pending` waiters.
    pub fn new(namespaces: Vec<Namespace>, max_pending: usize) -> Self {
        Self {
            namespaces,
            max_pending,
        }
    }
}

impl Default for PublicOptions {
    fn default() -> Self {
        Self::new(
            Vec::new(),
            tessera_store::AdmissionConfig::default().max_pending,
        )
    }
}

pub(super) fn routes() -> Vec<Route> {
    let object = json!({ "type": "object" });
    vec![
        Route::new(
            Method::GET,
            "/v1/health",
            Some("public_health"),
            Doc::new(
                "public_health_all",
                "the health of every public namespace, with no key and no identity lookup; answers while writes are refused",
            )
            .answers("200", "each public namespace's snapshot", Some(object.clone())),
            get(health),
        ),
        Route::new(
            Method::GET,
            "/healthz",
            None,
            Doc::new(
                "healthz",
                "liveness: the server answers and says whether writes are refused; no storage call",
            )
            .answers("200", "alive", Some(object.clone())),
            get(healthz),
        ),
        Route::new(
            Method::GET,
            "/v1/public/activity",
            Some("public_health"),
            Doc::new(
                "public_activity",
                "what the public namespaces are doing: attempts per state from the snapshot, and admission as it stands",
            )
            .answers("200", "snapshots and admission", Some(object)),
            get(activity),
        ),
    ]
}

/// The snapshot of every public namespace, from the store's cache.
pub(crate) async fn snapshots(state: &AppState) -> Result<Vec<HealthSnapshot>, ApiError> {
    let namespaces = state.public.namespaces.clone();
    if namespaces.is_empty() {
        return Ok(Vec::new());
    }
    state
        .call(move |store| {
            namespaces
                .iter()
                .map(|namespace| store.public_health(namespace))
                .collect()
        })
        .await
}

/// Admission as it stands: the limit, in flight, waiting, and each
/// waiting key's share of the waiting slots (the fair-share rule's
/// bound). Memory only.
pub(crate) fn admission(store: &Store, max_pending: usize) -> Value {
    let stats = store.claim_stats();
    let share = max_pending / stats.waiting_principals.max(1);
    json!({
        "limit": stats.limit,
        "in_flight": stats.in_flight,
        "waiting": stats.pending,
        "waiting_keys": stats.waiting_principals,
        "max_pending": max_pending,
        "share_per_waiting_key": share,
        "latency_average_seconds": stats.latency_average.map(|wait| wait.as_secs_f64()),
    })
}

async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let snapshots = snapshots(&state).await?;
    Ok(Json(json!({
        "status": "ok",
        "writes_refused": state.store.is_refusing_writes(),
        "namespaces": snapshots,
    }))
    .into_response())
}

async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({ "status": "ok", "writes_refused": state.store.is_refusing_writes() }))
        .into_response()
}

async fn activity(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let snapshots = snapshots(&state).await?;
    Ok(Json(json!({
        "writes_refused": state.store.is_refusing_writes(),
        "admission": admission(&state.store, state.public.max_pending),
        "namespaces": snapshots,
    }))
    .into_response())
}
