//! [`Worker`]: a remote worker loop on threads, over [`Client`].

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use tessera_store::{EmptyReason, Namespace, QueueName};

use super::{
    Counts, HandlerError, Stopper, Unsettled, WorkerOptions, WorkerStats, failure_text, random,
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
///   waited out for its `Retry-After`, not polled;
/// - waits out a `429`, `502`, `503` or `504` for its `Retry-After` (a
///   spent storage allowance until its `reset_at`), and a lost connection
///   with a backoff from 0.1 s to 5 s ([`pacing::after_error`]), then
///   makes the same call again;
/// - heartbeats the lease every third of its granted length until the
///   submission or failure lands;
/// - submits the handler's output under the lease's idempotency key
///   ([`wire::Lease::idempotency_key`]), retried with the same key after
///   a lost answer, so it lands once; reports a handler's error as a
///   failure ([`WorkerOptions::retry`]);
/// - stops every thread on a refusal no wait answers (a key without the
///   claim scope, say), which [`run`](Self::run) returns.
#[derive(Debug)]
pub struct Worker<H> {
    client: Client,
    ns: Namespace,
    queue: QueueName,
    handler: H,
    options: WorkerOptions,
    stopper: Stopper,
    counts: Arc<Counts>,
}

impl<H> Worker<H>
where
    H: Fn(&wire::Claim) -> Result<Value, HandlerError> + Sync,
{
    /// A worker of `queue` in `ns`, with the default [`WorkerOptions`].
    pub fn new(client: Client, ns: &str, queue: &str, handler: H) -> Result<Self, Error> {
        let invalid = |error: tessera_store::LeaseError| Error::InvalidInput {
            reason: error.to_string(),
        };
        Ok(Self {
            client,
            ns: Namespace::parse(ns).map_err(invalid)?,
            queue: QueueName::parse(queue).map_err(invalid)?,
            handler,
            options: WorkerOptions::default(),
            stopper: Stopper::default(),
            counts: Arc::default(),
        })
    }

    /// The same worker with `options`.
    #[must_use]
    pub fn with_options(mut self, options: WorkerOptions) -> Self {
        self.options = options;
        self
    }

    /// What stops it.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// What it has done so far.
    pub fn stats(&self) -> WorkerStats {
        self.counts.snapshot()
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
                        self.stopper.stop();
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
        while !self.stopper.is_stopped() {
            let answer = match self.client.claim(&self.ns, &self.queue) {
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
                    Counts::add(&self.counts.empty);
                    let wait = pacing::jittered(retry_after, random()).min(self.options.wait);
                    if reason == EmptyReason::Empty {
                        // The long-poll answers early when work arrives;
                        // a failed one is just a shorter wait.
                        if let Err(error) = self.client.wait_for_work(&self.ns, &self.queue, wait) {
                            failures += 1;
                            self.wait_after(&error, failures)?;
                        }
                    } else {
                        self.sleep(wait);
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
                Counts::add(&self.counts.retries);
                self.sleep(wait);
                Ok(())
            }
            None => Err(error.clone()),
        }
    }

    /// Sleeps `wait`, or until stopped.
    fn sleep(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while !self.stopper.is_stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// Runs the handler on `claim` under heartbeats, and settles it.
    fn process(&self, claim: &wire::Claim) -> Result<(), Error> {
        let (done, beating) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            scope.spawn(move || self.heartbeat(&claim.lease, &beating));
            let outcome = self.settle(claim);
            drop(done);
            match outcome {
                Ok(()) => Ok(()),
                Err(Unsettled::Lost) => {
                    Counts::add(&self.counts.lost);
                    Ok(())
                }
                Err(Unsettled::Stopped) => {
                    Counts::add(&self.counts.abandoned);
                    Ok(())
                }
                Err(Unsettled::Fatal(error)) => Err(error),
            }
        })
    }

    /// Extends `lease` every third of its length until `done` closes.
    fn heartbeat(&self, lease: &wire::Lease, done: &mpsc::Receiver<()>) {
        let every = pacing::heartbeat_every(lease.length());
        loop {
            match done.recv_timeout(every) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            match self.client.heartbeat(lease, None) {
                // A lost lease shows in the submission's answer.
                Err(error) if error.is_lease_lost() => return,
                // A missed beat is tried again at the next.
                Ok(_) | Err(_) => {}
            }
        }
    }

    /// The handler's outcome, made to land: its output submitted, or its
    /// failure reported.
    fn settle(&self, claim: &wire::Claim) -> Result<(), Unsettled> {
        let lease = &claim.lease;
        match (self.handler)(claim) {
            Ok(output) => {
                let key = lease.idempotency_key();
                self.until_landed(|| self.client.submit(lease, &output, &key))?;
                Counts::add(&self.counts.done);
            }
            Err(error) => {
                let text = failure_text(&error.to_string());
                let retry = self.options.retry;
                self.until_landed(|| self.client.fail(lease, retry, Some(&text)))?;
                Counts::add(&self.counts.failed);
            }
        }
        Ok(())
    }

    /// Makes `call` until it lands, waiting as each transient error asks.
    fn until_landed<T>(&self, mut call: impl FnMut() -> Result<T, Error>) -> Result<T, Unsettled> {
        let mut failures = 0;
        loop {
            let error = match call() {
                Ok(answer) => return Ok(answer),
                Err(error) if error.is_lease_lost() => return Err(Unsettled::Lost),
                Err(error) => error,
            };
            if self.stopper.is_stopped() {
                return Err(Unsettled::Stopped);
            }
            failures += 1;
            let Some(wait) = pacing::after_error(&error, Utc::now(), failures, random()) else {
                return Err(Unsettled::Fatal(error));
            };
            Counts::add(&self.counts.retries);
            self.sleep(wait);
        }
    }
}
