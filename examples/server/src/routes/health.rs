//! Health: attempts per state of a namespace.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tessera_store::Namespace;

use super::{AppState, Route};
use crate::auth::bearer_key;
use crate::errors::{ApiError, path};
use crate::limits::NAMESPACE;
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    vec![Route::new(
        Method::GET,
        "/v1/ns/{ns}/health",
        Some("health"),
        Doc::new(
            "health",
            "attempts per state; with a key, any namespace it may read, without one only a public namespace",
        )
        .key_optional()
        .path(NAMESPACE, "renders")
        .answers(
            "200",
            "attempts per state",
            Some(json!({ "type": "object", "required": ["attempts"] })),
        ),
        get(health),
    )]
}

async fn health(
    State(state): State<Arc<AppState>>,
    ns: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    let snapshot = match bearer_key(&headers).map(str::to_owned) {
        None if !headers.contains_key(AUTHORIZATION) => {
            state.call(move |store| store.public_health(&ns)).await?
        }
        key => {
            state
                .call(move |store| {
                    let caller = store.authenticate(key.as_deref())?;
                    store.health(&caller, &ns)
                })
                .await?
        }
    };
    Ok(Json(snapshot).into_response())
}
