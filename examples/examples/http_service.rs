//! A small HTTP service over Tessera's SQLite store, on tokio and axum.
//!
//! It shows how an async host drives claim admission: the store's sans-IO
//! claim steps decide at once (admitted, queued or refused); a queued
//! request parks on a oneshot channel keyed by its ticket, and one timer
//! task wakes at the store's `poll_timeout` and hands out the grants and
//! rejections it drains. Store calls are short blocking SQLite
//! transactions, so they run on tokio's blocking pool.
//!
//! ```text
//! cargo run --release --example http_service -- --port 8080 [--db PATH]
//! ```
//!
//! It listens on 127.0.0.1 only (port 0 picks a free port) and prints a
//! fresh admin key. Routes, all JSON, keys as `Authorization: Bearer <key>`:
//!
//! | route | |
//! | --- | --- |
//! | `POST /v1/keys` | admin: create a key |
//! | `GET /v1/me/audit` | the caller's audit events and counters |
//!
//! Every error is the store's JSON body (`{"error": {"code", "message",
//! "retry_after", "reset_at"}}`) with its status, and a `Retry-After` header
//! on `429` and `503`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tessera_store::{
    AuditQuery, Caller, Error, Grant, KeySpec, PrincipalId, Scope, Store, StoreConfig,
};
use tokio::net::TcpListener;

/// What every request shares.
pub(crate) struct AppState {
    store: Arc<Store>,
}

impl AppState {
    /// Runs a store call on the blocking pool: each is a short SQLite
    /// transaction that must not stall the async workers.
    async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || work(&store)).await {
            Ok(result) => result.map_err(ApiError),
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }
}

/// The service's routes over `store`.
pub(crate) fn app(store: Arc<Store>) -> Router {
    let state = Arc::new(AppState { store });
    Router::new()
        .route("/v1/keys", post(create_key))
        .route("/v1/me/audit", get(my_audit))
        .fallback(|| async {
            ApiError(Error::NotFound {
                what: "route".to_owned(),
            })
        })
        .with_state(state)
}

/// Serves `store` on `listener` until the listener fails.
pub(crate) async fn serve(listener: TcpListener, store: Arc<Store>) -> std::io::Result<()> {
    axum::serve(listener, app(store)).await
}

// ---- errors: the one place a store error becomes a response ----

/// A store error as an HTTP response: its status, its JSON body, and
/// `Retry-After` (whole seconds) when it has one.
pub(crate) struct ApiError(Error);

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        Self(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self.0.body())).into_response();
        if let Some(seconds) = self.0.retry_after_seconds() {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

fn invalid(reason: impl std::fmt::Display) -> ApiError {
    ApiError(Error::InvalidInput {
        reason: reason.to_string(),
    })
}

/// Parses a JSON request body; a malformed one is the store's `400`.
fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|error| invalid(format!("request body: {error}")))
}

// ---- authentication ----

/// The caller of a request, from `Authorization: Bearer <key>`; a missing
/// or unknown key is `401` before anything else runs.
pub(crate) struct Authenticated(Caller);

impl FromRequestParts<Arc<AppState>> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let key = bearer_key(&parts.headers).map(str::to_owned);
        let caller = state
            .call(move |store| store.authenticate(key.as_deref()))
            .await?;
        Ok(Self(caller))
    }
}

fn bearer_key(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

// ---- keys and audit ----

/// `POST /v1/keys`: a new key for a new principal of `account`, or another
/// key for an existing `principal`.
#[derive(Deserialize)]
struct NewKey {
    account: Option<String>,
    principal: Option<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    scopes: Vec<Scope>,
    #[serde(default)]
    grants: Vec<Grant>,
    #[serde(default)]
    label: String,
}

async fn create_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let request: NewKey = parse_body(&body)?;
    let spec = match (&request.principal, &request.account) {
        (Some(principal), None) => KeySpec::for_principal(PrincipalId::parse(principal)?),
        (None, Some(account)) if request.admin => KeySpec::admin(account),
        (None, Some(account)) => KeySpec::keyed(account),
        _ => return Err(invalid("give either an account or a principal")),
    };
    let spec = request
        .grants
        .into_iter()
        .fold(spec.with_scopes(request.scopes), KeySpec::with_grant)
        .with_label(&request.label);
    let issued = state
        .call(move |store| store.create_key(&caller, &spec))
        .await?;
    let body = json!({ "key": issued.secret.expose(), "info": issued.info });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn my_audit(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
) -> Result<Response, ApiError> {
    let query = AuditQuery {
        principal: Some(caller.principal()),
        ..AuditQuery::default()
    };
    let page = state
        .call(move |store| store.audit(&caller, &query))
        .await?;
    Ok(Json(page).into_response())
}

// ---- the program ----

struct Args {
    port: u16,
    db: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 8080,
        db: PathBuf::from("tessera-http.db"),
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        match word.as_str() {
            "--port" => {
                let text = value()?;
                args.port = text.parse().map_err(|_| format!("bad port {text:?}"))?;
            }
            "--db" => args.db = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()
        .map_err(|problem| format!("{problem}\nusage: http_service [--port PORT] [--db PATH]"))?;
    let store = Arc::new(Store::open(&args.db, StoreConfig::default())?);
    let admin = store.create_admin_key("operator")?;
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, args.port))).await?;
    let address = listener.local_addr()?;
    println!("tessera http service on http://{address}");
    println!("database: {}", args.db.display());
    println!("admin key: {}", admin.secret.expose());
    println!("try: curl -s -X POST http://{address}/v1/keys \\");
    println!(
        "       -H 'Authorization: Bearer {}' \\",
        admin.secret.expose()
    );
    println!(
        "       -d '{{\"account\":\"acme\",\"scopes\":[\"enqueue\",\"claim\",\"read\"],\"grants\":[\"namespace:demo\"]}}'"
    );
    serve(listener, store).await?;
    Ok(())
}
