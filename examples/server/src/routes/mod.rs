//! The route table: each route one `Store` operation, with its
//! description for the document beside it.

mod audit;
mod board;
pub(crate) mod claims;
mod discovery;
mod events;
mod health;
mod keys;
mod leases;
mod public;
mod queues;
mod schedules;
mod sessions;
pub(crate) mod tasks;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode};
use axum::routing::{MethodRouter, on};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tessera_store::{Error, Namespace, QueueName, Store, TaskId, TaskRef};
use tokio::net::TcpListener;

use crate::errors::ApiError;
use crate::openapi::Doc;
pub use public::PublicOptions;

/// One route: its method and path, the `Store` operation it calls, and
/// how the document describes it.
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path, with `{parameters}`.
    pub path: &'static str,
    /// The `Store` method it is a thin call to; `None` for the server's
    /// own (`/metrics`, the document).
    pub operation: Option<&'static str>,
    pub(crate) doc: Doc,
    pub(crate) handler: MethodRouter<Arc<AppState>>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

impl Route {
    /// The route at `endpoint`, the client's name for it.
    pub(crate) fn at(
        endpoint: tessera_client::wire::Endpoint,
        operation: Option<&'static str>,
        doc: Doc,
        handler: MethodRouter<Arc<AppState>>,
    ) -> Self {
        use tessera_client::wire::Verb;
        let method = match endpoint.verb {
            Verb::Get => Method::GET,
            Verb::Post => Method::POST,
            Verb::Put => Method::PUT,
            Verb::Delete => Method::DELETE,
        };
        Self::new(method, endpoint.path, operation, doc, handler)
    }

    pub(crate) fn new(
        method: Method,
        path: &'static str,
        operation: Option<&'static str>,
        doc: Doc,
        handler: MethodRouter<Arc<AppState>>,
    ) -> Self {
        Self {
            method,
            path,
            operation,
            doc,
            handler,
        }
    }
}

/// The public `Store` methods that are not operations a client calls over
/// HTTP, each with why. Every other public method has a route; a test
/// reads the store's source and fails on one that has neither.
pub const NOT_ROUTED: &[(&str, &str)] = &[
    ("open", "opening a store: the server does it at start"),
    ("open_in_memory", "opening a store"),
    ("open_sqlite", "opening a store"),
    ("open_postgres", "opening a store"),
    (
        "authenticate",
        "every keyed route runs it on the bearer key",
    ),
    ("recheck", "the claim gate runs it after a wait"),
    (
        "enqueue_one",
        "the enqueue route answers with it: 201 created, or 200 for a unique task's duplicate",
    ),
    ("authorize", "every operation runs it"),
    (
        "create_admin_key",
        "the server makes its admin key at start",
    ),
    ("claim_async", "the claim route awaits claim_permit instead"),
    (
        "heartbeat_with_progress",
        "the heartbeat route, when its body carries progress",
    ),
    ("claim_permit", "the claim route's wait for admission"),
    (
        "submit_and_claim",
        "a blocking call for threads of the process that holds the store: over HTTP a \
         submission and the next claim are two requests",
    ),
    (
        "finish_claim",
        "the claim route's lease transaction, after claim_permit",
    ),
    (
        "claim_cancellable",
        "a blocking claim for threads; the claim route's wait is dropped instead",
    ),
    ("cancel_token", "for claim_cancellable"),
    (
        "begin_claim",
        "the sans-IO claim steps, for hosts that drive admission",
    ),
    ("poll_claim_event", "the sans-IO claim steps"),
    ("poll_claim_timeout", "the sans-IO claim steps"),
    ("cancel_claim", "the sans-IO claim steps"),
    ("set_claim_waker", "the sans-IO claim steps"),
    ("claim_stats", "admission's state: served as metrics"),
    ("long_polls_waiting", "served as metrics"),
    (
        "long_poll_interval",
        "the backend's polling interval, a setting",
    ),
    ("pending_counters", "served as metrics"),
    (
        "flush_counters",
        "an audit read flushes them; maintenance too",
    ),
    ("maintain", "the server runs it on its own timer"),
    (
        "cached_health",
        "/metrics shows it as tessera_attempts, reading nothing from storage",
    ),
    (
        "last_retention",
        "the board's feed shows it (`retention`), and /metrics counts what retention deleted",
    ),
    (
        "next_maintenance",
        "the server's maintenance timer reads it",
    ),
    (
        "expire_leases",
        "optional upkeep: a claim takes over a lapsed lease whether or not it ran",
    ),
    (
        "hash_address",
        "the session route hashes the client's address through mint_session",
    ),
    ("meter", "rows read and written, for benchmarks"),
    ("meters_rows", "for benchmarks"),
    ("measure", "for benchmarks"),
    (
        "refuse_writes",
        "an operator's switch in the host, not a client's",
    ),
    ("is_refusing_writes", "an operator's switch"),
    (
        "rows_written_today",
        "the daily allowance's count, for the host",
    ),
    ("clock", "the store's clock"),
    (
        "run_scheduler",
        "the server runs its scheduler thread itself (unless --no-scheduler)",
    ),
    (
        "next_schedule_fire",
        "the scheduler thread's sleep reads it",
    ),
];

/// Every route the server serves, in the document's order.
pub fn routes() -> Vec<Route> {
    let mut routes = Vec::new();
    routes.extend(keys::routes());
    routes.extend(audit::routes());
    routes.extend(sessions::routes());
    routes.extend(tasks::routes());
    routes.extend(claims::routes());
    routes.extend(queues::routes());
    routes.extend(leases::routes());
    routes.extend(schedules::routes());
    routes.extend(health::routes());
    routes.extend(events::routes());
    routes.extend(public::routes());
    routes.extend(board::routes());
    routes.extend(discovery::routes());
    routes.push(Route::new(
        Method::GET,
        "/metrics",
        None,
        Doc::new("metrics", "the store's metrics, Prometheus text").answers(
            "200",
            "Prometheus text",
            None,
        ),
        on(
            axum::routing::MethodFilter::GET,
            crate::metrics::metrics_text,
        ),
    ));
    routes.push(Route::new(
        Method::GET,
        "/v1/openapi.json",
        None,
        Doc::new("openapi", "this document").answers(
            "200",
            "the OpenAPI document",
            Some(json!({ "type": "object" })),
        ),
        on(axum::routing::MethodFilter::GET, crate::openapi::openapi),
    ));
    routes
}

/// What every request shares.
#[derive(Debug)]
pub struct AppState {
    pub(crate) store: Arc<Store>,
    /// Set when the service begins to shut down.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
    /// The longest a long-poll waits here.
    pub(crate) max_long_poll: std::time::Duration,
    /// The namespaces anyone may read, and the admission's pending bound.
    pub(crate) public: PublicOptions,
    /// Whether anonymous sessions may be minted.
    pub(crate) sessions: bool,
    /// The browser origins `/mcp` serves besides the loopback ones.
    pub(crate) allowed_origins: Vec<String>,
    /// The last hour in memory, for the board's charts.
    pub(crate) history: std::sync::Mutex<crate::history::History>,
}

impl AppState {
    /// Runs a store call on the blocking pool: each is a short transaction
    /// that must not stall the async workers (and the PostgreSQL client
    /// may not run on them at all).
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || work(&store)).await {
            Ok(result) => result.map_err(ApiError::Store),
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }

    /// Records into the board's history at the store's time: a few
    /// counters in memory, never a storage call.
    pub(crate) fn remember(
        &self,
        record: impl FnOnce(&mut crate::history::History, DateTime<Utc>),
    ) {
        let now = tessera_store::Clock::now_utc(self.store.clock().as_ref());
        let mut history = self
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        record(&mut history, now);
    }

    /// Resolves when the server begins to shut down.
    pub(crate) async fn closing(&self) {
        let mut closing = self.closing.subscribe();
        let _ = closing.wait_for(|closing| *closing).await;
    }
}

/// `503 shutting_down`, for a wait the shutdown ended.
pub(crate) fn shutting_down() -> ApiError {
    ApiError::Http {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "shutting_down",
        message: "the service is shutting down; try again elsewhere or later".to_owned(),
        retry_after: Some(std::time::Duration::from_secs(5)),
    }
}

/// The router of `routes` over `state`.
fn app(state: Arc<AppState>) -> Router {
    routed().with_state(state)
}

/// The router of `routes`, its layers included, before its state: the
/// server's, and the one `/mcp` calls a route tool through.
pub(crate) fn routed() -> Router<Arc<AppState>> {
    routes()
        .into_iter()
        .fold(Router::new(), |router, route| {
            router.route(route.path, route.handler)
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
        .layer(axum::middleware::from_fn(bounds))
        .layer(axum::middleware::from_fn(access))
}

/// The longest request target (path and query) the server reads: `414`
/// past it.
pub(crate) const MAX_TARGET_BYTES: usize = 8 * 1024;
/// The most header fields a request may carry: `431` past it.
pub(crate) const MAX_HEADERS: usize = 100;
/// The most bytes a request's header fields may take, names and values:
/// `431` past it.
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The header fields the transport reads before it gives up on a request
/// with a bodiless `431` of its own: well past [`MAX_HEADERS`], so the
/// server's JSON refusal is what a client meets.
const TRANSPORT_MAX_HEADERS: usize = 4 * MAX_HEADERS;

/// `414 uri_too_long` and `431 headers_too_large`, as JSON, for a request
/// past the server's bounds.
async fn bounds(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |target| target.as_str().len());
    if target > MAX_TARGET_BYTES {
        return ApiError::http(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request's path and query take {target} bytes, over {MAX_TARGET_BYTES}"),
        )
        .into_response();
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::http(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request has {} header fields of {bytes} bytes, over {MAX_HEADERS} fields or {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        )
        .into_response();
    }
    next.run(request).await
}

/// The public id of the key a request presents (`tsk_<key id>_…`), for
/// the access log: never the secret.
fn key_id(request: &axum::extract::Request) -> String {
    crate::auth::bearer_key(request.headers())
        .and_then(|key| key.strip_prefix("tsk_"))
        .and_then(|rest| rest.split_once('_'))
        .map(|(id, _)| id)
        .filter(|id| id.len() == 16 && id.bytes().all(|byte| byte.is_ascii_hexdigit()))
        .map_or_else(|| "-".to_owned(), str::to_owned)
}

/// One access-log line per request (method, route, status, duration, the
/// key id; never a secret, a path's values or a body) at target
/// `tessera_server::access`, and the request's metrics.
async fn access(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |path| path.as_str())
        .to_owned();
    let key = key_id(&request);
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    tracing::info!(
        target: "tessera_server::access",
        method = %method,
        route = %route,
        status,
        duration_ms = elapsed.as_secs_f64() * 1e3,
        key = %key,
        "request"
    );
    crate::metrics::request_answered(&method, &route, status, elapsed);
    response
}

/// How the server is tuned.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The longest a long-poll waits here (at most the store's
    /// [`MAX_LONG_POLL`](tessera_store::limits::MAX_LONG_POLL)).
    pub max_long_poll: std::time::Duration,
    /// What the public face serves: the namespaces anyone may read.
    pub public: PublicOptions,
    /// The longest a client may take to send a request's headers, and
    /// the longest a kept-alive connection may sit idle before its next
    /// request: the connection is closed past it (default 10 s).
    pub header_timeout: std::time::Duration,
    /// The longest a client may take to send a request's body once its
    /// headers are in: `408 request_timeout` past it (default 30 s).
    pub body_timeout: std::time::Duration,
    /// Whether anyone may mint an anonymous session (`POST /v1/sessions`;
    /// default on).
    pub sessions: bool,
    /// The browser origins (`scheme://host[:port]`) that may call `/mcp`
    /// besides the loopback ones (`localhost`, `127.0.0.1`, `[::1]`); a
    /// request without `Origin` (a client that is not a browser) is not
    /// checked. Default: none.
    pub allowed_origins: Vec<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            max_long_poll: std::time::Duration::from_secs(30),
            public: PublicOptions::default(),
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(30),
            sessions: true,
            allowed_origins: Vec::new(),
        }
    }
}

/// How long a request's body may take to arrive, for the extractors that
/// read it (a request extension the server sets on every request).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyTimeout(pub(crate) std::time::Duration);

/// Serves `store` on `listener` until `shutdown` completes, then shuts
/// down gracefully: no new connections, requests in flight answer, and
/// claims and long-polls still waiting get `503 shutting_down` with
/// `Retry-After` (their claims withdrawn).
pub async fn serve_until(
    listener: TcpListener,
    store: Arc<Store>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing, _) = tokio::sync::watch::channel(false);
    let state = Arc::new(AppState {
        store,
        closing,
        max_long_poll: options.max_long_poll,
        public: options.public,
        sessions: options.sessions,
        allowed_origins: options.allowed_origins,
        history: std::sync::Mutex::default(),
    });
    tokio::spawn(sample_history(Arc::clone(&state)));
    let router = app(state.clone());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .max_headers(TRANSPORT_MAX_HEADERS)
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let body_timeout = BodyTimeout(options.body_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors, or a connection reset before it was
                // accepted: the listener goes on.
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request.extensions_mut().insert(body_timeout);
                tower::ServiceExt::oneshot(router.clone(), request.map(axum::body::Body::new))
            },
        );
        let connection =
            graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended");
            }
        });
    }
    drop(listener);
    // Waiting claims and long-polls answer 503 now; requests in flight
    // finish, and kept-alive connections close after their response.
    state.closing.send_replace(true);
    graceful.shutdown().await;
    Ok(())
}

/// How often the server samples the board's history.
const HISTORY_SAMPLE: std::time::Duration = std::time::Duration::from_secs(15);

/// Samples the board's history until shutdown: the snapshots the store
/// holds (from its cache: no read) and the concurrency limit (memory).
async fn sample_history(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(HISTORY_SAMPLE);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = state.closing() => return,
        }
        let snapshots = state.store.cached_health();
        let limit = state.store.claim_stats().limit;
        state.remember(|history, now| {
            history.limit(now, limit);
            for snapshot in &snapshots {
                history.snapshot(now, snapshot);
            }
        });
    }
}

/// A namespace and queue from a path.
pub(crate) fn queue_names(ns: &str, queue: &str) -> Result<(Namespace, QueueName), ApiError> {
    Ok((Namespace::parse(ns)?, QueueName::parse(queue)?))
}

/// A task reference from a path and a version.
pub(crate) fn task_ref(ns: &str, task: &str, version: i64) -> Result<TaskRef, ApiError> {
    let version = crate::limits::VERSION.integer(version)?;
    Ok(TaskRef::new(
        Namespace::parse(ns)?,
        TaskId::parse(task)?,
        tessera_store::BriefVersion::new(version as u32)?,
    ))
}

/// `value` (a lease or a receipt, which name their task by its bare id)
/// with its `task` as the task reference every route uses:
/// `{namespace, id, version}`.
pub(crate) fn with_task_ref(mut value: Value, task: &TaskRef) -> Value {
    value["task"] = json!(task);
    value
}

/// A route's doc path parameters for a queue: namespace and queue.
pub(crate) fn queue_doc(doc: Doc) -> Doc {
    doc.path(crate::limits::NAMESPACE, "renders")
        .path(crate::limits::QUEUE, "frames")
}

/// A route's doc path parameters for a task: namespace and task id.
pub(crate) fn task_doc(doc: Doc) -> Doc {
    doc.path(crate::limits::NAMESPACE, "renders")
        .path(crate::limits::TASK, "frame-7")
}

/// The body schema of `properties`, with `required` ones, and no other.
pub(crate) fn object(properties: Value, required: &[&str]) -> Value {
    // An optional field may be sent as null, as serde reads an absent one.
    let mut properties = properties;
    for (name, property) in properties.as_object_mut().expect("properties") {
        if !required.contains(&name.as_str()) && property.get("type").is_some() {
            property["nullable"] = json!(true);
            // OpenAPI 3.0 reads `nullable` beside an `enum` only if the
            // enum lists null too.
            if let Some(values) = property.get_mut("enum").and_then(Value::as_array_mut) {
                values.push(Value::Null);
            }
        }
    }
    let mut schema = json!({
        "type": "object",
        "properties": properties,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}
