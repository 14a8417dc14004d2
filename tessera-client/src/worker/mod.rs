//! The remote worker loops: [`Worker`] on threads (feature `blocking`)
//! and [`AsyncWorker`] on tokio (feature `async`), with what they share:
//! their options, stats, stop and failure text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::Retry;

use crate::{Error, pacing};

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
    /// of a paused or limited one (the server's `Retry-After` there grows
    /// to a minute; this bounds how late a resumed queue is noticed). It
    /// is also about how long `run` takes to return once stopped, beyond
    /// a call in flight (which ends within its timeout) and a task held.
    /// Default 10 s; at least [`MIN_WAIT`].
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

/// How often a sleeping loop looks at its stop.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// What both worker loops hold besides their client and handler: the
/// queue they work, their options, their stop and their counts.
#[derive(Debug)]
pub(crate) struct Loop {
    pub(crate) ns: tessera_store::Namespace,
    pub(crate) queue: tessera_store::QueueName,
    pub(crate) options: WorkerOptions,
    pub(crate) stopper: Stopper,
    pub(crate) counts: Arc<Counts>,
}

impl Loop {
    /// A loop of `queue` in `ns`, with the default [`WorkerOptions`].
    pub(crate) fn new(ns: &str, queue: &str) -> Result<Self, Error> {
        let invalid = |error: tessera_store::LeaseError| Error::InvalidInput {
            reason: error.to_string(),
        };
        Ok(Self {
            ns: tessera_store::Namespace::parse(ns).map_err(invalid)?,
            queue: tessera_store::QueueName::parse(queue).map_err(invalid)?,
            options: WorkerOptions::default(),
            stopper: Stopper::new(),
            counts: Arc::default(),
        })
    }
}

/// The shortest [`WorkerOptions::wait`]: a shorter one is taken as this.
pub const MIN_WAIT: Duration = Duration::from_millis(100);

impl WorkerOptions {
    /// The options with `wait` at least [`MIN_WAIT`].
    pub(crate) fn checked(mut self) -> Self {
        self.wait = self.wait.max(MIN_WAIT);
        self
    }
}

/// What a worker loop has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerStats {
    /// Tasks whose output was accepted (a replay included).
    pub done: u64,
    /// Tasks whose handler failed (an error or a panic), or whose output
    /// the server refused as invalid, and whose failure was reported.
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
/// the task it holds (its handler heartbeated to the end, its submission
/// retried while its lease lasts), and `run` returns within about
/// [`WorkerOptions::wait`] after that, or after a call in flight ends. A
/// stopped worker stays stopped: `run` again returns at once.
#[derive(Debug, Clone)]
pub struct Stopper(Arc<AtomicBool>);

impl Stopper {
    pub(crate) fn new() -> Self {
        Self(Arc::default())
    }

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
    /// Stopped while waiting to retry, and the lease has lapsed.
    Stopped,
    /// The server refused the request itself (`400`, `413`): made again,
    /// it is refused again.
    Refused(Error),
    /// A refusal no wait answers.
    Fatal(Error),
}

/// The latest expiry of a held lease, as its heartbeats extend it, and
/// whether its handler has finished.
#[derive(Debug)]
pub(crate) struct Expiry(AtomicI64, AtomicBool);

impl Expiry {
    pub(crate) fn new(at: DateTime<Utc>) -> Self {
        Self(
            AtomicI64::new(at.timestamp_millis()),
            AtomicBool::new(false),
        )
    }

    pub(crate) fn set(&self, at: DateTime<Utc>) {
        self.0.fetch_max(at.timestamp_millis(), Ordering::Relaxed);
    }

    /// The handler has finished: only its settling is left.
    pub(crate) fn handled(&self) {
        self.1.store(true, Ordering::SeqCst);
    }

    /// Whether heartbeats go on: always while the handler runs, and once
    /// it has finished, until the worker is stopped (then a settling that
    /// keeps failing is given up when the lease lapses).
    pub(crate) fn beating(&self, stopper: &Stopper) -> bool {
        !(self.1.load(Ordering::SeqCst) && stopper.is_stopped())
    }

    /// Whether it has passed.
    pub(crate) fn lapsed(&self) -> bool {
        self.get() <= Utc::now()
    }

    pub(crate) fn get(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0.load(Ordering::Relaxed)).unwrap_or_default()
    }
}

/// What follows a settling call's (a submission's or failure's) `error`,
/// the `failures`-th in a row: a wait before making it again, or why it
/// will not land. Stopped, a call is made again only while its lease
/// lasts.
pub(crate) fn after_settling_error(
    error: Error,
    failures: u32,
    stopped: bool,
    expiry: &Expiry,
) -> Result<Duration, Unsettled> {
    if error.is_lease_lost() {
        return Err(Unsettled::Lost);
    }
    if error.is_invalid_request() {
        return Err(Unsettled::Refused(error));
    }
    let now = Utc::now();
    let Some(wait) = pacing::after_error(&error, now, failures, random()) else {
        return Err(Unsettled::Fatal(error));
    };
    if stopped && expiry.get() <= now {
        return Err(Unsettled::Stopped);
    }
    Ok(wait)
}

/// The wait before the next heartbeat of a lease that expires at
/// `expires_at`, after a beat that `failed` (the `failures`-th in a
/// row) or not.
pub(crate) fn next_beat(expires_at: DateTime<Utc>, failed: Option<(&Error, u32)>) -> Duration {
    let now = Utc::now();
    let left = (expires_at - now).to_std().unwrap_or_default();
    let every = pacing::heartbeat_every(left);
    match failed {
        None => every,
        Some((error, failures)) => pacing::after_error(error, now, failures, random())
            .unwrap_or(every)
            .min(every),
    }
}

/// A handler's panic as a failure's text.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let message = (panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned());
    format!("the handler panicked: {message}")
}

/// A handler's error as the server keeps it: printable ASCII (others
/// escaped), at most the server's limit on an error's length.
pub fn failure_text(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        if matches!(character, ' '..='~') {
            escaped.push(character);
        } else {
            escaped.extend(character.escape_default());
        }
    }
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
            failure_text("it's bad\nthing \u{1F4A5}"),
            "it's bad\\nthing \\u{1f4a5}"
        );
        let long = failure_text(&"x".repeat(100_000));
        assert!(long.len() <= tessera_store::limits::MAX_ERROR_BYTES);
        assert!(long.ends_with("..."));
    }
}
