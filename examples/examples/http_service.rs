//! A small HTTP service over a Tessera store (SQLite, or PostgreSQL with
//! `--postgres`), on tokio and axum.
//!
//! A claim waits for admission with one `.await` of `Store::claim_permit`,
//! a future woken through its `Waker` (a request that goes away drops it,
//! which withdraws the claim); the store keeps the deadlines. Store calls
//! that touch the database are short blocking transactions, so they run on
//! tokio's blocking pool, the claim's lease transaction included (the
//! PostgreSQL client may not run on a runtime's own threads).
//!
//! ```text
//! cargo run --release --example http_service -- --help
//! cargo run --release --example http_service -- --port 8080 [--db PATH | --postgres URL [--schema NAME]]
//! ```
//!
//! It listens on 127.0.0.1 unless `--bind` says otherwise (port 0 picks a
//! free port). The first start makes an admin key, prints it once and keeps
//! it in `--admin-key-file`; later starts use it while it works, and
//! `--new-admin-key` makes another. SIGTERM or Ctrl-C shuts it down
//! gracefully: requests in flight finish, and claims still waiting get
//! `503 shutting_down` with `Retry-After`. Keys go in `Authorization: Bearer <key>`; bodies are
//! JSON.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/keys` | admin: create a key |
//! | `GET /v1/keys` | the caller's keys (every key for an admin), no secrets |
//! | `DELETE /v1/keys/{key}` | revoke a key by its id |
//! | `POST /v1/ns/{ns}/queues/{q}/tasks` | enqueue a task |
//! | `POST /v1/ns/{ns}/queues/{q}/claims` | claim: `200` lease and artifact key, `204` empty, `429` overload |
//! | `POST /v1/ns/{ns}/tasks/{task}/heartbeat` | extend a lease |
//! | `POST /v1/ns/{ns}/tasks/{task}/submit` | submit under an `Idempotency-Key` |
//! | `GET /v1/ns/{ns}/health` | attempts per state |
//! | `GET /v1/me/audit` | the caller's audit events and counters |
//! | `GET /metrics` | the store's metrics, Prometheus text |
//! | `GET /v1/openapi.json` | the OpenAPI document of these routes |
//!
//! Every error is the store's JSON body (`{"error": {"code", "message",
//! "retry_after", "reset_at"}}`) with its status, and a `Retry-After` header
//! on `429` and `503`.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tessera_store::postgres::PostgresOptions;
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    AuditQuery, Brief, BriefVersion, Caller, ClaimOutcome, EnqueueOptions, Error, FencingToken,
    Grant, IdempotencyKey, IssuedKey, KeyFilter, KeyId, KeySpec, LeaseError, Namespace, Output,
    PrincipalId, QueueName, Scope, Store, StoreConfig, Submitted, TaskId, TaskRef,
};
use tokio::net::TcpListener;

/// Serves `store` on `listener` until the listener fails (the tests' way).
#[allow(dead_code)]
pub(crate) async fn serve(listener: TcpListener, store: Arc<Store>) -> std::io::Result<()> {
    serve_until(listener, store, std::future::pending()).await
}

/// Serves `store` on `listener` until `shutdown` completes, then shuts
/// down gracefully: no new connections, requests in flight finish, and
/// claims still waiting for admission get `503 shutting_down` with
/// `Retry-After` (their claims withdrawn).
pub(crate) async fn serve_until(
    listener: TcpListener,
    store: Arc<Store>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing, _) = tokio::sync::watch::channel(false);
    let state = Arc::new(AppState { store, closing });
    let closing = Arc::clone(&state);
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            closing.closing.send_replace(true);
        })
        .await
}

/// The service's routes.
fn app(state: Arc<AppState>) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
        .fallback(|| async {
            ApiError::Store(Error::NotFound {
                what: "route".to_owned(),
            })
        })
        .method_not_allowed_fallback(|| async {
            ApiError::http(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .with_state(state)
}

/// Every path the router serves, with its methods; the OpenAPI document
/// ([`ApiDoc`]) describes the same, as a test checks.
pub(crate) fn routes() -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        ("/v1/keys", post(create_key).get(list_keys)),
        ("/v1/keys/{key}", delete(revoke_key)),
        ("/v1/me/audit", get(my_audit)),
        ("/v1/ns/{ns}/queues/{queue}/tasks", post(enqueue)),
        ("/v1/ns/{ns}/queues/{queue}/claims", post(claim)),
        ("/v1/ns/{ns}/tasks/{task}/heartbeat", post(heartbeat)),
        ("/v1/ns/{ns}/tasks/{task}/submit", post(submit)),
        ("/v1/ns/{ns}/health", get(health)),
        ("/metrics", get(metrics_text)),
        ("/v1/openapi.json", get(openapi)),
    ]
}

/// What every request shares.
pub(crate) struct AppState {
    store: Arc<Store>,
    /// Set when the service begins to shut down.
    closing: tokio::sync::watch::Sender<bool>,
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
            Ok(result) => result.map_err(ApiError::Store),
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }
}

// ---- errors: the one place a store error becomes a response ----

/// An error as an HTTP response: the store's JSON body
/// (`{"error": {"code", "message", "retry_after", "reset_at"}}`) with its
/// status, `Retry-After` (whole seconds) when it has one, and
/// `WWW-Authenticate: Bearer` on `401`. The HTTP layer's own refusals (a
/// bad path, a wrong method, a body too large, a server going down) take
/// the same shape.
pub(crate) enum ApiError {
    /// The store's.
    Store(Error),
    /// The HTTP layer's: its status, code, message and `Retry-After`.
    Http {
        status: StatusCode,
        code: &'static str,
        message: String,
        retry_after: Option<u64>,
    },
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        Self::Store(error)
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> Self {
        Self::Store(error.into())
    }
}

impl ApiError {
    fn http(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Http {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body, retry_after) = match self {
            Self::Store(error) => (
                StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                serde_json::to_value(error.body()).expect("an error body serializes"),
                error.retry_after_seconds(),
            ),
            Self::Http {
                status,
                code,
                message,
                retry_after,
            } => (
                status,
                json!({ "error": { "code": code, "message": message,
                    "retry_after": retry_after, "reset_at": null } }),
                retry_after,
            ),
        };
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A rejection of axum's own (a path that does not parse, a body over the
/// limit) in the store's JSON shape.
fn rejected(rejection: impl IntoResponse + std::fmt::Display) -> ApiError {
    let message = rejection.to_string();
    let status = rejection.into_response().status();
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "invalid_input",
    };
    ApiError::http(status, code, message)
}

fn invalid(reason: impl std::fmt::Display) -> ApiError {
    ApiError::Store(Error::InvalidInput {
        reason: reason.to_string(),
    })
}

/// Parses a JSON request body (read whole, or refused as axum refused it);
/// a malformed one, or one with a field the route does not know, is the
/// store's `400`.
fn parse_body<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(rejected)?;
    serde_json::from_slice(&body).map_err(|error| {
        // A field's own parse error already reads "invalid input: …".
        let error = error.to_string();
        let error = error.strip_prefix("invalid input: ").unwrap_or(&error);
        invalid(format!("request body: {error}"))
    })
}

/// The path's parts, or the store's `400` for a path that does not decode.
fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(parts)| parts).map_err(rejected)
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

/// `POST /v1/keys`: a key for a new principal of `account`, or another key
/// for an existing `principal`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewKey {
    account: Option<String>,
    principal: Option<String>,
    #[serde(default)]
    admin: bool,
    /// `enqueue`, `claim`, `read`.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    scopes: Vec<Scope>,
    /// `namespace:<name>`, `namespace:*` or `admin`.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    grants: Vec<Grant>,
    #[serde(default)]
    label: String,
}

#[utoipa::path(post, path = "/v1/keys", request_body = NewKey, responses((status = 201, description = "the key, shown once, and its info", body = Object), (status = "4XX", description = "refused", body = ErrorSchema)), security(("bearer" = [])))]
async fn create_key(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: NewKey = parse_body(body)?;
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

/// `GET /v1/keys`: the caller's keys (every key for an admin), without
/// secrets.
#[utoipa::path(get, path = "/v1/keys", responses((status = 200, description = "the caller's keys, or every key for an admin; no secrets", body = Object), (status = "4XX", description = "refused", body = ErrorSchema)), security(("bearer" = [])))]
async fn list_keys(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
) -> Result<Response, ApiError> {
    let keys = state
        .call(move |store| store.list_keys(&caller, &KeyFilter::default()))
        .await?;
    Ok(Json(keys).into_response())
}

/// `DELETE /v1/keys/{key}`: revokes a key by its id (the caller's own, or
/// any for an admin); the key's info as it now stands.
#[utoipa::path(delete, path = "/v1/keys/{key}", params(("key" = String, Path, description = "the key id, 16 hex digits")), responses((status = 200, description = "the key's info, revoked", body = Object), (status = "4XX", description = "refused", body = ErrorSchema)), security(("bearer" = [])))]
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

#[utoipa::path(get, path = "/v1/me/audit", responses((status = 200, description = "the caller's audit events and counters", body = Object), (status = "4XX", description = "refused", body = ErrorSchema)), security(("bearer" = [])))]
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

// ---- tasks ----

fn queue_names(ns: &str, queue: &str) -> Result<(Namespace, QueueName), ApiError> {
    Ok((Namespace::parse(ns)?, QueueName::parse(queue)?))
}

/// `POST .../tasks`: a JSON brief, and optionally its id, version and
/// number of competing attempts.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewTask {
    #[schema(value_type = Object)]
    brief: serde_json::Value,
    id: Option<String>,
    version: Option<u32>,
    alternatives: Option<u16>,
}

#[utoipa::path(post, path = "/v1/ns/{ns}/queues/{queue}/tasks", params(("ns" = String, Path), ("queue" = String, Path)), request_body = NewTask, responses((status = 201, description = "the task's reference", body = Object), (status = "4XX", description = "refused", body = ErrorSchema), (status = 503, description = "storage refused the write", body = ErrorSchema)), security(("bearer" = [])))]
async fn enqueue(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let request: NewTask = parse_body(body)?;
    let mut options = EnqueueOptions::default();
    if let Some(id) = &request.id {
        options = options.with_task_id(TaskId::parse(id)?);
    }
    if let Some(version) = request.version {
        options = options.with_version(BriefVersion::new(version)?);
    }
    if let Some(alternatives) = request.alternatives {
        options = options.with_alternatives(alternatives);
    }
    let brief = Brief::Json(request.brief);
    let task = state
        .call(move |store| store.enqueue(&caller, &ns, &queue, &brief, &options))
        .await?;
    Ok((StatusCode::CREATED, Json(task)).into_response())
}

fn task_ref(ns: &str, task: &str, version: u32) -> Result<TaskRef, ApiError> {
    Ok(TaskRef::new(
        Namespace::parse(ns)?,
        TaskId::parse(task)?,
        BriefVersion::new(version)?,
    ))
}

/// `POST .../heartbeat`: the task's version and the fencing token from the
/// claim.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct HeldLease {
    version: u32,
    token: i64,
}

#[utoipa::path(post, path = "/v1/ns/{ns}/tasks/{task}/heartbeat", params(("ns" = String, Path), ("task" = String, Path)), request_body = HeldLease, responses((status = 200, description = "the lease as it now stands", body = Object), (status = "4XX", description = "refused; 409 with its conflict code", body = ErrorSchema)), security(("bearer" = [])))]
async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task_path)?;
    let request: HeldLease = parse_body(body)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(request.token)?;
    let reference = task.clone();
    let lease = state
        .call(move |store| store.heartbeat(&caller, &task, token))
        .await?;
    Ok(Json(with_task_ref(json!(lease), &reference)).into_response())
}

/// `value` (a lease or a receipt, which name their task by its bare id)
/// with its `task` as the task reference every route uses:
/// `{namespace, id, version}`.
fn with_task_ref(mut value: serde_json::Value, task: &TaskRef) -> serde_json::Value {
    value["task"] = json!(task);
    value
}

/// `POST .../submit`: like a heartbeat, plus the output: any JSON value,
/// kept with the receipt.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewSubmission {
    version: u32,
    token: i64,
    #[schema(value_type = Object)]
    output: serde_json::Value,
}

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Submits under the request's `Idempotency-Key`: a retry with the same key
/// and output gets the same receipt (`Idempotent-Replayed: true`); the same
/// key with another output is `409`.
#[utoipa::path(post, path = "/v1/ns/{ns}/tasks/{task}/submit", params(("ns" = String, Path), ("task" = String, Path), ("Idempotency-Key" = String, Header, description = "the submission's key")), request_body = NewSubmission, responses((status = 200, description = "the receipt; Idempotent-Replayed: true on a replay", body = Object), (status = "4XX", description = "refused; 409 with its conflict code", body = ErrorSchema)), security(("bearer" = [])))]
async fn submit(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task_path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or_else(|| invalid("an Idempotency-Key header is required"))?
        .to_str()
        .map_err(|_| invalid("the Idempotency-Key header is not visible ASCII"))?;
    let key = IdempotencyKey::parse(key)?;
    let (ns, task) = path(task_path)?;
    let request: NewSubmission = parse_body(body)?;
    let task = task_ref(&ns, &task, request.version)?;
    let reference = task.clone();
    let token = FencingToken::new(request.token)?;
    let output = Output::bytes(request.output.to_string());
    let submitted = state
        .call(move |store| store.submit(&caller, &task, token, &key, &output))
        .await?;
    let (receipt, replayed) = match submitted {
        Submitted::Accepted(receipt) => (receipt, false),
        Submitted::Replayed(receipt) => (receipt, true),
    };
    let mut response = Json(with_task_ref(json!(receipt), &reference)).into_response();
    if replayed {
        response.headers_mut().insert(
            HeaderName::from_static("idempotent-replayed"),
            HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

/// `GET .../health`: with a key, any namespace it may read; without one,
/// only a namespace the store was configured to show publicly.
#[utoipa::path(get, path = "/v1/ns/{ns}/health", params(("ns" = String, Path)), responses((status = 200, description = "attempts per state", body = Object), (status = "4XX", description = "refused", body = ErrorSchema)))]
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

// ---- the document ----

/// The store's JSON error body, as every refusal carries it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // described, never built: the store's `ErrorBody` is
struct ErrorSchema {
    error: ErrorDetailSchema,
}

/// The inside of [`ErrorSchema`].
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ErrorDetailSchema {
    /// The stable code, e.g. `stale_token` or `storage_quota_exhausted`.
    code: String,
    /// A lowercase message.
    message: String,
    /// Seconds to wait, for `429` and `503`.
    retry_after: Option<u64>,
    /// When a provider allowance resets (RFC 3339), for `503`.
    reset_at: Option<String>,
}

/// Every route, its bodies, headers and errors.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "Tessera", description = "Hand out work under leases: enqueue, claim, heartbeat, submit."),
    paths(create_key, list_keys, revoke_key, my_audit, enqueue, claim, heartbeat, submit, health, metrics_text, openapi),
    components(schemas(NewKey, NewTask, HeldLease, NewSubmission, ErrorSchema, ErrorDetailSchema)),
    modifiers(&Bearer)
)]
pub(crate) struct ApiDoc;

/// Keys go in `Authorization: Bearer <key>`.
struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        }
    }
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "the OpenAPI document", body = Object)))]
async fn openapi() -> Response {
    Json(<ApiDoc as utoipa::OpenApi>::openapi()).into_response()
}

// ---- metrics ----

/// The process's Prometheus recorder, installed once; `/metrics` renders it.
pub(crate) fn prometheus() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first keeps its place; this one then
        // renders what it saw: nothing.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// `GET /metrics`: the store's gauges, counters and histograms in
/// Prometheus' text format.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text", content_type = "text/plain")))]
async fn metrics_text() -> Response {
    let text = prometheus().render();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

// ---- claims ----

/// `POST .../claims`: `200` with the lease, `204` when the queue is empty,
/// `429` when admission is overloaded; each with `Retry-After` where it
/// applies, and the grant's `X-Claim-Wait-Ms` and `X-Claim-Concurrency`.
#[utoipa::path(post, path = "/v1/ns/{ns}/queues/{queue}/claims", params(("ns" = String, Path), ("queue" = String, Path)), responses((status = 200, description = "a lease, its brief and artifact key; X-Claim-Wait-Ms, X-Claim-Concurrency", body = Object), (status = 204, description = "the queue is empty; Retry-After"), (status = 429, description = "overloaded; Retry-After", body = ErrorSchema), (status = 503, description = "shutting down; Retry-After", body = ErrorSchema), (status = "4XX", description = "refused", body = ErrorSchema)), security(("bearer" = [])))]
async fn claim(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    // No SQL runs while it waits, so this stays on the async worker. A
    // shutdown drops the wait, which withdraws the claim.
    let mut closing = state.closing.subscribe();
    let permit = tokio::select! {
        permit = state.store.claim_permit(&caller, &ns, &queue) => permit?,
        _ = closing.wait_for(|closing| *closing) => {
            return Err(ApiError::Http {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "shutting_down",
                message: "the service is shutting down; claim again elsewhere or later".to_owned(),
                retry_after: Some(5),
            });
        }
    };
    let outcome = state.call(move |store| store.finish_claim(permit)).await?;
    Ok(claim_response(&outcome))
}

fn claim_response(outcome: &ClaimOutcome) -> Response {
    let mut response = match outcome {
        // The store's JSON of a claim: task, queue, brief, and the lease
        // with the artifact key the worker writes its output under.
        ClaimOutcome::Granted(claimed) => {
            let mut body = json!(claimed);
            body["lease"] = with_task_ref(body["lease"].take(), &claimed.task);
            Json(body).into_response()
        }
        _ => StatusCode::NO_CONTENT.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert("x-claim-wait-ms", HeaderValue::from(outcome.wait_ms()));
    headers.insert(
        "x-claim-concurrency",
        HeaderValue::from(outcome.concurrency_limit()),
    );
    if let Some(retry_after) = outcome.retry_after() {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after.as_secs().max(1)));
    }
    response
}

// ---- the program ----

/// The admin key if it was made now (to print once); `None` when the one
/// in the key file still works.
type MadeKey = Option<IssuedKey>;

/// Opens the store `args` name and finds or makes the admin key: what the
/// database is, for the log, the store, and the key if it was made now.
fn open(
    args: &Args,
) -> Result<(Arc<Store>, String, MadeKey), Box<dyn std::error::Error + Send + Sync>> {
    let config = || {
        let config = StoreConfig::default()
            .with_admission(tessera_examples::admission_from_env("http_service"));
        let config = args
            .public
            .iter()
            .cloned()
            .fold(config, StoreConfig::with_public_namespace);
        match args.daily_rows {
            Some(rows) => config.with_daily_rows_written_allowance(rows),
            None => config,
        }
    };
    let (store, database) = match &args.postgres {
        Some(url) => {
            let mut options = PostgresOptions::new(url.as_str());
            if let Some(schema) = &args.schema {
                options = options.with_schema(schema.as_str());
            }
            let described = format!("{options:?}");
            (Store::open_postgres(options, config())?, described)
        }
        None => {
            let mut options = SqliteOptions::file(&args.db);
            if let Some(pages) = args.page_cap {
                options = options.with_max_page_count(pages);
            }
            (
                Store::open_sqlite(options, config())?,
                args.db.display().to_string(),
            )
        }
    };
    let admin = admin_key(&store, &args.admin_key_file, args.new_admin_key)?;
    Ok((Arc::new(store), database, admin))
}

/// The key in `file` if it still authenticates and no new one is asked
/// for; otherwise a new admin key, written to `file` (readable by its
/// owner alone) before it is printed.
fn admin_key(
    store: &Store,
    file: &std::path::Path,
    new: bool,
) -> Result<MadeKey, Box<dyn std::error::Error + Send + Sync>> {
    if !new {
        if let Ok(secret) = std::fs::read_to_string(file) {
            if store.authenticate(Some(secret.trim())).is_ok() {
                return Ok(None);
            }
        }
    }
    let key = store.create_admin_key("operator")?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    std::io::Write::write_all(&mut options.open(file)?, key.secret.expose().as_bytes())
        .map_err(|error| format!("{}: {error}", file.display()))?;
    Ok(Some(key))
}

struct Args {
    port: u16,
    bind: std::net::IpAddr,
    db: PathBuf,
    /// A PostgreSQL URL; the SQLite file is used without one.
    postgres: Option<String>,
    /// The PostgreSQL schema the store's tables are in.
    schema: Option<String>,
    /// Namespaces whose health anyone may read.
    public: Vec<Namespace>,
    /// The rows-written allowance a day; unlimited without it.
    daily_rows: Option<u64>,
    /// The SQLite file's cap in pages; past it writes are `503`.
    page_cap: Option<u64>,
    /// Where the admin key is kept.
    admin_key_file: PathBuf,
    /// Make another admin key even if the file's still works.
    new_admin_key: bool,
}

const USAGE: &str = "\
usage: http_service [OPTIONS]

  --port PORT          the port to listen on (default 8080; 0 picks a free one)
  --bind ADDRESS       the address to listen on (default 127.0.0.1)
  --db PATH            the SQLite file (default tessera-http.db)
  --postgres URL       serve from PostgreSQL instead ($TESSERA_POSTGRES_URL by default)
  --schema NAME        the PostgreSQL schema of the store's tables
  --public NAMESPACE   a namespace whose health anyone may read (repeatable)
  --daily-rows N       refuse writes (503) past N rows written a day
  --page-cap N         refuse writes (503) past N pages of the SQLite file
  --admin-key-file F   where the admin key is kept (default tessera-admin.key):
                       made and printed once, then kept while it works
  --new-admin-key      make and print another admin key (the file gets it)
  --help               this text

Admission settings come from TESSERA_CLAIM_* (see AdmissionConfig::from_env).
SIGTERM or Ctrl-C shuts down gracefully.";

/// What the command line asks for; `Ok(None)` for `--help`.
fn parse_args(words: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut args = Args {
        port: 8080,
        bind: Ipv4Addr::LOCALHOST.into(),
        db: PathBuf::from("tessera-http.db"),
        postgres: std::env::var("TESSERA_POSTGRES_URL").ok(),
        schema: None,
        public: Vec::new(),
        daily_rows: None,
        page_cap: None,
        admin_key_file: PathBuf::from("tessera-admin.key"),
        new_admin_key: false,
    };
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        match word.as_str() {
            "--help" | "-h" => return Ok(None),
            "--port" => args.port = number(&word, &value()?)?,
            "--bind" => {
                let text = value()?;
                args.bind = text
                    .parse()
                    .map_err(|_| format!("--bind: {text:?} is not an address"))?;
            }
            "--db" => args.db = PathBuf::from(value()?),
            "--postgres" => args.postgres = Some(value()?),
            "--schema" => args.schema = Some(value()?),
            "--public" => {
                let text = value()?;
                args.public.push(
                    Namespace::parse(&text)
                        .map_err(|error| format!("--public {text:?}: {error}"))?,
                );
            }
            "--daily-rows" => args.daily_rows = Some(number(&word, &value()?)?),
            "--page-cap" => args.page_cap = Some(number(&word, &value()?)?),
            "--admin-key-file" => args.admin_key_file = PathBuf::from(value()?),
            "--new-admin-key" => args.new_admin_key = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: {text:?} is not a number in range"))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

#[tokio::main]
async fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(problem) => {
            eprintln!("http_service: {problem}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(problem) = run(args).await {
        eprintln!("http_service: {problem}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // The store's spans and events, as log lines on standard error.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .init();
    prometheus();
    let address = SocketAddr::from((args.bind, args.port));
    // Opening and key making are blocking store calls: off the runtime's
    // threads, as every store call is.
    let key_file = args.admin_key_file.clone();
    let (store, database, admin) = tokio::task::spawn_blocking(move || open(&args))
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())?;
    let listener = TcpListener::bind(address).await?;
    let address = listener.local_addr()?;
    println!("tessera http service on http://{address}");
    println!("database: {database}");
    match admin {
        Some(key) => {
            println!(
                "admin key: {} (kept in {})",
                key.secret.expose(),
                key_file.display()
            );
        }
        None => println!("admin key: kept in {}", key_file.display()),
    }
    serve_until(listener, store, shutdown_signal()).await?;
    println!("shut down");
    Ok(())
}
