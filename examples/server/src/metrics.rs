//! Prometheus text of the store's metrics.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process's Prometheus recorder, installed once; `/metrics` renders it.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first keeps its place; this one then
        // renders what it saw: nothing.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// `GET /metrics`: the store's gauges, counters and histograms in
/// Prometheus' text format.
pub(crate) async fn metrics_text() -> Response {
    let text = prometheus().render();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
