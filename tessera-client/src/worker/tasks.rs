//! [`AsyncWorker`]: the remote worker loop as tokio tasks, over
//! [`AsyncClient`].

use std::future::Future;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tessera_store::{EmptyReason, Retry, WaitOutcome};
use tokio::time::Instant;

use super::{
    Counts, Expiry, HandlerError, Loop, SLICE, Stopper, Unsettled, WorkerOptions, WorkerStats,
    after_settling_error, failure_text, next_beat, panic_text, random,
};
use crate::calls::ClaimAnswer;
use crate::{AsyncClient, Error, pacing, wire};

/// The remote worker loop of [`Worker`](crate::Worker) (feature
/// `blocking`), as tasks on a tokio runtime, with an async handler.
///
/// ```no_run
/// use serde_json::json;
/// use tessera_client::{AsyncClient, AsyncWorker};
///
/// # async fn run(key: String) -> Result<(), tessera_client::Error> {
/// let client = AsyncClient::new("http://127.0.0.1:8080", &key)?;
/// let worker = AsyncWorker::new(client, "renders", "frames", |claim| async move {
///     Ok(json!({ "frame": claim.brief_json() }))
/// })?;
/// worker.run(8).await?; // until worker.stopper().stop()
/// # Ok(()) }
/// ```
///
/// It claims, waits, heartbeats and submits as [`Worker`](crate::Worker)
/// does; each of `run`'s tasks holds one claim at a time, and its
/// heartbeats run beside the handler.
pub struct AsyncWorker<H> {
    client: AsyncClient,
    handler: H,
    at: Loop,
}

impl<H> std::fmt::Debug for AsyncWorker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWorker")
            .field("client", &self.client)
            .field("ns", &self.at.ns)
            .field("queue", &self.at.queue)
            .field("options", &self.at.options)
            .field("stats", &self.at.counts.snapshot())
            .finish_non_exhaustive()
    }
}

impl<H, F> AsyncWorker<H>
where
    H: Fn(wire::Claim) -> F,
    F: Future<Output = Result<Value, HandlerError>>,
{
    /// A worker of `queue` in `ns`, with the default [`WorkerOptions`].
    pub fn new(client: AsyncClient, ns: &str, queue: &str, handler: H) -> Result<Self, Error> {
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

    /// Runs `tasks` loops at once (at least one), on the current task,
    /// until stopped or until one meets a refusal no wait answers, which
    /// is returned once every loop has finished its task.
    pub async fn run(&self, tasks: usize) -> Result<WorkerStats, Error> {
        let loops = (0..tasks.max(1)).map(|_| async {
            let outcome = self.work().await;
            if outcome.is_err() {
                self.at.stopper.stop();
            }
            outcome
        });
        let outcomes = join_all(loops.collect()).await;
        match outcomes.into_iter().find_map(Result::err) {
            Some(error) => Err(error),
            None => Ok(self.stats()),
        }
    }

    async fn work(&self) -> Result<(), Error> {
        let mut failures = 0;
        while !self.at.stopper.is_stopped() {
            let answer = match self.client.claim(&self.at.ns, &self.at.queue).await {
                Ok(answer) => {
                    failures = 0;
                    answer
                }
                Err(error) => {
                    failures += 1;
                    self.wait_after(&error, failures).await?;
                    continue;
                }
            };
            match answer {
                ClaimAnswer::Granted(claim) => self.process(claim).await?,
                ClaimAnswer::Empty {
                    reason,
                    retry_after,
                } => {
                    Counts::add(&self.at.counts.empty);
                    let wait = pacing::jittered(retry_after.max(pacing::EMPTY_FLOOR), random())
                        .min(self.at.options.wait);
                    if reason != EmptyReason::Empty {
                        self.sleep(wait).await;
                        continue;
                    }
                    let started = Instant::now();
                    match self
                        .client
                        .wait_for_work(&self.at.ns, &self.at.queue, wait)
                        .await
                    {
                        Ok(WaitOutcome::WorkAvailable) => {}
                        Ok(WaitOutcome::TimedOut) => {
                            self.sleep(wait.saturating_sub(started.elapsed())).await;
                        }
                        Err(error) => {
                            failures += 1;
                            self.wait_after(&error, failures).await?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn wait_after(&self, error: &Error, failures: u32) -> Result<(), Error> {
        match pacing::after_error(error, Utc::now(), failures, random()) {
            Some(wait) => {
                Counts::add(&self.at.counts.retries);
                self.sleep(wait).await;
                Ok(())
            }
            None => Err(error.clone()),
        }
    }

    /// Sleeps `wait`, or until stopped.
    async fn sleep(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while !self.at.stopper.is_stopped() && Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(SLICE)).await;
        }
    }

    /// Runs the handler on `claim` and settles it, heartbeating the lease
    /// until it is settled.
    async fn process(&self, claim: wire::Claim) -> Result<(), Error> {
        let lease = claim.lease.clone();
        let expiry = Expiry::new(lease.expires_at);
        let settle = self.settle(claim, &expiry);
        tokio::pin!(settle);
        let mut wait = next_beat(expiry.get(), None);
        let mut failures = 0;
        let mut beating = true;
        let outcome = loop {
            tokio::select! {
                outcome = &mut settle => break outcome,
                () = tokio::time::sleep(wait), if beating && expiry.beating(&self.at.stopper) => {
                    // A beat runs beside the settling, not before it.
                    let beat = self.client.heartbeat(&lease, None);
                    tokio::pin!(beat);
                    tokio::select! {
                        outcome = &mut settle => break outcome,
                        result = &mut beat => match result {
                            Ok(extended) => {
                                failures = 0;
                                expiry.set(extended.expires_at);
                                wait = next_beat(extended.expires_at, None);
                            }
                            // A lost lease shows in the settling's answer.
                            Err(error) if error.is_lease_lost() => beating = false,
                            Err(error) => {
                                failures += 1;
                                wait = next_beat(expiry.get(), Some((&error, failures)));
                            }
                        },
                    }
                }
            }
        };
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

    /// The handler's outcome, made to land: its output submitted, or its
    /// failure (an error, an output the server refuses) reported.
    async fn settle(&self, claim: wire::Claim, expiry: &Expiry) -> Result<(), Unsettled> {
        let lease = claim.lease.clone();
        let handled = Unwinding(Box::pin((self.handler)(claim)))
            .await
            .unwrap_or_else(|panic| Err(panic_text(panic.as_ref()).into()));
        expiry.handled();
        let (retry, error) = match handled {
            Ok(output) => {
                let key = lease.idempotency_key();
                let mut failures = 0;
                loop {
                    let error = match self.client.submit(&lease, &output, &key).await {
                        Ok(_) => {
                            Counts::add(&self.at.counts.done);
                            return Ok(());
                        }
                        Err(error) => error,
                    };
                    failures += 1;
                    let stopped = self.at.stopper.is_stopped();
                    match after_settling_error(error, failures, stopped, expiry) {
                        Ok(wait) => self.pause(wait, expiry).await,
                        // Refused as it is: the task fails for good.
                        Err(Unsettled::Refused(error)) => {
                            break (
                                Retry::Never,
                                format!("the server refused the output: {error}"),
                            );
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            Err(error) => (self.at.options.retry, error.to_string()),
        };
        let text = failure_text(&error);
        let mut failures = 0;
        loop {
            let error = match self.client.fail(&lease, retry, Some(&text)).await {
                Ok(_) => {
                    Counts::add(&self.at.counts.failed);
                    return Ok(());
                }
                Err(error) => error,
            };
            failures += 1;
            let stopped = self.at.stopper.is_stopped();
            let wait = after_settling_error(error, failures, stopped, expiry)?;
            self.pause(wait, expiry).await;
        }
    }

    /// A wait before a settling call is made again, cut short by a stop
    /// only once the lease has lapsed.
    async fn pause(&self, wait: Duration, expiry: &Expiry) {
        Counts::add(&self.at.counts.retries);
        let until = Instant::now() + wait;
        while Instant::now() < until && !(self.at.stopper.is_stopped() && expiry.lapsed()) {
            tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(SLICE)).await;
        }
    }
}

/// A future whose panic is caught: a handler's panic is its task's
/// failure, not the end of the loop.
struct Unwinding<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for Unwinding<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(context))) {
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

/// Every future of `futures` run to its end, concurrently on the calling
/// task, their outputs in order.
async fn join_all<T, F: Future<Output = T>>(futures: Vec<F>) -> Vec<T> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("each future ended"))
        .collect()
}
