//! Keys: create, list, revoke, expire.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use tessera_store::{Grant, KeyFilter, KeyId, KeySpec, PrincipalId};

use super::{AppState, Route, object};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, invalid, path, query};
use crate::limits::{self, ACCOUNT, GRANT, KEY_ID, KEYS_LIMIT, LABEL, PRINCIPAL, SCOPE, TIME};
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    let key_info = json!({ "type": "object", "required": ["key_id"] });
    vec![
        Route::new(
            Method::POST,
            "/v1/keys",
            Some("create_key"),
            Doc::new(
                "create_key",
                "make a key: for a new principal of `account`, or another for `principal`",
            )
            .keyed()
            .body(object(
                json!({
                    "account": ACCOUNT.schema(),
                    "principal": PRINCIPAL.schema(),
                    "admin": { "type": "boolean" },
                    "scopes": SCOPE.array(3),
                    "grants": GRANT.array(16),
                    "label": LABEL.schema(),
                }),
                &[],
            ))
            .answers(
                "201",
                "the key, shown once, and its info",
                Some(json!({ "type": "object", "required": ["key", "info"] })),
            ),
            post(create_key),
        ),
        Route::new(
            Method::GET,
            "/v1/keys",
            Some("list_keys"),
            Doc::new(
                "list_keys",
                "the caller's keys, or every key for an admin; no secrets",
            )
            .keyed()
            .query(PRINCIPAL, "principal")
            .query(KEY_ID, "after")
            .query(KEYS_LIMIT, "limit")
            .answers(
                "200",
                "the keys, oldest id first",
                Some(json!({ "type": "array", "items": key_info })),
            ),
            get(list_keys),
        ),
        Route::new(
            Method::DELETE,
            "/v1/keys/{key}",
            Some("revoke_key"),
            Doc::new("revoke_key", "revoke a key by its id")
                .keyed()
                .path(KEY_ID, "0123456789abcdef")
                .answers("200", "the key's info, revoked", Some(key_info.clone())),
            delete(revoke_key),
        ),
        Route::new(
            Method::POST,
            "/v1/keys/{key}/expire",
            Some("expire_key"),
            Doc::new("expire_key", "set when a key stops working")
                .keyed()
                .path(KEY_ID, "0123456789abcdef")
                .body(object(json!({ "at": TIME.schema() }), &["at"]))
                .answers("200", "the key's info", Some(key_info)),
            post(expire_key),
        ),
    ]
}

/// `POST /v1/keys`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    account: Option<String>,
    principal: Option<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    grants: Vec<String>,
    #[serde(default)]
    label: String,
}

async fn create_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    JsonBody(request): JsonBody<NewKey>,
) -> Result<Response, ApiError> {
    let spec = match (&request.principal, &request.account) {
        (Some(principal), None) if !request.admin => {
            KeySpec::for_principal(PrincipalId::parse(principal)?)
        }
        (None, Some(account)) if request.admin => KeySpec::admin(ACCOUNT.text(account)?),
        (None, Some(account)) => KeySpec::keyed(ACCOUNT.text(account)?),
        _ => {
            return Err(invalid(
                "give either an account (and admin if it is one) or a principal",
            ));
        }
    };
    let scopes = (request.scopes.iter())
        .map(|word| limits::scope(word))
        .collect::<Result<Vec<_>, _>>()?;
    let grants = (request.grants.iter())
        .map(|text| Grant::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = grants
        .into_iter()
        .fold(spec.with_scopes(scopes), KeySpec::with_grant)
        .with_label(LABEL.text(&request.label)?);
    let issued = state
        .call(move |store| store.create_key(&caller, &spec))
        .await?;
    let body = json!({ "key": issued.secret.expose(), "info": issued.info });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /v1/keys`'s query.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysQuery {
    principal: Option<String>,
    after: Option<String>,
    limit: Option<i64>,
}

async fn list_keys(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    fields: Result<Query<KeysQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let mut filter = KeyFilter::default();
    if let Some(principal) = &fields.principal {
        filter.principal = Some(PrincipalId::parse(principal)?);
    }
    if let Some(after) = &fields.after {
        filter.after = Some(KeyId::parse(after)?);
    }
    if let Some(limit) = fields.limit {
        filter.limit = KEYS_LIMIT.integer(limit)? as usize;
    }
    let keys = state
        .call(move |store| store.list_keys(&caller, &filter))
        .await?;
    Ok(Json(keys).into_response())
}

async fn revoke_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = KeyId::parse(&path(key)?)?;
    let info = state
        .call(move |store| store.revoke_key(&caller, &key))
        .await?;
    Ok(Json(info).into_response())
}

/// `POST /v1/keys/{key}/expire`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expiry {
    at: DateTime<Utc>,
}

async fn expire_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    key: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<Expiry>,
) -> Result<Response, ApiError> {
    let key = KeyId::parse(&path(key)?)?;
    let info = state
        .call(move |store| store.expire_key(&caller, &key, request.at))
        .await?;
    Ok(Json(info).into_response())
}
