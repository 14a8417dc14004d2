//! Anonymous sessions.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::{AppState, Route};
use crate::errors::ApiError;
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    vec![Route::new(
        Method::POST,
        "/v1/sessions",
        Some("mint_session"),
        Doc::new(
            "mint_session",
            "an anonymous session: a key with every scope in a namespace of its own, for the store's session lifetime (24 hours by default); limited per address; 404 on a server started with --no-sessions",
        )
        .answers(
            "201",
            "the session's key, shown once, its namespace and expiry",
            Some(json!({ "type": "object", "required": ["key", "namespace", "expires_at"] })),
        ),
        post(mint_session),
    )]
}

async fn mint_session(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Result<Response, ApiError> {
    if !state.sessions {
        return Err(ApiError::http(
            StatusCode::NOT_FOUND,
            "not_found",
            "anonymous sessions are off on this server",
        ));
    }
    let session = state
        .call(move |store| store.mint_session(peer.ip()))
        .await?;
    let body = json!({
        "key": session.key.secret.expose(),
        "namespace": session.namespace,
        "expires_at": session.expires_at,
    });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}
