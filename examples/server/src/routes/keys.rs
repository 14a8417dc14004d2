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
use tessera_store::{KeyFilter, KeyId, KeySpec, PrincipalId};

use super::{AppState, Route, object};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path, query};
use crate::limits::{self, ACCOUNT, GRANT, KEY_ID, KEYS_LIMIT, LABEL, PRINCIPAL, SCOPE, TIME};
use crate::openapi::Doc;

/// Links from a made key to the routes that take its id.
fn key_links(doc: Doc) -> Doc {
    let parameters = json!({ "key_id": "$response.body#/info/key_id" });
    doc.link("201", "revoke", "revoke_key", parameters.clone(), None)
        .link(
            "201",
            "expire",
            "expire_key",
            parameters,
            Some(json!({ "at": "2099-01-01T00:00:00Z" })),
        )
}

pub(super) fn routes() -> Vec<Route> {
    let key_info = json!({ "type": "object", "required": ["key_id"] });
    let made = json!({ "type": "object", "required": ["key", "info"] });
    let grants = || {
        json!({
            "scopes": SCOPE.array(limits::MAX_SCOPES),
            "grants": GRANT.array(limits::MAX_GRANTS),
            "label": LABEL.schema(),
        })
    };
    let mut new_principal = grants();
    new_principal["account"] = ACCOUNT.schema();
    new_principal["admin"] = json!({ "type": "boolean" });
    vec![
        Route::new(
            Method::POST,
            "/v1/keys",
            Some("create_key"),
            key_links(
                Doc::new(
                    "create_key",
                    "make a key for a new principal of `account`: an admin one if `admin`, otherwise with its `scopes` and `grants` (both required: a key without them could do nothing)",
                )
                .keyed()
                .body(object(new_principal, &["account"]))
                .answers(
                    "201",
                    "the key, shown once, and its info",
                    Some(made.clone()),
                ),
            ),
            post(create_key),
        ),
        Route::new(
            Method::POST,
            "/v1/principals/{principal}/keys",
            Some("create_key"),
            key_links(
                Doc::new(
                    "create_principal_key",
                    "make another key for an existing principal",
                )
                .keyed()
                .path(PRINCIPAL, "p1")
                .body(object(grants(), &[]))
                .answers("201", "the key, shown once, and its info", Some(made)),
            ),
            post(create_principal_key),
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
            "/v1/keys/{key_id}",
            Some("revoke_key"),
            Doc::new("revoke_key", "revoke a key by its id")
                .keyed()
                .path(KEY_ID, "0123456789abcdef")
                .answers("200", "the key's info, revoked", Some(key_info.clone())),
            delete(revoke_key),
        ),
        Route::new(
            Method::POST,
            "/v1/keys/{key_id}/expire",
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
    account: String,
    admin: Option<bool>,
    scopes: Option<Vec<String>>,
    grants: Option<Vec<String>>,
    label: Option<String>,
}

/// `spec` with `scopes`, `grants` and `label`.
fn granted(
    spec: KeySpec,
    scopes: Option<Vec<String>>,
    grants: Option<Vec<String>>,
    label: Option<String>,
) -> Result<KeySpec, ApiError> {
    let scopes = limits::at_most("scopes", scopes.unwrap_or_default(), limits::MAX_SCOPES)?;
    let grants = limits::at_most("grants", grants.unwrap_or_default(), limits::MAX_GRANTS)?;
    let scopes = (scopes.iter())
        .map(|word| limits::scope(word))
        .collect::<Result<Vec<_>, _>>()?;
    let grants = (grants.iter())
        .map(|text| limits::grant(text))
        .collect::<Result<Vec<_>, _>>()?;
    let label = label.unwrap_or_default();
    Ok(grants
        .into_iter()
        .fold(spec.with_scopes(scopes), KeySpec::with_grant)
        .with_label(LABEL.text(&label)?))
}

async fn create_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    JsonBody(request): JsonBody<NewKey>,
) -> Result<Response, ApiError> {
    let account = ACCOUNT.text(&request.account)?;
    let admin = request.admin == Some(true);
    let empty = |list: &Option<Vec<String>>| list.as_ref().is_none_or(Vec::is_empty);
    if !admin && (empty(&request.scopes) || empty(&request.grants)) {
        // Such a key could do nothing: every call would be 403.
        return Err(ApiError::Store(tessera_store::Error::InvalidInput {
            reason: "a key needs scopes (enqueue, claim, read) and grants (namespace:<name> or \
                     namespace:*); without them every call it makes is 403"
                .to_owned(),
        }));
    }
    let spec = if admin {
        KeySpec::admin(account)
    } else {
        KeySpec::keyed(account)
    };
    let spec = granted(spec, request.scopes, request.grants, request.label)?;
    made(&state, caller, spec).await
}

/// `POST /v1/principals/{principal}/keys`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalKey {
    scopes: Option<Vec<String>>,
    grants: Option<Vec<String>>,
    label: Option<String>,
}

async fn create_principal_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    principal: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<PrincipalKey>,
) -> Result<Response, ApiError> {
    let principal = PrincipalId::parse(&path(principal)?)?;
    let spec = KeySpec::for_principal(principal);
    let spec = granted(spec, request.scopes, request.grants, request.label)?;
    made(&state, caller, spec).await
}

/// Makes the key of `spec`: `201` with the secret, shown once.
async fn made(
    state: &AppState,
    caller: tessera_store::Caller,
    spec: KeySpec,
) -> Result<Response, ApiError> {
    let issued = state
        .call(move |store| store.create_key(&caller, &spec))
        .await?;
    let body = json!({ "key": issued.secret.expose(), "info": issued.info });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /v1/keys`'s query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
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

/// `POST /v1/keys/{key_id}/expire`.
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
