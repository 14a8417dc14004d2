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
//! cargo run --release --example http_service -- --port 8080 [--db PATH | --postgres URL [--schema NAME]]
//! ```
//!
//! It listens on 127.0.0.1 only (port 0 picks a free port) and prints a
//! fresh admin key. Keys go in `Authorization: Bearer <key>`; bodies are
//! JSON.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/keys` | admin: create a key |
//! | `POST /v1/ns/{ns}/queues/{q}/tasks` | enqueue a task |
//! | `POST /v1/ns/{ns}/queues/{q}/claims` | claim: `200` lease and artifact key, `204` empty, `429` overload |
//! | `POST /v1/ns/{ns}/tasks/{task}/heartbeat` | extend a lease |
//! | `POST /v1/ns/{ns}/tasks/{task}/submit` | submit under an `Idempotency-Key` |
//! | `GET /v1/ns/{ns}/health` | attempts per state |
//! | `GET /v1/me/audit` | the caller's audit events and counters |
//!
//! Every error is the store's JSON body (`{"error": {"code", "message",
//! "retry_after", "reset_at"}}`) with its status, and a `Retry-After` header
//! on `429` and `503`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    AuditQuery, Brief, BriefVersion, Caller, ClaimOutcome, EnqueueOptions, Error, FencingToken,
    Grant, IdempotencyKey, IssuedKey, KeySpec, LeaseError, Namespace, Output, PrincipalId,
    QueueName, Scope, Store, StoreConfig, Submitted, TaskId, TaskRef,
};
use tokio::net::TcpListener;

/// Serves `store` on `listener` until the listener fails.
pub(crate) async fn serve(listener: TcpListener, store: Arc<Store>) -> std::io::Result<()> {
    let state = Arc::new(AppState { store });
    axum::serve(listener, app(state)).await
}

/// The service's routes.
fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/keys", post(create_key))
        .route("/v1/ns/{ns}/queues/{queue}/tasks", post(enqueue))
        .route("/v1/ns/{ns}/queues/{queue}/claims", post(claim))
        .route("/v1/ns/{ns}/tasks/{task}/heartbeat", post(heartbeat))
        .route("/v1/ns/{ns}/tasks/{task}/submit", post(submit))
        .route("/v1/ns/{ns}/health", get(health))
        .route("/v1/me/audit", get(my_audit))
        .fallback(|| async {
            ApiError(Error::NotFound {
                what: "route".to_owned(),
            })
        })
        .with_state(state)
}

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

// ---- errors: the one place a store error becomes a response ----

/// A store error as an HTTP response: its status, its JSON body, and
/// `Retry-After` (whole seconds) when it has one.
pub(crate) struct ApiError(Error);

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        Self(error)
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> Self {
        Self(error.into())
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

/// `POST /v1/keys`: a key for a new principal of `account`, or another key
/// for an existing `principal`.
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
    body: Bytes,
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

// ---- tasks ----

fn queue_names(ns: &str, queue: &str) -> Result<(Namespace, QueueName), ApiError> {
    Ok((Namespace::parse(ns)?, QueueName::parse(queue)?))
}

/// `POST .../tasks`: a JSON brief, and optionally its id, version and
/// number of competing attempts.
#[derive(Deserialize)]
struct NewTask {
    brief: serde_json::Value,
    id: Option<String>,
    version: Option<u32>,
    alternatives: Option<u16>,
}

async fn enqueue(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    Path((ns, queue)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (ns, queue) = queue_names(&ns, &queue)?;
    let request: NewTask = parse_body(&body)?;
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
#[derive(Deserialize)]
struct HeldLease {
    version: u32,
    token: i64,
}

async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    Path((ns, task)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: HeldLease = parse_body(&body)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(request.token)?;
    let lease = state
        .call(move |store| store.heartbeat(&caller, &task, token))
        .await?;
    Ok(Json(lease).into_response())
}

/// `POST .../submit`: like a heartbeat, plus the output: any JSON value,
/// kept with the receipt.
#[derive(Deserialize)]
struct NewSubmission {
    version: u32,
    token: i64,
    output: serde_json::Value,
}

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Submits under the request's `Idempotency-Key`: a retry with the same key
/// and output gets the same receipt (`Idempotent-Replayed: true`); the same
/// key with another output is `409`.
async fn submit(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    Path((ns, task)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| invalid("an Idempotency-Key header is required"))?;
    let key = IdempotencyKey::parse(key)?;
    let request: NewSubmission = parse_body(&body)?;
    let task = task_ref(&ns, &task, request.version)?;
    let token = FencingToken::new(request.token)?;
    let output = Output::bytes(request.output.to_string());
    let submitted = state
        .call(move |store| store.submit(&caller, &task, token, &key, &output))
        .await?;
    let (receipt, replayed) = match submitted {
        Submitted::Accepted(receipt) => (receipt, false),
        Submitted::Replayed(receipt) => (receipt, true),
    };
    let mut response = Json(receipt).into_response();
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
async fn health(
    State(state): State<Arc<AppState>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&ns)?;
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

// ---- claims ----

/// `POST .../claims`: `200` with the lease, `204` when the queue is empty,
/// `429` when admission is overloaded; each with `Retry-After` where it
/// applies, and the grant's `X-Claim-Wait-Ms` and `X-Claim-Concurrency`.
async fn claim(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    Path((ns, queue)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (ns, queue) = queue_names(&ns, &queue)?;
    // No SQL runs while it waits, so this stays on the async worker.
    let permit = state.store.claim_permit(&caller, &ns, &queue).await?;
    let outcome = state.call(move |store| store.finish_claim(permit)).await?;
    Ok(claim_response(&outcome))
}

fn claim_response(outcome: &ClaimOutcome) -> Response {
    let mut response = match outcome {
        // The store's JSON of a claim: task, queue, brief, and the lease
        // with the artifact key the worker writes its output under.
        ClaimOutcome::Granted(claimed) => Json(claimed).into_response(),
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

/// Opens the store `args` name and makes the admin key: what the database
/// is, for the log, and the store and key.
fn open(args: &Args) -> Result<(Arc<Store>, String, IssuedKey), Error> {
    let config = || {
        StoreConfig::default().with_admission(tessera_examples::admission_from_env("http_service"))
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
        None => (
            Store::open(&args.db, config())?,
            args.db.display().to_string(),
        ),
    };
    let admin = store.create_admin_key("operator")?;
    Ok((Arc::new(store), database, admin))
}

struct Args {
    port: u16,
    db: PathBuf,
    /// A PostgreSQL URL; the SQLite file is used without one.
    postgres: Option<String>,
    /// The PostgreSQL schema the store's tables are in.
    schema: Option<String>,
}

const USAGE: &str = "usage: http_service [--port PORT] [--db PATH | --postgres URL [--schema NAME]]\n\
    (--postgres defaults to $TESSERA_POSTGRES_URL when that is set)";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 8080,
        db: PathBuf::from("tessera-http.db"),
        postgres: std::env::var("TESSERA_POSTGRES_URL").ok(),
        schema: None,
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
            "--postgres" => args.postgres = Some(value()?),
            "--schema" => args.schema = Some(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|problem| format!("{problem}\n{USAGE}"))?;
    let port = args.port;
    // Opening and key making are blocking store calls: off the runtime's
    // threads, as every store call is.
    let (store, database, admin) = tokio::task::spawn_blocking(move || open(&args))
        .await
        .map_err(|error| error.to_string())??;
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    let address = listener.local_addr()?;
    println!("tessera http service on http://{address}");
    println!("database: {database}");
    println!("admin key: {}", admin.secret.expose());
    serve(listener, store).await?;
    Ok(())
}
