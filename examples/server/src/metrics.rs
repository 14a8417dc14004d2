//! Prometheus text of the store's and the server's metrics: counters,
//! gauges and histograms (with buckets, so they add up across servers),
//! each with its `HELP` line.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Seconds: a request, a claim's wait or its transaction, a commit.
const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Sizes: acknowledgements or rows in one commit.
const SIZES: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Every metric the server reports, with its help text.
const HELP: &[(&str, &str)] = &[
    (
        "tessera_http_requests_total",
        "HTTP requests answered, by method, route and status",
    ),
    (
        "tessera_http_request_duration_seconds",
        "time to answer an HTTP request, by method and route",
    ),
    (
        "tessera_attempts",
        "attempts by namespace and state, from the latest health snapshot held",
    ),
    (
        "tessera_queue_depth",
        "unfinished tasks by namespace, queue and state (ready, delayed, leased), from the latest health snapshot held",
    ),
    ("tessera_claims_granted_total", "leases granted by claims"),
    (
        "tessera_claims_empty_total",
        "claims that found nothing to grant",
    ),
    (
        "tessera_claims_rejected_total",
        "claims admission refused (429), by reason",
    ),
    (
        "tessera_claim_wait_seconds",
        "time a claim waited for admission",
    ),
    (
        "tessera_claim_service_seconds",
        "time a claim's lease transaction took",
    ),
    ("tessera_claim_in_flight", "claims admitted and running"),
    (
        "tessera_claim_limit",
        "the adaptive concurrency limit of claims",
    ),
    ("tessera_claim_pending", "claims waiting for admission"),
    (
        "tessera_ack_batch_size",
        "acknowledgements committed together",
    ),
    (
        "tessera_commit_batch_size",
        "acknowledgements in one commit of the completer",
    ),
    (
        "tessera_commit_seconds",
        "time one commit of the completer took",
    ),
    (
        "tessera_counter_rows_written_total",
        "per-minute counter rows written",
    ),
    (
        "tessera_retention_rows_deleted_total",
        "rows retention deleted",
    ),
    (
        "tessera_retention_tasks_purged_total",
        "finished tasks retention purged",
    ),
    (
        "tessera_storage_quota_exhausted_total",
        "writes refused because storage refused them",
    ),
];

/// The process's Prometheus recorder, installed once; `/metrics` renders it.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(SECONDS)
            .and_then(|builder| {
                builder.set_buckets_for_metric(Matcher::Suffix("_size".to_owned()), SIZES)
            })
            .expect("bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first keeps its place; this one then
        // renders what it saw: nothing.
        if metrics::set_global_recorder(recorder).is_ok() {
            for (name, help) in HELP {
                describe(name, help);
            }
        }
        handle
    })
}

/// Gives `name` its help text, under the kind its name says.
fn describe(name: &'static str, help: &'static str) {
    if name.ends_with("_total") {
        metrics::describe_counter!(name, help);
    } else if name.ends_with("_seconds") || name.ends_with("_size") {
        metrics::describe_histogram!(name, help);
    } else {
        metrics::describe_gauge!(name, help);
    }
}

/// `GET /metrics`: the store's and the server's metrics in Prometheus'
/// text format. The attempts by state come from the health snapshots the
/// store holds, so a scrape reads nothing from storage.
pub(crate) async fn metrics_text(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<crate::routes::AppState>>,
) -> Response {
    // A queue reported before and gone from its snapshot since reads 0.
    static REPORTED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let mut reported = REPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut now = Vec::new();
    let snapshots = state.store.cached_health();
    for snapshot in &snapshots {
        let namespace = snapshot.namespace.as_str();
        let counts = serde_json::to_value(snapshot.attempts).unwrap_or_default();
        for (state_name, count) in counts.as_object().into_iter().flatten() {
            metrics::gauge!(
                "tessera_attempts",
                "namespace" => namespace.to_owned(),
                "state" => state_name.clone(),
            )
            .set(count.as_f64().unwrap_or(0.0));
        }
        for depth in &snapshot.depths {
            let queue = (namespace.to_owned(), depth.queue.as_str().to_owned());
            queue_depth(&queue, [depth.ready, depth.delayed, depth.leased]);
            now.push(queue);
        }
    }
    // A namespace with no snapshot held (one changed since it was taken)
    // keeps its last figures, as `tessera_attempts` does; only a queue
    // gone from a held snapshot reads 0.
    let held: Vec<&str> = snapshots
        .iter()
        .map(|snapshot| snapshot.namespace.as_str())
        .collect();
    let (gone, kept): (Vec<_>, Vec<_>) = reported
        .drain(..)
        .filter(|queue| !now.contains(queue))
        .partition(|(namespace, _)| held.contains(&namespace.as_str()));
    for queue in &gone {
        queue_depth(queue, [0, 0, 0]);
    }
    now.extend(kept);
    *reported = now;
    drop(reported);
    let text = prometheus().render();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Sets one queue's depth gauges: ready, delayed and leased.
fn queue_depth((namespace, queue): &(String, String), counts: [u64; 3]) {
    for (state, count) in ["ready", "delayed", "leased"].into_iter().zip(counts) {
        metrics::gauge!(
            "tessera_queue_depth",
            "namespace" => namespace.clone(),
            "queue" => queue.clone(),
            "state" => state,
        )
        .set(count as f64);
    }
}

/// Counts and times one answered request.
pub(crate) fn request_answered(
    method: &str,
    route: &str,
    status: u16,
    elapsed: std::time::Duration,
) {
    // A method label from a fixed set: a client's own method names would
    // each add series without bound.
    let method = match method {
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS" => method,
        _ => "other",
    };
    metrics::counter!(
        "tessera_http_requests_total",
        "method" => method.to_owned(),
        "route" => route.to_owned(),
        "status" => status.to_string(),
    )
    .increment(1);
    metrics::histogram!(
        "tessera_http_request_duration_seconds",
        "method" => method.to_owned(),
        "route" => route.to_owned(),
    )
    .record(elapsed.as_secs_f64());
}
