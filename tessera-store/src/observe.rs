//! What the store tells the `tracing` and `metrics` facades, each behind
//! its feature. Without a feature every function here is empty; with one,
//! and no subscriber or recorder installed, each costs the facade's check
//! for one: an atomic load (`tracing`'s callsite interest, `metrics`'
//! global recorder), and no allocation (metric keys are statics).
//!
//! Never a secret: spans and events name actions, namespaces, queues and
//! principal ids, which the audit rows name too.

use std::time::Duration;

use tessera_admission::{RejectReason, Stats};
use tessera_audit::Action;

use crate::model::audit::ActionScope;

/// Times what a metric or event reports: the clock is read only when a
/// feature will report it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timer {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    began: std::time::Instant,
}

impl Timer {
    /// Starts timing.
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(any(feature = "tracing", feature = "metrics"))]
            began: std::time::Instant::now(),
        }
    }

    /// The time since [`start`](Self::start); zero without the features.
    pub(crate) fn elapsed(self) -> Duration {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        return self.began.elapsed();
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        Duration::ZERO
    }
}

/// A counter, gauge or histogram under a static key (name and labels), so
/// nothing is allocated to look the recorder up.
#[cfg(feature = "metrics")]
macro_rules! metric {
    ($register:ident, $name:literal $(, $label:literal => $value:expr)*) => {{
        static LABELS: &[metrics::Label] = &[$(metrics::Label::from_static_parts($label, $value)),*];
        static KEY: metrics::Key = metrics::Key::from_static_parts($name, LABELS);
        static METADATA: metrics::Metadata<'static> =
            metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        metrics::with_recorder(|recorder| recorder.$register(&KEY, &METADATA))
    }};
}

/// The span one store operation runs in: its action, namespace and
/// principal id. Entered by the caller for the operation's transaction.
#[cfg(feature = "tracing")]
pub(crate) fn operation(scope: &ActionScope) -> tracing::span::EnteredSpan {
    tracing::debug_span!(
        "tessera",
        action = scope.action().as_str(),
        namespace = scope.namespace().map(|n| n.as_str()),
        principal = scope.principal.map(|p| p.to_string()),
    )
    .entered()
}

/// Without `tracing`: nothing to enter.
#[cfg(not(feature = "tracing"))]
pub(crate) fn operation(_scope: &ActionScope) -> NoSpan {
    NoSpan
}

/// The span of an operation without `tracing`: nothing.
#[cfg(not(feature = "tracing"))]
pub(crate) struct NoSpan;

/// A claim (or a batch) leased `granted` tasks of `queue`, after waiting
/// `waited` for admission; its lease transaction took `service`.
#[allow(unused_variables)]
pub(crate) fn claim_finished(
    scope: &ActionScope,
    queue: &str,
    granted: usize,
    waited: Duration,
    service: Duration,
) {
    #[cfg(feature = "tracing")]
    if granted > 0 {
        tracing::debug!(
            namespace = scope.namespace().map(|n| n.as_str()),
            queue,
            granted,
            waited_ms = waited.as_millis() as u64,
            "claim granted"
        );
    } else {
        tracing::trace!(
            namespace = scope.namespace().map(|n| n.as_str()),
            queue,
            "claim found the queue empty"
        );
    }
    #[cfg(feature = "metrics")]
    {
        if granted > 0 {
            metric!(register_counter, "tessera_claims_granted_total").increment(granted as u64);
        } else {
            metric!(register_counter, "tessera_claims_empty_total").increment(1);
        }
        metric!(register_histogram, "tessera_claim_wait_seconds").record(waited.as_secs_f64());
        metric!(register_histogram, "tessera_claim_service_seconds").record(service.as_secs_f64());
    }
}

/// The completer committed a batch of `size` acknowledgements.
#[allow(unused_variables)]
pub(crate) fn acks_committed(size: usize) {
    #[cfg(feature = "tracing")]
    tracing::trace!(size, "acknowledgements committed");
    #[cfg(feature = "metrics")]
    metric!(register_histogram, "tessera_ack_batch_size").record(size as f64);
}

/// A claim waits its turn in admission.
#[allow(unused_variables)]
pub(crate) fn claim_queued(scope: &ActionScope, queue: &str) {
    #[cfg(feature = "tracing")]
    tracing::debug!(
        namespace = scope.namespace().map(|n| n.as_str()),
        queue,
        "claim queued for admission"
    );
}

/// Admission turned a claim away: `429`.
#[allow(unused_variables)]
pub(crate) fn claim_rejected(reason: RejectReason) {
    #[cfg(feature = "tracing")]
    tracing::info!(reason = %reason, "claim rejected");
    #[cfg(feature = "metrics")]
    match reason {
        RejectReason::QueueFull => {
            metric!(register_counter, "tessera_claims_rejected_total", "reason" => "queue_full")
                .increment(1);
        }
        RejectReason::WaitExpired => {
            metric!(register_counter, "tessera_claims_rejected_total", "reason" => "wait_expired")
                .increment(1);
        }
        RejectReason::FairShare => {
            metric!(register_counter, "tessera_claims_rejected_total", "reason" => "fair_share")
                .increment(1);
        }
        _ => {
            metric!(register_counter, "tessera_claims_rejected_total", "reason" => "claims_per_minute")
                .increment(1);
        }
    }
}

/// The gate moved: its limit, in-flight and pending claims now, and the
/// limit before (an event when it changed).
#[allow(unused_variables)]
pub(crate) fn gate(before: u32, now: &Stats) {
    #[cfg(feature = "tracing")]
    if before != now.limit {
        tracing::info!(
            from = before,
            to = now.limit,
            latency_average_ms = now.latency_average.map(|l| l.as_secs_f64() * 1e3),
            "claim concurrency limit changed"
        );
    }
    #[cfg(feature = "metrics")]
    {
        metric!(register_gauge, "tessera_claim_limit").set(f64::from(now.limit));
        metric!(register_gauge, "tessera_claim_in_flight").set(f64::from(now.in_flight));
        metric!(register_gauge, "tessera_claim_pending").set(now.pending as f64);
    }
}

/// Storage refused a write for a spent allowance: `503`.
#[allow(unused_variables)]
pub(crate) fn quota_refused(action: Action) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        action = action.as_str(),
        "storage refused a write: quota exhausted"
    );
    #[cfg(feature = "metrics")]
    metric!(register_counter, "tessera_storage_quota_exhausted_total").increment(1);
}

/// A retention run deleted `deleted` expired rows, `tasks_purged` finished
/// tasks among them.
#[allow(unused_variables)]
pub(crate) fn retention_ran(deleted: u64, tasks_purged: u64) {
    #[cfg(feature = "tracing")]
    tracing::info!(deleted, tasks_purged, "retention ran");
    #[cfg(feature = "metrics")]
    {
        metric!(register_counter, "tessera_retention_rows_deleted_total").increment(deleted);
        metric!(register_counter, "tessera_retention_tasks_purged_total").increment(tasks_purged);
    }
}

/// `written` counter rows were flushed.
#[allow(unused_variables)]
pub(crate) fn counters_flushed(written: u64) {
    #[cfg(feature = "tracing")]
    tracing::debug!(written, "counters flushed");
    #[cfg(feature = "metrics")]
    metric!(register_counter, "tessera_counter_rows_written_total").increment(written);
}

/// A shared commit of `batch` operations took `took` (SQLite's group
/// commit).
#[allow(unused_variables)]
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn commit(batch: usize, took: Duration) {
    #[cfg(feature = "tracing")]
    tracing::trace!(batch, took_us = took.as_micros() as u64, "commit");
    #[cfg(feature = "metrics")]
    {
        metric!(register_histogram, "tessera_commit_seconds").record(took.as_secs_f64());
        metric!(register_histogram, "tessera_commit_batch_size").record(batch as f64);
    }
}
