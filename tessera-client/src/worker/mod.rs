//! The remote worker loops: [`Worker`] on threads (feature `blocking`)
//! and [`AsyncWorker`] on tokio (feature `async`), with what they share:
//! their options, stats, stop and failure text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tessera_store::Retry;

use crate::Error;

#[cfg(feature = "async")]
mod tasks;
#[cfg(feature = "blocking")]
mod threads;

#[cfg(feature = "async")]
pub use tasks::AsyncWorker;
#[cfg(feature = "blocking")]
pub use threads::Worker;

/// What a handler's failure is: any error, its text kept as the
/// attempt's last error.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// How a worker loop paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOptions {
    /// The longest single wait: a long-poll on an empty queue, a wait out
    /// of a paused or limited one. It is also about how long
    /// `run` takes to return once stopped. Default 10 s.
    pub wait: Duration,
    /// What a handler's failure asks for. Default [`Retry::Backoff`].
    pub retry: Retry,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(10),
            retry: Retry::Backoff,
        }
    }
}

/// What a worker loop has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerStats {
    /// Tasks whose output was accepted (a replay included).
    pub done: u64,
    /// Tasks whose handler failed and whose failure was reported.
    pub failed: u64,
    /// Tasks whose lease was lost before its submission landed (`409`
    /// or `410`): someone else's now, or finished or cancelled.
    pub lost: u64,
    /// Tasks given up because the worker was stopped while their
    /// submission still waited to be made: their leases lapse.
    pub abandoned: u64,
    /// Empty claims.
    pub empty: u64,
    /// Waits for the server (a `429`, `502`, `503`, `504` or a lost
    /// connection), each followed by the same call again.
    pub retries: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) done: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) empty: AtomicU64,
    pub(crate) retries: AtomicU64,
}

impl Counts {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WorkerStats {
        WorkerStats {
            done: self.done.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
            empty: self.empty.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

/// Stops a running worker loop: each of its threads or tasks finishes
/// the task it holds, and `run` returns within about
/// [`WorkerOptions::wait`].
#[derive(Debug, Clone, Default)]
pub struct Stopper(Arc<AtomicBool>);

impl Stopper {
    /// Asks the worker to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether it was asked to.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why an attempt's settling (submission or failure) did not land.
pub(crate) enum Unsettled {
    /// The lease is gone.
    Lost,
    /// Stopped while waiting to retry.
    Stopped,
    /// A refusal no wait answers.
    Fatal(Error),
}

/// A handler's error as the server keeps it: printable ASCII (others
/// escaped), at most the server's limit on an error's length.
pub fn failure_text(text: &str) -> String {
    let mut escaped: String = text.escape_default().collect();
    let limit = tessera_store::limits::MAX_ERROR_BYTES;
    if escaped.len() > limit {
        let mut end = limit - 3;
        while !escaped.is_char_boundary(end) {
            end -= 1;
        }
        escaped.truncate(end);
        escaped.push_str("...");
    }
    escaped
}

pub(crate) fn random() -> u64 {
    getrandom::u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failures_text_is_printable_and_bounded() {
        assert_eq!(
            failure_text("bad\nthing \u{1F4A5}"),
            "bad\\nthing \\u{1f4a5}"
        );
        let long = failure_text(&"x".repeat(100_000));
        assert!(long.len() <= tessera_store::limits::MAX_ERROR_BYTES);
        assert!(long.ends_with("..."));
    }
}
