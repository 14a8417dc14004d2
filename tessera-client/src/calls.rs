//! Each call as data, without I/O: the request it makes ([`Call`]) and
//! how its answer reads ([`Reply`]). The blocking and async clients send
//! the same calls and read the same replies; only the transport differs.

#![cfg_attr(
    not(any(feature = "blocking", feature = "async")),
    allow(dead_code, unused_imports)
)]

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tessera_store::error::ErrorBody;
use tessera_store::{
    EmptyReason, Enqueued, IdempotencyKey, Namespace, QueueName, Retry, TaskState, WaitOutcome,
};

use crate::Error;
use crate::wire::{self, Endpoint, Verb};

/// A request, ready for a transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    /// The method.
    pub(crate) verb: Verb,
    /// The path and query, from the base URL's root.
    pub(crate) path: String,
    /// The idempotency key header, for a submission.
    pub(crate) idempotency_key: Option<String>,
    /// The JSON body.
    pub(crate) body: Option<Vec<u8>>,
    /// How long the server may hold the call on purpose (a long-poll's
    /// timeout), added to the client's own timeout.
    pub(crate) held: Duration,
    /// Whether the server may hold it for admission (a claim), for up to
    /// [`ClientConfig::claim_wait`](crate::ClientConfig::claim_wait) more.
    pub(crate) admitted: bool,
}

impl Call {
    /// How long the call may take before it is a transport error.
    pub(crate) fn limit(&self, config: &crate::ClientConfig) -> Duration {
        let admission = if self.admitted {
            config.claim_wait
        } else {
            Duration::ZERO
        };
        config.timeout + self.held + admission
    }
}

/// An answer, as a transport read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Reply {
    /// The status.
    pub(crate) status: u16,
    /// `Retry-After`, in whole seconds.
    pub(crate) retry_after: Option<Duration>,
    /// [`wire::EMPTY_REASON`].
    pub(crate) empty_reason: Option<String>,
    /// [`wire::REPLAYED`] was `true`.
    pub(crate) replayed: bool,
    /// The body.
    pub(crate) body: Vec<u8>,
}

impl Reply {
    /// `Retry-After` read from its header text: whole seconds (an HTTP
    /// date is not one the server sends, and reads as none).
    pub(crate) fn retry_after_header(text: &str) -> Option<Duration> {
        (text.trim().parse::<u64>().ok())
            .map(|seconds| Duration::from_secs(seconds).min(crate::pacing::LONGEST_WAIT))
    }
}

/// What a claim came to.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimAnswer<T> {
    /// Granted: one claim, or a batch's claims.
    Granted(T),
    /// Nothing granted (`204`).
    Empty {
        /// Why: nothing claimable, the queue paused, or at its limit.
        reason: EmptyReason,
        /// How long the server asks the caller to wait before claiming
        /// again (idle pacing).
        retry_after: Duration,
    },
}

/// An accepted submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The receipt.
    pub receipt: wire::Receipt,
    /// Whether the server replayed a receipt it had (the same key and
    /// output were accepted before).
    pub replayed: bool,
}

/// `value` as a request body, refused when it does not encode or is over
/// the server's [`MAX_BODY_BYTES`](wire::MAX_BODY_BYTES).
fn json(value: &impl Serialize) -> Result<Vec<u8>, Error> {
    let body = serde_json::to_vec(value).map_err(|error| Error::InvalidInput {
        reason: format!("the body does not encode as JSON: {error}"),
    })?;
    if body.len() > wire::MAX_BODY_BYTES {
        return Err(Error::InvalidInput {
            reason: format!(
                "the body is {} bytes, over the server's limit of {}",
                body.len(),
                wire::MAX_BODY_BYTES
            ),
        });
    }
    Ok(body)
}

fn call(endpoint: Endpoint, values: &[&str], body: Option<Vec<u8>>) -> Call {
    Call {
        verb: endpoint.verb,
        path: endpoint.fill(values),
        idempotency_key: None,
        body,
        held: Duration::ZERO,
        admitted: false,
    }
}

/// `reply` read as a `T` when its status is one of `ok`, else as the
/// error it is.
fn answer<T: DeserializeOwned>(reply: &Reply, ok: &[u16]) -> Result<T, Error> {
    if ok.contains(&reply.status) {
        return serde_json::from_slice(&reply.body).map_err(|error| Error::Unexpected {
            status: reply.status,
            message: format!("the answer does not read as the route's: {error}"),
            retry_after: None,
        });
    }
    Err(refusal(reply))
}

/// The error a non-success `reply` is.
pub(crate) fn refusal(reply: &Reply) -> Error {
    match serde_json::from_slice::<ErrorBody>(&reply.body) {
        Ok(body) => Error::Refused {
            status: reply.status,
            detail: body.error,
        },
        Err(_) => Error::Unexpected {
            status: reply.status,
            message: String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)]).into_owned(),
            retry_after: reply.retry_after,
        },
    }
}

pub(crate) fn enqueue(
    ns: &Namespace,
    queue: &QueueName,
    task: &wire::NewTask,
) -> Result<Call, Error> {
    Ok(call(
        wire::ENQUEUE,
        &[ns.as_str(), queue.as_str()],
        Some(json(task)?),
    ))
}

pub(crate) fn enqueued(reply: &Reply) -> Result<wire::EnqueuedTask, Error> {
    answer(reply, &[200, 201])
}

pub(crate) fn enqueue_batch(
    ns: &Namespace,
    queue: &QueueName,
    tasks: &[wire::NewTask],
) -> Result<Call, Error> {
    #[derive(Serialize)]
    struct Tasks<'a> {
        tasks: &'a [wire::NewTask],
    }
    Ok(call(
        wire::ENQUEUE_BATCH,
        &[ns.as_str(), queue.as_str()],
        Some(json(&Tasks { tasks })?),
    ))
}

pub(crate) fn enqueued_batch(reply: &Reply) -> Result<Vec<wire::EnqueuedTask>, Error> {
    let enqueued: Vec<Enqueued> = answer(reply, &[201])?;
    Ok(enqueued
        .into_iter()
        .map(|each| wire::EnqueuedTask {
            namespace: each.task.namespace,
            id: each.task.id,
            version: each.task.version,
            created: each.created,
        })
        .collect())
}

pub(crate) fn claim(ns: &Namespace, queue: &QueueName) -> Call {
    let mut call = call(wire::CLAIM, &[ns.as_str(), queue.as_str()], None);
    call.admitted = true;
    call
}

fn empty(reply: &Reply) -> Option<ClaimAnswer<std::convert::Infallible>> {
    (reply.status == 204).then(|| ClaimAnswer::Empty {
        reason: wire::empty_reason(reply.empty_reason.as_deref()),
        retry_after: reply.retry_after.unwrap_or(Duration::from_secs(1)),
    })
}

fn widen<T>(answer: ClaimAnswer<std::convert::Infallible>) -> ClaimAnswer<T> {
    match answer {
        ClaimAnswer::Empty {
            reason,
            retry_after,
        } => ClaimAnswer::Empty {
            reason,
            retry_after,
        },
        ClaimAnswer::Granted(never) => match never {},
    }
}

pub(crate) fn claimed(reply: &Reply) -> Result<ClaimAnswer<wire::Claim>, Error> {
    match empty(reply) {
        Some(nothing) => Ok(widen(nothing)),
        None => answer(reply, &[200]).map(ClaimAnswer::Granted),
    }
}

pub(crate) fn claim_batch(ns: &Namespace, queue: &QueueName, count: usize) -> Result<Call, Error> {
    let count = wire::ClaimCount {
        count: i64::try_from(count).unwrap_or(i64::MAX),
    };
    let mut call = call(
        wire::CLAIM_BATCH,
        &[ns.as_str(), queue.as_str()],
        Some(json(&count)?),
    );
    call.admitted = true;
    Ok(call)
}

pub(crate) fn claimed_batch(reply: &Reply) -> Result<ClaimAnswer<Vec<wire::Claim>>, Error> {
    match empty(reply) {
        Some(nothing) => Ok(widen(nothing)),
        None => {
            answer::<wire::Claims>(reply, &[200]).map(|claims| ClaimAnswer::Granted(claims.claimed))
        }
    }
}

pub(crate) fn wait(ns: &Namespace, queue: &QueueName, timeout: Duration) -> Result<Call, Error> {
    let body = wire::WaitTimeout {
        timeout_ms: wire::millis(timeout),
    };
    let mut call = call(
        wire::WAIT,
        &[ns.as_str(), queue.as_str()],
        Some(json(&body)?),
    );
    call.held = timeout;
    Ok(call)
}

pub(crate) fn waited(reply: &Reply) -> Result<WaitOutcome, Error> {
    answer::<wire::Waited>(reply, &[200]).map(|waited| waited.outcome)
}

fn under_lease(endpoint: Endpoint, lease: &wire::Lease, body: Vec<u8>) -> Call {
    let task = &lease.task;
    call(
        endpoint,
        &[task.namespace.as_str(), task.id.as_str()],
        Some(body),
    )
}

fn version(lease: &wire::Lease) -> i64 {
    i64::from(lease.task.version.as_u32())
}

pub(crate) fn heartbeat(lease: &wire::Lease, progress: Option<&Value>) -> Result<Call, Error> {
    let beat = wire::Beat {
        version: version(lease),
        token: lease.token.as_i64(),
        progress: progress.cloned(),
    };
    Ok(under_lease(wire::HEARTBEAT, lease, json(&beat)?))
}

pub(crate) fn extended(reply: &Reply) -> Result<wire::Lease, Error> {
    answer(reply, &[200])
}

pub(crate) fn submit(
    lease: &wire::Lease,
    output: &Value,
    key: &IdempotencyKey,
) -> Result<Call, Error> {
    let submission = wire::Submission {
        version: version(lease),
        token: lease.token.as_i64(),
        output: output.clone(),
    };
    let mut call = under_lease(wire::SUBMIT, lease, json(&submission)?);
    call.idempotency_key = Some(key.as_str().to_owned());
    Ok(call)
}

pub(crate) fn accepted(reply: &Reply) -> Result<Accepted, Error> {
    answer(reply, &[200]).map(|receipt| Accepted {
        receipt,
        replayed: reply.replayed,
    })
}

pub(crate) fn fail(lease: &wire::Lease, retry: Retry, error: Option<&str>) -> Result<Call, Error> {
    let report = wire::FailureReport::new(lease, retry, error.map(str::to_owned));
    Ok(under_lease(wire::FAIL, lease, json(&report)?))
}

pub(crate) fn snooze(lease: &wire::Lease, delay: Duration) -> Result<Call, Error> {
    let snooze = wire::Snooze {
        version: version(lease),
        token: lease.token.as_i64(),
        delay_ms: wire::millis(delay),
    };
    Ok(under_lease(wire::SNOOZE, lease, json(&snooze)?))
}

pub(crate) fn new_state(reply: &Reply) -> Result<TaskState, Error> {
    answer::<wire::NewState>(reply, &[200]).map(|answer| answer.state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.as_bytes().to_vec(),
            ..Reply::default()
        }
    }

    #[test]
    fn a_refusal_reads_the_servers_error_body() {
        let body = r#"{"error":{"code":"storage_quota_exhausted","message":"spent","retry_after":30,"reset_at":"2026-12-08T00:00:00Z"}}"#;
        let error = waited(&reply(503, body)).unwrap_err();
        assert_eq!(error.code(), Some("storage_quota_exhausted"));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(30)));
        assert!(error.reset_at().is_some());
        assert!(error.is_transient());
    }

    #[test]
    fn an_answer_not_the_servers_is_unexpected_and_keeps_its_retry_after() {
        let mut proxy = reply(502, "<html>bad gateway</html>");
        proxy.retry_after = Some(Duration::from_secs(2));
        let error = waited(&proxy).unwrap_err();
        assert!(matches!(error, Error::Unexpected { status: 502, .. }));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
        assert!(error.is_transient());
        let garbled = waited(&reply(200, "{\"outcome\":\"maybe\"}")).unwrap_err();
        assert!(
            !garbled.is_transient(),
            "a 200 that does not read is not retried"
        );
    }

    #[test]
    fn an_empty_claim_reads_its_reason_and_pace() {
        let mut nothing = reply(204, "");
        nothing.empty_reason = Some("paused".into());
        nothing.retry_after = Some(Duration::from_secs(3));
        assert_eq!(
            claimed(&nothing).unwrap(),
            ClaimAnswer::Empty {
                reason: EmptyReason::Paused,
                retry_after: Duration::from_secs(3)
            }
        );
    }

    #[test]
    fn a_retry_after_header_is_whole_seconds() {
        assert_eq!(
            Reply::retry_after_header(" 7 "),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            Reply::retry_after_header("Wed, 21 Oct 2015 07:28:00 GMT"),
            None
        );
    }
}
