//! [`Worker`]: a remote worker loop on threads, over [`Client`].

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use tessera_store::{EmptyReason, Retry, WaitOutcome};

use super::{
    Counts, Expiry, HandlerError, Loop, SLICE, Stopper, Unsettled, WorkerOptions, WorkerStats,
    after_settling_error, failure_text, next_beat, panic_text, random,
};
use crate::calls::ClaimAnswer;
use crate::{Client, Error, pacing, wire};

/// A remote worker: claims tasks from one queue over HTTP and runs
/// `handler` on each, on as many threads as [`run`](Self::run) is given.
///
/// ```no_run
/// use serde_json::json;
/// use tessera_client::{Client, Worker};
///
/// let client = Client::new("http://127.0.0.1:8080", "tsk_…")?; // a key with the claim scope
/// let worker = Worker::new(client, "renders", "frames", |claim| Ok(json!({ "frame": claim.brief_json() })))?;
/// worker.run(4)?; // until worker.stopper().stop()
/// # Ok::<(), tessera_client::Error>(())
/// ```
///
/// Each thread:
/// - claims; an empty queue is long-polled for the `Retry-After` the
///   server gave plus jitter ([`pacing::jittered`]), at most
///   [`WorkerOptions::wait`]; a paused queue or one at its limit is
///   waited out for its `Retry-After` (at most `wait` too), not polled;
///   an empty claim waits at least [`pacing::EMPTY_FLOOR`];
/// - waits out a `408`, `429`, `502`, `503`, `504` or `500
///   storage_error` for its `Retry-After` (a spent storage allowance
///   until its `reset_at`), and a lost connection with a backoff from
///   0.1 s to 5 s ([`pacing::after_error`]), then makes the same call
///   again;
/// - heartbeats the lease every third of the time it has left (sooner
///   after a missed beat) until the submission or failure lands;
/// - submits the handler's output under the lease's idempotency key
///   ([`wire::Lease::idempotency_key`]), retried with the same key after
///   a lost answer, so it lands once; reports a handler's error as a
///   failure ([`WorkerOptions::retry`]);
/// - stops every thread on a refusal no wait answers (a key without the
///   claim scope, say), which [`run`](Self::run) returns.
pub struct Worker<H> {
    client: Client,
    handler: H,
    at: Loop,
}

impl<H> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("client", &self.client)
            .field("ns", &self.at.ns)
            .field("queue", &self.at.queue)
            .field("options", &self.at.options)
            .field("stats", &self.at.counts.snapshot())
            .finish_non_exhaustive()
    }
}

impl<H> Worker<H>
where
    H: Fn(&wire::Claim) -> Result<Value, HandlerError> + Sync,
{
    /// A worker of `queue` in `ns`, with the default [`WorkerOptions`].
    pub fn new(client: Client, ns: &str, queue: &str, handler: H) -> Result<Self, Error> {
        Ok(Self {
            client,
            handler,
            at: Loop::new(ns, queue)?,
        })
    }

    /// The same worker with `options`.
    #[must_use]
    pub fn with_options(mut self, options: WorkerOptions) -> Self {
        self.at.options = options.checked();
        self
    }

    /// What stops it.
    pub fn stopper(&self) -> Stopper {
        self.at.stopper.clone()
    }

    /// What it has done so far.
    pub fn stats(&self) -> WorkerStats {
        self.at.counts.snapshot()
    }

    /// Runs `threads` threads (at least one) until stopped, or until one
    /// meets a refusal no wait answers, which is returned after every
    /// thread has finished its task.
    pub fn run(&self, threads: usize) -> Result<WorkerStats, Error> {
        let fatal = parking_lot::Mutex::new(None::<Error>);
        std::thread::scope(|scope| {
            for _ in 0..threads.max(1) {
                scope.spawn(|| {
                    if let Err(error) = self.work() {
                        fatal.lock().get_or_insert(error);
                        self.at.stopper.stop();
                    }
                });
            }
        });
        match fatal.into_inner() {
            Some(error) => Err(error),
            None => Ok(self.stats()),
        }
    }

    /// One thread's loop.
    fn work(&self) -> Result<(), Error> {
        let mut failures = 0;
        while !self.at.stopper.is_stopped() {
            let answer = match self.client.claim(&self.at.ns, &self.at.queue) {
                Ok(answer) => {
                    failures = 0;
                    answer
                }
                Err(error) => {
                    failures += 1;
                    self.wait_after(&error, failures)?;
                    continue;
                }
            };
            match answer {
                ClaimAnswer::Granted(claim) => self.process(&claim)?,
                ClaimAnswer::Empty {
                    reason,
                    retry_after,
                } => {
                    Counts::add(&self.at.counts.empty);
                    let wait = pacing::jittered(retry_after.max(pacing::EMPTY_FLOOR), random())
                        .min(self.at.options.wait);
                    if reason != EmptyReason::Empty {
                        // Paused or at its limit: waited out, not polled.
                        self.sleep(wait);
                        continue;
                    }
                    // The long-poll answers early when work arrives. One
                    // that ends early without work (a server whose cap
                    // is shorter) is followed by the rest of the wait.
                    let started = Instant::now();
                    match self.client.wait_for_work(&self.at.ns, &self.at.queue, wait) {
                        Ok(WaitOutcome::WorkAvailable) => {}
                        Ok(WaitOutcome::TimedOut) => {
                            self.sleep(wait.saturating_sub(started.elapsed()));
                        }
                        Err(error) => {
                            failures += 1;
                            self.wait_after(&error, failures)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits as `error` asks, or returns it when no wait answers it.
    fn wait_after(&self, error: &Error, failures: u32) -> Result<(), Error> {
        match pacing::after_error(error, Utc::now(), failures, random()) {
            Some(wait) => {
                Counts::add(&self.at.counts.retries);
                self.sleep(wait);
                Ok(())
            }
            None => Err(error.clone()),
        }
    }

    /// Sleeps `wait`, or until stopped.
    fn sleep(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while !self.at.stopper.is_stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(SLICE));
        }
    }

    /// Runs the handler on `claim` under heartbeats, and settles it.
    fn process(&self, claim: &wire::Claim) -> Result<(), Error> {
        let expiry = Expiry::new(claim.lease.expires_at);
        let (done, beating) = mpsc::channel::<()>();
        let outcome = std::thread::scope(|scope| {
            let expiry = &expiry;
            scope.spawn(move || self.heartbeat(&claim.lease, expiry, &beating));
            let outcome = self.settle(claim, expiry);
            drop(done);
            outcome
        });
        match outcome {
            Ok(()) => Ok(()),
            Err(Unsettled::Lost) => {
                Counts::add(&self.at.counts.lost);
                Ok(())
            }
            Err(Unsettled::Stopped) => {
                Counts::add(&self.at.counts.abandoned);
                Ok(())
            }
            Err(Unsettled::Fatal(error) | Unsettled::Refused(error)) => Err(error),
        }
    }

    /// Extends `lease` every third of the time it has left, sooner after
    /// a beat that failed, until `done` closes.
    fn heartbeat(&self, lease: &wire::Lease, expiry: &Expiry, done: &mpsc::Receiver<()>) {
        let mut wait = next_beat(expiry.get(), None);
        let mut failures = 0;
        loop {
            match done.recv_timeout(wait) {
                // Stopped, a handled task's lease is no longer extended: a
                // submission still failing is given up once it lapses.
                Err(mpsc::RecvTimeoutError::Timeout) if expiry.beating(&self.at.stopper) => {}
                _ => return,
            }
            wait = match self.client.heartbeat(lease, None) {
                Ok(extended) => {
                    failures = 0;
                    expiry.set(extended.expires_at);
                    next_beat(extended.expires_at, None)
                }
                // A lost lease shows in the settling's answer.
                Err(error) if error.is_lease_lost() => return,
                Err(error) => {
                    failures += 1;
                    next_beat(expiry.get(), Some((&error, failures)))
                }
            };
        }
    }

    /// The handler's outcome, made to land: its output submitted, or its
    /// failure (an error, a panic, an output the server refuses)
    /// reported.
    fn settle(&self, claim: &wire::Claim, expiry: &Expiry) -> Result<(), Unsettled> {
        let lease = &claim.lease;
        let handled = std::panic::catch_unwind(AssertUnwindSafe(|| (self.handler)(claim)))
            .unwrap_or_else(|panic| Err(panic_text(panic.as_ref()).into()));
        expiry.handled();
        let (retry, error) = match handled {
            Ok(output) => {
                let key = lease.idempotency_key();
                match self.until_landed(expiry, || self.client.submit(lease, &output, &key)) {
                    Ok(_) => {
                        Counts::add(&self.at.counts.done);
                        return Ok(());
                    }
                    // Refused as it is: it would be again, so the task
                    // fails for good rather than be run again.
                    Err(Unsettled::Refused(error)) => (
                        Retry::Never,
                        format!("the server refused the output: {error}"),
                    ),
                    Err(other) => return Err(other),
                }
            }
            Err(error) => (self.at.options.retry, error.to_string()),
        };
        let text = failure_text(&error);
        self.until_landed(expiry, || self.client.fail(lease, retry, Some(&text)))?;
        Counts::add(&self.at.counts.failed);
        Ok(())
    }

    /// Makes `call` until it lands, waiting as each transient error asks.
    fn until_landed<T>(
        &self,
        expiry: &Expiry,
        mut call: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Unsettled> {
        let mut failures = 0;
        loop {
            let error = match call() {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            failures += 1;
            let stopped = self.at.stopper.is_stopped();
            let wait = after_settling_error(error, failures, stopped, expiry)?;
            Counts::add(&self.at.counts.retries);
            // Cut short by a stop only once the lease has lapsed.
            let until = Instant::now() + wait;
            while Instant::now() < until && !(self.at.stopper.is_stopped() && expiry.lapsed()) {
                std::thread::sleep(until.saturating_duration_since(Instant::now()).min(SLICE));
            }
        }
    }
}
