//! [`Client`]: the calls on the caller's thread, over ureq.

use std::time::Duration;

use serde_json::Value;
use tessera_store::{IdempotencyKey, Namespace, QueueName, Retry, TaskState, WaitOutcome};
use ureq::http::Request as HttpRequest;

use crate::calls::{self, Accepted, Call, ClaimAnswer, Reply};
use crate::{ClientConfig, Error, wire};

/// A client of one `tessera-server` under one key: each method one
/// route, on the caller's thread. Cheap to clone (clones share their
/// connections) and safe to share between threads.
#[derive(Debug, Clone)]
pub struct Client {
    agent: ureq::Agent,
    config: ClientConfig,
}

impl Client {
    /// A client of the server at `base_url` (`http://host:port`, with or
    /// without a path prefix) under the API key `key`, with the default
    /// [`ClientConfig`].
    pub fn new(base_url: &str, key: &str) -> Result<Self, Error> {
        Ok(Self::with_config(ClientConfig::new(base_url, key)?))
    }

    /// A client with `config`.
    pub fn with_config(config: ClientConfig) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(crate::USER_AGENT)
            .build()
            .into();
        Self { agent, config }
    }

    /// The configuration it calls with.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn send(&self, call: Call) -> Result<Reply, Error> {
        let url = self.config.url(&call.path);
        let limit = call.limit(&self.config);
        let mut request = HttpRequest::builder()
            .method(call.verb.as_str())
            .uri(&url)
            .header("authorization", self.config.authorization());
        if call.body.is_some() {
            request = request.header("content-type", "application/json");
        }
        if let Some(key) = &call.idempotency_key {
            request = request.header(wire::IDEMPOTENCY_KEY, key);
        }
        let request = request
            .body(call.body.unwrap_or_default())
            .map_err(|error| Error::InvalidInput {
                reason: format!("a request to {url}: {error}"),
            })?;
        let request = self
            .agent
            .configure_request(request)
            .timeout_global(Some(limit))
            .build();
        let mut response = self.agent.run(request).map_err(transport)?;
        let header = |name: &str| {
            (response.headers().get(name)).and_then(|value| value.to_str().ok().map(str::to_owned))
        };
        let mut reply = Reply {
            status: response.status().as_u16(),
            retry_after: header("retry-after")
                .as_deref()
                .and_then(Reply::retry_after_header),
            empty_reason: header(wire::EMPTY_REASON),
            replayed: header(wire::REPLAYED).as_deref() == Some("true"),
            body: Vec::new(),
        };
        reply.body = (response.body_mut().with_config())
            .limit(crate::MAX_ANSWER_BYTES)
            .read_to_vec()
            .map_err(|error| match error {
                // Too large is no transport fault: asked again, it would be
                // again.
                ureq::Error::BodyExceedsLimit(_) => too_large(reply.status),
                other => transport(other),
            })?;
        Ok(reply)
    }

    /// Enqueue one task (`201`; `200` for a unique task already there,
    /// with `created: false`).
    pub fn enqueue(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        task: &wire::NewTask,
    ) -> Result<wire::EnqueuedTask, Error> {
        calls::enqueued(&self.send(calls::enqueue(ns, queue, task)?)?)
    }

    /// Enqueue up to 1,000 tasks as one transaction.
    pub fn enqueue_batch(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        tasks: &[wire::NewTask],
    ) -> Result<Vec<wire::EnqueuedTask>, Error> {
        calls::enqueued_batch(&self.send(calls::enqueue_batch(ns, queue, tasks)?)?)
    }

    /// Claim the next task, waiting for admission as the server does.
    pub fn claim(
        &self,
        ns: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimAnswer<wire::Claim>, Error> {
        calls::claimed(&self.send(calls::claim(ns, queue))?)
    }

    /// Claim up to `count` tasks as one turn of admission.
    pub fn claim_batch(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        count: usize,
    ) -> Result<ClaimAnswer<Vec<wire::Claim>>, Error> {
        calls::claimed_batch(&self.send(calls::claim_batch(ns, queue, count)?)?)
    }

    /// Long-poll: answers when the queue has claimable work, or after
    /// `timeout` (or the server's own cap).
    pub fn wait_for_work(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        timeout: Duration,
    ) -> Result<WaitOutcome, Error> {
        calls::waited(&self.send(calls::wait(ns, queue, timeout)?)?)
    }

    /// Extend `lease`, optionally with progress; the lease as it now
    /// stands.
    pub fn heartbeat(
        &self,
        lease: &wire::Lease,
        progress: Option<&Value>,
    ) -> Result<wire::Lease, Error> {
        calls::extended(&self.send(calls::heartbeat(lease, progress)?)?)
    }

    /// Submit `output` under `lease` with the idempotency key `key`: the
    /// same key and output replay the receipt, so a submission whose
    /// answer was lost is retried with the same key.
    pub fn submit(
        &self,
        lease: &wire::Lease,
        output: &Value,
        key: &IdempotencyKey,
    ) -> Result<Accepted, Error> {
        calls::accepted(&self.send(calls::submit(lease, output, key)?)?)
    }

    /// Report that the attempt under `lease` failed; the task's state
    /// now.
    pub fn fail(
        &self,
        lease: &wire::Lease,
        retry: Retry,
        error: Option<&str>,
    ) -> Result<TaskState, Error> {
        calls::new_state(&self.send(calls::fail(lease, retry, error)?)?)
    }

    /// Hand the task back, claimable again after `delay`, without
    /// spending a try.
    pub fn snooze(&self, lease: &wire::Lease, delay: Duration) -> Result<TaskState, Error> {
        calls::new_state(&self.send(calls::snooze(lease, delay)?)?)
    }
}

fn too_large(status: u16) -> Error {
    Error::Unexpected {
        status,
        message: format!("the answer is over {} bytes", crate::MAX_ANSWER_BYTES),
        retry_after: None,
    }
}

fn transport(error: ureq::Error) -> Error {
    Error::Transport {
        message: error.to_string(),
    }
}
