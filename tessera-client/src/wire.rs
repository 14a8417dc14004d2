//! The HTTP face the client and `tessera-server` share: each route the
//! client calls ([`Endpoint`]), the JSON bodies it sends, and the answers
//! it reads.
//!
//! The server reads its requests into these same types and builds its
//! answers from them, so a field renamed on one side is renamed on both.
//! Requests carry integers as the client wrote them (`i64`): the server
//! checks each against its documented limits and answers `400` with the
//! field's name, rather than failing to parse.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_store::lease::{ArtifactKey, Digest, Principal};
use tessera_store::{
    AttemptNumber, Brief, BriefVersion, Claimed, EmptyReason, FencingToken, IdempotencyKey,
    QueueName, Retry, TaskRef, TaskState, WaitOutcome,
};

/// An HTTP method, as the routes below use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Verb {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
}

impl Verb {
    /// The method's name, as HTTP writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
        }
    }
}

/// One route: its method and its path, with `{parameters}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The method.
    pub verb: Verb,
    /// The path template, as the OpenAPI document writes it.
    pub path: &'static str,
}

impl Endpoint {
    const fn new(verb: Verb, path: &'static str) -> Self {
        Self { verb, path }
    }

    /// The path with each `{parameter}` replaced, in order, by one of
    /// `values`, percent-encoded as a path segment.
    ///
    /// # Panics
    /// When `values` does not have one value per parameter: each call
    /// site passes a fixed number.
    pub fn fill(&self, values: &[&str]) -> String {
        let mut path = String::with_capacity(self.path.len() + 32);
        let mut values = values.iter();
        let mut rest = self.path;
        while let Some(open) = rest.find('{') {
            let close = open + rest[open..].find('}').expect("a closed parameter");
            path.push_str(&rest[..open]);
            let value = values.next().expect("one value per parameter");
            encode_segment(value, &mut path);
            rest = &rest[close + 1..];
        }
        path.push_str(rest);
        assert!(values.next().is_none(), "one value per parameter");
        path
    }
}

/// `value` percent-encoded as one path segment: everything but RFC 3986's
/// unreserved characters.
fn encode_segment(value: &str, into: &mut String) {
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            into.push(byte as char);
        } else {
            into.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// Enqueue one task: [`NewTask`] in, [`EnqueuedTask`] out (`201`, or `200`
/// for a unique task already there).
pub const ENQUEUE: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/queues/{queue}/tasks");
/// Enqueue up to 1,000 tasks at once: [`NewTasks`] in, the store's
/// [`Enqueued`](tessera_store::Enqueued) of each out, in order.
pub const ENQUEUE_BATCH: Endpoint =
    Endpoint::new(Verb::Post, "/v1/ns/{ns}/queues/{queue}/tasks/batch");
/// Claim one task: no body; [`Claim`] out (`200`), or `204` with
/// [`EMPTY_REASON`] and `Retry-After`.
pub const CLAIM: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/queues/{queue}/claims");
/// Claim up to `count`: [`ClaimCount`] in, [`Claims`] out, or `204`.
pub const CLAIM_BATCH: Endpoint =
    Endpoint::new(Verb::Post, "/v1/ns/{ns}/queues/{queue}/claims/batch");
/// The long-poll: [`WaitTimeout`] in, [`Waited`] out.
pub const WAIT: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/queues/{queue}/wait");
/// Extend a lease: [`Beat`] in, [`Lease`] out.
pub const HEARTBEAT: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/tasks/{task}/heartbeat");
/// Submit under [`IDEMPOTENCY_KEY`]: [`Submission`] in, [`Receipt`] out,
/// with [`REPLAYED`] on a replay.
pub const SUBMIT: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/tasks/{task}/submit");
/// Report a failure: [`FailureReport`] in, [`NewState`] out.
pub const FAIL: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/tasks/{task}/fail");
/// Put a held task back for a while: [`Snooze`] in, [`NewState`] out.
pub const SNOOZE: Endpoint = Endpoint::new(Verb::Post, "/v1/ns/{ns}/tasks/{task}/snooze");

/// Every route the client calls.
pub const ENDPOINTS: &[Endpoint] = &[
    ENQUEUE,
    ENQUEUE_BATCH,
    CLAIM,
    CLAIM_BATCH,
    WAIT,
    HEARTBEAT,
    SUBMIT,
    FAIL,
    SNOOZE,
];

/// The largest request body the server reads; a larger one is refused
/// (`413`), the client refusing it before sending.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The header a submission is keyed by.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on a submission's answer that replays its receipt.
pub const REPLAYED: &str = "idempotent-replayed";
/// Why a claim was empty: `empty`, `paused` or `limited`.
pub const EMPTY_REASON: &str = "x-claim-empty-reason";

/// A new task (`POST …/tasks`, and each item of a batch).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTask {
    /// The task's input, any JSON value.
    pub brief: Value,
    /// The task's id (default: the server makes one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The brief's version (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// How many competing attempts may solve it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alternatives: Option<i64>,
    /// Higher is claimed first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Attempts before it is discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tries: Option<i64>,
    /// Not claimable before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// Its lease length, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<i64>,
    /// Discarded if not done by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// Discarded if not done this long after enqueue, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    /// Its partition key, for per-key limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// At most one task per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<Unique>,
    /// The tasks it runs after, in its namespace: each stored already or
    /// earlier in the same batch. Until they have ended it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<Parent>>,
    /// When it runs after them: `all_done` (the default: a parent that
    /// ends otherwise cancels it) or `any_outcome`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_after: Option<String>,
}

/// A parent a new task runs after.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parent {
    /// The parent's id.
    pub id: String,
    /// Its brief's version (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

impl NewTask {
    /// A task with `brief` and every option at its default.
    pub fn new(brief: Value) -> Self {
        Self {
            brief,
            ..Self::default()
        }
    }
}

/// A new task's `unique`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unique {
    /// The key.
    pub key: String,
    /// How long the key holds after enqueue, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<i64>,
    /// The states in which an existing task holds the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states: Option<Vec<String>>,
    /// `keep`, `replace` or `debounce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// A debounce's delay, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// A debounce's longest delay, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<i64>,
}

/// `POST …/tasks/batch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTasks {
    /// The tasks, in order.
    pub tasks: Vec<NewTask>,
}

/// `POST …/claims/batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimCount {
    /// How many tasks at most.
    pub count: i64,
}

/// `POST …/wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitTimeout {
    /// How long to wait at most, in milliseconds.
    pub timeout_ms: i64,
}

/// `POST …/heartbeat`: the lease held, and optionally progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Beat {
    /// The task's brief version.
    pub version: i64,
    /// The lease's fencing token.
    pub token: i64,
    /// A small JSON value kept on the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// `POST …/submit`: the lease held and the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// The task's brief version.
    pub version: i64,
    /// The lease's fencing token.
    pub token: i64,
    /// The output, any JSON value.
    pub output: Value,
}

/// `POST …/fail`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureReport {
    /// The task's brief version.
    pub version: i64,
    /// The lease's fencing token.
    pub token: i64,
    /// `never`, `backoff`, `after` or `snooze` (the last two with
    /// `after_ms`).
    pub retry: String,
    /// The wait before the next try, for `after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ms: Option<i64>,
    /// What went wrong, kept as the attempt's last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl FailureReport {
    /// A report under `lease` asking for `retry`, with `error` as the
    /// attempt's last error.
    pub fn new(lease: &Lease, retry: Retry, error: Option<String>) -> Self {
        let (word, after) = match retry {
            Retry::Never => ("never", None),
            Retry::Backoff => ("backoff", None),
            Retry::After(wait) => ("after", Some(wait)),
            Retry::Snooze(wait) => ("snooze", Some(wait)),
        };
        Self {
            version: i64::from(lease.task.version.as_u32()),
            token: lease.token.as_i64(),
            retry: word.to_owned(),
            after_ms: after.map(millis),
            error,
        }
    }
}

/// `wait` in whole milliseconds, as a request field.
pub(crate) fn millis(wait: std::time::Duration) -> i64 {
    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)
}

/// `POST …/snooze`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snooze {
    /// The task's brief version.
    pub version: i64,
    /// The lease's fencing token.
    pub token: i64,
    /// How long until it is claimable again, in milliseconds.
    pub delay_ms: i64,
}

/// A lease as the routes answer it: the store's lease, its task named in
/// full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The task, with its namespace and version.
    pub task: TaskRef,
    /// The attempt it leases.
    pub attempt: AttemptNumber,
    /// Who holds it.
    pub holder: Principal,
    /// Its fencing token: every write under it carries it.
    pub token: FencingToken,
    /// When it was granted.
    pub granted_at: DateTime<Utc>,
    /// When it lapses unless extended.
    pub expires_at: DateTime<Utc>,
    /// The key the grant's output goes under.
    pub artifact: ArtifactKey,
}

impl Lease {
    /// The store's `lease` of `task`, as the routes answer it.
    pub fn of(task: &TaskRef, lease: &tessera_store::Lease) -> Self {
        Self {
            task: task.clone(),
            attempt: lease.attempt(),
            holder: lease.holder().clone(),
            token: lease.token(),
            granted_at: lease.granted_at(),
            expires_at: lease.expires_at(),
            artifact: lease.artifact(),
        }
    }

    /// How long it was granted for (from grant to expiry).
    pub fn length(&self) -> std::time::Duration {
        (self.expires_at - self.granted_at)
            .to_std()
            .unwrap_or_default()
    }

    /// The idempotency key a worker submits under: one per grant
    /// (`a{attempt}.t{token}`), so a retried submission replays.
    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::parse(&format!(
            "a{}.t{}",
            self.attempt.as_u16(),
            self.token.as_i64()
        ))
        .expect("digits, a dot and two letters make a key")
    }
}

/// A granted claim (`200` of a claim).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    /// The task.
    pub task: TaskRef,
    /// The queue it came from.
    pub queue: QueueName,
    /// The lease.
    pub lease: Lease,
    /// The task's input.
    pub brief: Brief,
    /// How long the claim waited for admission, in milliseconds.
    pub waited_ms: u64,
    /// Admission's concurrency limit when the claim finished.
    pub concurrency_limit: u32,
}

impl Claim {
    /// The brief as JSON, for a task enqueued with a JSON brief (every
    /// task enqueued over HTTP); `None` for opaque bytes.
    pub fn brief_json(&self) -> Option<&Value> {
        match &self.brief {
            Brief::Json(value) => Some(value),
            Brief::Bytes(_) => None,
        }
    }
}

impl From<&Claimed> for Claim {
    fn from(claimed: &Claimed) -> Self {
        Self {
            task: claimed.task.clone(),
            queue: claimed.queue.clone(),
            lease: Lease::of(&claimed.task, &claimed.lease),
            brief: claimed.brief.clone(),
            waited_ms: u64::try_from(claimed.waited.as_millis()).unwrap_or(u64::MAX),
            concurrency_limit: claimed.concurrency_limit,
        }
    }
}

/// A batch claim's `200`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// The leases granted, in claim order.
    pub claimed: Vec<Claim>,
    /// How long the batch waited for admission, in milliseconds.
    pub waited_ms: u64,
}

/// An accepted submission's receipt, its task named in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The task.
    pub task: TaskRef,
    /// The brief version the attempt solved.
    pub version: BriefVersion,
    /// The attempt that finished.
    pub attempt: AttemptNumber,
    /// The fencing token it was accepted under.
    pub token: FencingToken,
    /// Who submitted.
    pub principal: Principal,
    /// The key it was submitted under.
    pub idempotency_key: IdempotencyKey,
    /// Where the attempt's output lives.
    pub artifact: ArtifactKey,
    /// The digest of the accepted output.
    pub digest: Digest,
    /// When it was accepted.
    pub accepted_at: DateTime<Utc>,
}

impl Receipt {
    /// The store's `receipt` of `task`, as the routes answer it.
    pub fn of(task: &TaskRef, receipt: tessera_store::Receipt) -> Self {
        Self {
            task: task.clone(),
            version: receipt.version,
            attempt: receipt.attempt,
            token: receipt.token,
            principal: receipt.principal,
            idempotency_key: receipt.idempotency_key,
            artifact: receipt.artifact,
            digest: receipt.digest,
            accepted_at: receipt.accepted_at,
        }
    }
}

/// An enqueue's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnqueuedTask {
    /// The task's namespace.
    pub namespace: tessera_store::Namespace,
    /// Its id.
    pub id: tessera_store::TaskId,
    /// Its brief version.
    pub version: BriefVersion,
    /// Whether this call created it (a unique task's duplicate did not).
    pub created: bool,
}

impl EnqueuedTask {
    /// The task it names.
    pub fn task(&self) -> TaskRef {
        TaskRef::new(self.namespace.clone(), self.id.clone(), self.version)
    }
}

/// A failure's or snooze's answer: the task's state now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewState {
    /// The state.
    pub state: TaskState,
}

/// The long-poll's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waited {
    /// Whether work is there or the wait timed out.
    pub outcome: WaitOutcome,
}

/// Why a claim was empty, read from [`EMPTY_REASON`] (`empty` when the
/// header is missing or unknown).
pub fn empty_reason(header: Option<&str>) -> EmptyReason {
    match header {
        Some("paused") => EmptyReason::Paused,
        Some("limited") => EmptyReason::Limited,
        _ => EmptyReason::Empty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_filled_in_order_and_each_value_encoded() {
        assert_eq!(
            HEARTBEAT.fill(&["renders", "frame 7/x"]),
            "/v1/ns/renders/tasks/frame%207%2Fx/heartbeat"
        );
        assert_eq!(
            CLAIM_BATCH.fill(&["a.b", "q~1"]),
            "/v1/ns/a.b/queues/q~1/claims/batch"
        );
    }

    #[test]
    #[should_panic(expected = "one value per parameter")]
    fn a_path_refuses_too_few_values() {
        let _ = SUBMIT.fill(&["renders"]);
    }

    #[test]
    fn a_new_task_writes_only_the_options_set() {
        let mut task = NewTask::new(serde_json::json!({"frame": 7}));
        task.priority = Some(5);
        assert_eq!(
            serde_json::to_value(&task).unwrap(),
            serde_json::json!({"brief": {"frame": 7}, "priority": 5})
        );
        let unknown = serde_json::json!({"brief": 1, "colour": "red"});
        assert!(serde_json::from_value::<NewTask>(unknown).is_err());
    }
}
