//! [`AsyncClient`]: the calls as futures on tokio, over hyper.

use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tessera_store::{IdempotencyKey, Namespace, QueueName, Retry, TaskState, WaitOutcome};

use crate::calls::{self, Accepted, Call, ClaimAnswer, Reply};
use crate::{ClientConfig, Error, wire};

/// The same calls as [`Client`](crate::Client), as futures on a tokio
/// runtime. Cheap to clone (clones share their connections).
#[derive(Debug, Clone)]
pub struct AsyncClient {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    config: ClientConfig,
}

impl AsyncClient {
    /// A client of the server at `base_url` under the API key `key`, with
    /// the default [`ClientConfig`].
    pub fn new(base_url: &str, key: &str) -> Result<Self, Error> {
        Ok(Self::with_config(ClientConfig::new(base_url, key)?))
    }

    /// A client with `config`.
    pub fn with_config(config: ClientConfig) -> Self {
        let http = HyperClient::builder(TokioExecutor::new()).build_http();
        Self { http, config }
    }

    /// The configuration it calls with.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    async fn send(&self, call: Call) -> Result<Reply, Error> {
        let url = self.config.url(&call.path);
        let limit = call.limit(&self.config);
        let mut request = http::Request::builder()
            .method(call.verb.as_str())
            .uri(&url)
            .header(http::header::AUTHORIZATION, self.config.authorization())
            .header(http::header::USER_AGENT, crate::USER_AGENT);
        if call.body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(key) = &call.idempotency_key {
            request = request.header(wire::IDEMPOTENCY_KEY, key);
        }
        let request = request
            .body(Full::new(Bytes::from(call.body.unwrap_or_default())))
            .map_err(|error| Error::InvalidInput {
                reason: format!("a request to {url}: {error}"),
            })?;
        let exchange = async {
            let response = self.http.request(request).await.map_err(transport)?;
            let (parts, body) = response.into_parts();
            let status = parts.status.as_u16();
            let body = Limited::new(body, crate::MAX_ANSWER_BYTES as usize)
                .collect()
                .await
                .map_err(|error| {
                    if error.downcast_ref::<LengthLimitError>().is_some() {
                        // Too large is no transport fault.
                        Error::Unexpected {
                            status,
                            message: format!(
                                "the answer is over {} bytes",
                                crate::MAX_ANSWER_BYTES
                            ),
                            retry_after: None,
                        }
                    } else {
                        transport(error)
                    }
                })?
                .to_bytes();
            Ok::<_, Error>((parts, body))
        };
        let (parts, body) =
            tokio::time::timeout(limit, exchange)
                .await
                .map_err(|_| Error::Transport {
                    message: format!("no answer within {limit:?}"),
                })??;
        let header = |name: &str| {
            (parts.headers.get(name)).and_then(|value| value.to_str().ok().map(str::to_owned))
        };
        Ok(Reply {
            status: parts.status.as_u16(),
            retry_after: header("retry-after")
                .as_deref()
                .and_then(Reply::retry_after_header),
            empty_reason: header(wire::EMPTY_REASON),
            replayed: header(wire::REPLAYED).as_deref() == Some("true"),
            body: body.to_vec(),
        })
    }

    /// Enqueue one task (`201`; `200` for a unique task already there).
    pub async fn enqueue(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        task: &wire::NewTask,
    ) -> Result<wire::EnqueuedTask, Error> {
        calls::enqueued(&self.send(calls::enqueue(ns, queue, task)?).await?)
    }

    /// Enqueue up to 1,000 tasks as one transaction.
    pub async fn enqueue_batch(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        tasks: &[wire::NewTask],
    ) -> Result<Vec<wire::EnqueuedTask>, Error> {
        calls::enqueued_batch(&self.send(calls::enqueue_batch(ns, queue, tasks)?).await?)
    }

    /// Claim the next task.
    pub async fn claim(
        &self,
        ns: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimAnswer<wire::Claim>, Error> {
        calls::claimed(&self.send(calls::claim(ns, queue)).await?)
    }

    /// Claim up to `count` tasks as one turn of admission.
    pub async fn claim_batch(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        count: usize,
    ) -> Result<ClaimAnswer<Vec<wire::Claim>>, Error> {
        calls::claimed_batch(&self.send(calls::claim_batch(ns, queue, count)?).await?)
    }

    /// Long-poll for claimable work, at most `timeout`.
    pub async fn wait_for_work(
        &self,
        ns: &Namespace,
        queue: &QueueName,
        timeout: Duration,
    ) -> Result<WaitOutcome, Error> {
        calls::waited(&self.send(calls::wait(ns, queue, timeout)?).await?)
    }

    /// Extend `lease`, optionally with progress.
    pub async fn heartbeat(
        &self,
        lease: &wire::Lease,
        progress: Option<&Value>,
    ) -> Result<wire::Lease, Error> {
        calls::extended(&self.send(calls::heartbeat(lease, progress)?).await?)
    }

    /// Submit `output` under `lease` with the idempotency key `key`.
    pub async fn submit(
        &self,
        lease: &wire::Lease,
        output: &Value,
        key: &IdempotencyKey,
    ) -> Result<Accepted, Error> {
        calls::accepted(&self.send(calls::submit(lease, output, key)?).await?)
    }

    /// Report that the attempt under `lease` failed.
    pub async fn fail(
        &self,
        lease: &wire::Lease,
        retry: Retry,
        error: Option<&str>,
    ) -> Result<TaskState, Error> {
        calls::new_state(&self.send(calls::fail(lease, retry, error)?).await?)
    }

    /// Hand the task back, claimable again after `delay`.
    pub async fn snooze(&self, lease: &wire::Lease, delay: Duration) -> Result<TaskState, Error> {
        calls::new_state(&self.send(calls::snooze(lease, delay)?).await?)
    }
}

fn transport(error: impl std::fmt::Display) -> Error {
    Error::Transport {
        message: error.to_string(),
    }
}
