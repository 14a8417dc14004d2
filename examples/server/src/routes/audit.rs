//! The audit read, a page at a time.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use tessera_store::{AuditQuery, PrincipalId};

use super::{AppState, Route};
use crate::auth::Authenticated;
use crate::errors::{ApiError, query};
use crate::limits::{AUDIT_CURSOR, AUDIT_LIMIT, PRINCIPAL, TIME};
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    vec![Route::new(
        Method::GET,
        "/v1/audit",
        Some("audit"),
        Doc::new(
            "audit",
            "audit events (newest first, a page at a time) and counters: the caller's own, or anyone's for an admin",
        )
        .keyed()
        .query(PRINCIPAL, "principal")
        .query(TIME, "since")
        .query(AUDIT_LIMIT, "limit")
        .query(AUDIT_CURSOR, "before")
        .answers(
            "200",
            "events, counters, and `next`: the `before` of the page after",
            Some(json!({ "type": "object", "required": ["events", "counters"] })),
        ),
        get(audit),
    )]
}

/// `GET /v1/audit`'s query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct AuditFields {
    principal: Option<String>,
    since: Option<DateTime<Utc>>,
    limit: Option<i64>,
    before: Option<String>,
}

async fn audit(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    fields: Result<Query<AuditFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let mut audit = AuditQuery {
        since: fields.since,
        ..AuditQuery::default()
    };
    if let Some(principal) = &fields.principal {
        audit.principal = Some(PrincipalId::parse(principal)?);
    }
    if let Some(limit) = fields.limit {
        audit.limit = AUDIT_LIMIT.integer(limit)? as usize;
    }
    if let Some(before) = &fields.before {
        audit.before = Some(AUDIT_CURSOR.cursor(before)?.parse()?);
    }
    let page = state
        .call(move |store| store.audit(&caller, &audit))
        .await?;
    Ok(Json(page).into_response())
}
