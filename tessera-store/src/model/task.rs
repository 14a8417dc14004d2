//! Tasks as a host sees them: references, briefs, outputs, receipts.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tessera_audit::Resource;
use tessera_lease::{
    AttemptNumber, BriefVersion, Digest, FencingToken, IdempotencyKey, Namespace, PartitionKey,
    QueueName, Receipt, RunAfter, StateName, TaskId, TaskRecord, TaskSpec, TaskState, UniqueKey,
    Uniqueness, check_brief_size,
};

use crate::error::{Error, corrupt};

/// The queue a session's practice tasks are put in.
pub const PRACTICE_QUEUE: &str = "practice";

/// Names one task: a versioned brief in a namespace.
///
/// Written `namespace/task@version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskRef {
    /// The namespace it was enqueued in.
    pub namespace: Namespace,
    /// The brief's id.
    pub id: TaskId,
    /// The brief's version.
    pub version: BriefVersion,
}

impl TaskRef {
    /// A reference to `id` at `version` in `namespace`.
    pub fn new(namespace: Namespace, id: TaskId, version: BriefVersion) -> Self {
        Self {
            namespace,
            id,
            version,
        }
    }

    /// The audit resource naming this task, followed by `suffix`.
    pub(crate) fn resource(&self, suffix: &str) -> Option<Resource> {
        Resource::new(&format!("task:{}@{}{suffix}", self.id, self.version)).ok()
    }

    /// The audit resource naming one grant of this task: its attempt and
    /// the grant's fencing token (`task:<id>@<version>/a<attempt>/t<token>`).
    pub(crate) fn grant_resource(
        &self,
        attempt: AttemptNumber,
        token: FencingToken,
    ) -> Option<Resource> {
        self.resource(&format!("/a{attempt}/t{token}"))
    }
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.namespace, self.id, self.version)
    }
}

/// A task's input, handed to whoever claims it; at most
/// [`MAX_BRIEF_BYTES`](tessera_lease::MAX_BRIEF_BYTES) once encoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "format", content = "value", rename_all = "lowercase")]
pub enum Brief {
    /// Opaque bytes, stored as they are.
    Bytes(Vec<u8>),
    /// A JSON document, stored as its compact text.
    Json(serde_json::Value),
}

impl Brief {
    /// The stored bytes (borrowed when they are the brief's own) and
    /// format name; refuses an oversized brief.
    pub(crate) fn encode(&self) -> Result<(Cow<'_, [u8]>, &'static str), Error> {
        let (bytes, format) = match self {
            Self::Bytes(bytes) => (Cow::Borrowed(bytes.as_slice()), "bytes"),
            Self::Json(value) => (
                Cow::Owned(serde_json::to_vec(value).expect("a JSON value always serializes")),
                "json",
            ),
        };
        check_brief_size(bytes.len())?;
        Ok((bytes, format))
    }

    pub(crate) fn decode(bytes: Vec<u8>, format: &str) -> Result<Self, Error> {
        match format {
            "bytes" => Ok(Self::Bytes(bytes)),
            "json" => serde_json::from_slice(&bytes)
                .map(Self::Json)
                .map_err(|_| corrupt("task brief")),
            _ => Err(corrupt("task brief format")),
        }
    }
}

/// How [`Store::enqueue`](crate::Store::enqueue) sets a task up.
///
/// ```
/// use std::time::Duration;
/// use tessera_store::{BriefVersion, EnqueueOptions, TaskId};
///
/// let options = EnqueueOptions::default()
///     .with_task_id(TaskId::parse("render-42")?)
///     .with_version(BriefVersion::new(2)?)
///     .with_alternatives(3)
///     .with_lapse_backoff(Duration::from_secs(10));
/// # Ok::<(), tessera_store::LeaseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnqueueOptions {
    pub(crate) task_id: Option<TaskId>,
    pub(crate) version: Option<BriefVersion>,
    pub(crate) spec: TaskSpec,
    pub(crate) partition_key: Option<PartitionKey>,
    pub(crate) unique: Option<Uniqueness>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) parents: Vec<TaskRef>,
    pub(crate) run_after: RunAfter,
}

impl EnqueueOptions {
    /// The brief's id (default: `t-` and 28 hex digits, the enqueue's time
    /// in milliseconds then 64 random bits, so new ids sort in time order
    /// and land beside each other in the id index).
    pub fn with_task_id(mut self, id: TaskId) -> Self {
        self.task_id = Some(id);
        self
    }

    /// The brief's version (default 1). Each version of one id is its own
    /// task, with its own attempts and receipts.
    pub fn with_version(mut self, version: BriefVersion) -> Self {
        self.version = Some(version);
        self
    }

    /// How many competing attempts the brief gets (default 1, at most
    /// [`MAX_ALTERNATIVES`](tessera_lease::MAX_ALTERNATIVES)).
    pub fn with_alternatives(mut self, alternatives: u16) -> Self {
        self.spec.alternatives = alternatives;
        self
    }

    /// How many tries each attempt gets, lapses and failures alike
    /// (default [`DEFAULT_MAX_TRIES`](tessera_lease::DEFAULT_MAX_TRIES), at
    /// most [`MAX_TRIES`](tessera_lease::MAX_TRIES)). An attempt whose last
    /// try lapses, or fails asking for a retry, is discarded.
    pub fn with_max_tries(mut self, tries: u32) -> Self {
        self.spec.max_tries = tries;
        self
    }

    /// How long an attempt whose lease lapsed waits before it can be
    /// claimed again (default zero: at once).
    pub fn with_lapse_backoff(mut self, backoff: Duration) -> Self {
        self.spec.lapse_backoff = backoff;
        self
    }

    /// The task's priority, 0 (the default) to
    /// [`MAX_PRIORITY`](tessera_lease::MAX_PRIORITY): a claim takes the
    /// highest-priority claimable task of its queue first, and within a
    /// priority the usual claim order. Priorities order one queue; which
    /// principal's claim runs next is admission's fair share, not this.
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.spec.priority = priority;
        self
    }

    /// Not claimable before `at` (in whole milliseconds, as times are
    /// stored): the task's attempts are `scheduled` until then, and once it
    /// passes a claim orders the task by `at`, as an ended backoff.
    pub fn with_not_before(mut self, at: DateTime<Utc>) -> Self {
        self.spec.not_before =
            Some(DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at));
        self
    }

    /// How long each grant of this task lasts, and how far a heartbeat
    /// extends it (default: the store's,
    /// [`StoreConfig::with_lease_duration`](crate::StoreConfig::with_lease_duration);
    /// whole milliseconds, 1 ms to
    /// [`MAX_LEASE_DURATION`](tessera_lease::MAX_LEASE_DURATION)). A queue
    /// that mixes 2-second and 20-minute jobs gives each its own, so a
    /// short one lapses soon after its worker goes away and a long one
    /// needs few heartbeats.
    pub fn with_lease_duration(mut self, duration: Duration) -> Self {
        self.spec.lease_duration = Some(duration);
        self
    }

    /// The time by which the task must be finished (whole milliseconds).
    /// No claim grants it at or after the deadline, no lease or heartbeat
    /// runs past it, and its attempts not done by then end `discarded`
    /// with the reason `deadline_exceeded`, recorded by the lease rules
    /// when a claim next reaches the task or its lease lapses: a late
    /// holder is fenced off as after any lapse. A deadline that has
    /// passed, or that is not after [`with_not_before`](Self::with_not_before),
    /// is refused (`400`).
    pub fn with_deadline(mut self, at: DateTime<Utc>) -> Self {
        self.spec.deadline =
            Some(DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at));
        self
    }

    /// A deadline `timeout` after the enqueue (see
    /// [`with_deadline`](Self::with_deadline); the earlier of the two if
    /// both are set).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The task's partition key (default none): stored with the task and
    /// shown by [`read_task`](crate::Store::read_task) and listings, for
    /// limits and filters by partition (one customer, one tenant).
    ///
    /// ```
    /// use tessera_store::EnqueueOptions;
    /// use tessera_store::PartitionKey;
    ///
    /// let options = EnqueueOptions::default().with_partition_key(PartitionKey::parse("customer-7")?);
    /// # Ok::<(), tessera_store::LeaseError>(())
    /// ```
    pub fn with_partition_key(mut self, key: PartitionKey) -> Self {
        self.partition_key = Some(key);
        self
    }

    /// Makes the enqueue unique ([`Uniqueness`]): while a task of the same
    /// queue holds the same slot (its key, and its window's period if it
    /// has one), an enqueue is a duplicate. A duplicate creates nothing: it
    /// answers with the task already there, `created: false`
    /// ([`Store::enqueue_one`](crate::Store::enqueue_one),
    /// [`Store::enqueue_batch`](crate::Store::enqueue_batch)), and writes
    /// nothing unless its mode replaces or debounces a task still waiting.
    /// A task releases its slot when its attempts leave the counted states
    /// (by default: once none is waiting or leased); an operator's retry
    /// does not take it back. A task whose first states are not counted
    /// takes no slot. The window and debounce delays are checked (`400`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tessera_store::{EnqueueOptions, UniqueKey, UniqueMode, Uniqueness};
    ///
    /// let mut unique = Uniqueness::new(UniqueKey::parse("report-7")?);
    /// unique.window = Some(Duration::from_secs(600));
    /// unique.mode = UniqueMode::Replace;
    /// let options = EnqueueOptions::default().with_unique(unique);
    /// # Ok::<(), tessera_store::LeaseError>(())
    /// ```
    pub fn with_unique(mut self, unique: Uniqueness) -> Self {
        self.unique = Some(unique);
        self
    }

    /// Runs the task after `parents`, tasks of the same namespace that
    /// exist already or come earlier in the same
    /// [`enqueue_batch`](crate::Store::enqueue_batch), so edges can never
    /// close a cycle, and a whole graph can be enqueued in one batch. At
    /// most [`MAX_PARENTS`](tessera_lease::MAX_PARENTS), each named once.
    ///
    /// Until they have ended the task is
    /// [`waiting`](tessera_lease::StateName::Waiting): no claim grants
    /// it. It becomes ready (or scheduled, for its not-before time) in
    /// the transaction that ends its last parent, however that parent
    /// ended: a submission, through any acknowledgement path, a failure,
    /// a cancel. Under [`RunAfter::AllDone`] (the default, see
    /// [`with_run_after`](Self::with_run_after)) a parent that ends
    /// without a done attempt cancels it instead (last error
    /// `parent_failed`), and its own waiting children after it. A parent
    /// done already counts as ended; a parent that does not exist is a
    /// `400` that enqueues nothing.
    ///
    /// ```
    /// use tessera_store::{BriefVersion, EnqueueOptions, Namespace, TaskId, TaskRef};
    ///
    /// let brief = TaskRef::new(Namespace::parse("demo")?, TaskId::parse("brief-1")?, BriefVersion::FIRST);
    /// let compare = EnqueueOptions::default()
    ///     .with_task_id(TaskId::parse("compare-1")?)
    ///     .after([brief]);
    /// # Ok::<(), tessera_store::LeaseError>(())
    /// ```
    pub fn after(mut self, parents: impl IntoIterator<Item = TaskRef>) -> Self {
        self.parents.extend(parents);
        self
    }

    /// When a task with parents ([`after`](Self::after)) runs: once every
    /// parent is done (the default), or once every parent has ended
    /// however it ended.
    pub fn with_run_after(mut self, run_after: RunAfter) -> Self {
        self.run_after = run_after;
        self
    }
}

/// A submission's output: its digest, and the bytes if the store is to
/// keep them (at most [`MAX_BRIEF_BYTES`](tessera_lease::MAX_BRIEF_BYTES)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub(crate) digest: Digest,
    pub(crate) bytes: Option<Vec<u8>>,
}

impl Output {
    /// Output bytes the store keeps with the receipt; the digest is their
    /// SHA-256.
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Self {
        let bytes = bytes.into();
        let digest = Digest::from_bytes(Sha256::digest(&bytes).into());
        Self {
            digest,
            bytes: Some(bytes),
        }
    }

    /// Output kept elsewhere (under the receipt's artifact key), known here
    /// by its digest.
    pub fn digest(digest: Digest) -> Self {
        Self {
            digest,
            bytes: None,
        }
    }

    /// The payload digest idempotency compares.
    pub fn payload_digest(&self) -> Digest {
        self.digest
    }
}

/// One submission of a [`submit_batch`](crate::Store::submit_batch): the
/// same inputs as [`submit`](crate::Store::submit) takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The task the lease is on.
    pub task: TaskRef,
    /// The lease's fencing token.
    pub token: FencingToken,
    /// The idempotency key, scoped to the caller's principal and the task.
    pub key: IdempotencyKey,
    /// The output.
    pub output: Output,
}

/// The most submissions one
/// [`submit_batch`](crate::Store::submit_batch) carries.
pub const MAX_SUBMIT_BATCH: usize = 1_000;

/// A parent of a task and its finished alternatives
/// ([`Store::parent_alternatives`](crate::Store::parent_alternatives)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentAlternatives {
    /// The parent.
    pub parent: TaskRef,
    /// One receipt per done attempt of it, in attempt order, with outputs.
    pub receipts: Vec<StoredReceipt>,
}

/// A receipt as stored, with the output bytes if they were kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReceipt {
    /// The receipt.
    pub receipt: Receipt,
    /// The output, when it was submitted as bytes.
    pub output: Option<Vec<u8>>,
}

/// A task as [`Store::read_task`](crate::Store::read_task) returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    /// The task.
    pub task: TaskRef,
    /// Its queue.
    pub queue: QueueName,
    /// Its input.
    pub brief: Brief,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Its partition key, if it was enqueued with one.
    pub partition_key: Option<PartitionKey>,
    /// Its unique key, if it was enqueued unique (kept after it released
    /// its slot).
    pub unique_key: Option<UniqueKey>,
    /// Its attempts, their states and leases, and the token counter.
    pub record: TaskRecord,
    /// The last progress value a heartbeat carried, per attempt that was
    /// given one, in attempt order.
    #[serde(default)]
    pub progress: Vec<crate::model::bulk::AttemptProgress>,
}

/// The most attempts one [`Store::list_tasks`](crate::Store::list_tasks)
/// page holds.
pub const MAX_TASKS_LISTED: usize = 1_000;

/// The most tasks one [`Store::enqueue_batch`](crate::Store::enqueue_batch)
/// puts in.
pub const MAX_ENQUEUE_BATCH: usize = 1_000;

/// One task of an [`enqueue_batch`](crate::Store::enqueue_batch): its
/// reference, and whether this batch created it (`false`: it was there
/// already, and was left as it is).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Enqueued {
    /// The task.
    pub task: TaskRef,
    /// Whether this batch created it.
    pub created: bool,
}

/// Which end of a listing comes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    /// In enqueue order (the default).
    #[default]
    Oldest,
    /// Newest enqueued first.
    Newest,
}

/// Where a listing goes on: after the last attempt of the page before.
/// Opaque; it travels as text (`Display` and `FromStr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskCursor {
    /// A row id of the backend's listing order, with the attempt number.
    pub(crate) row: i64,
    pub(crate) attempt: u16,
}

impl fmt::Display for TaskCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.row, self.attempt)
    }
}

impl std::str::FromStr for TaskCursor {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let (row, attempt) = crate::model::cursor_parts(text, "listing cursor")?;
        Ok(Self { row, attempt })
    }
}

/// What [`Store::list_tasks`](crate::Store::list_tasks) lists: a
/// namespace's attempts in one state, a page at a time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskQuery {
    /// The state listed.
    pub state: StateName,
    /// Oldest or newest first.
    pub order: ListOrder,
    /// Where the page starts: `None` at the listing's start, else the
    /// `next` of the page before.
    pub after: Option<TaskCursor>,
    /// The most attempts on the page, held to 1 to [`MAX_TASKS_LISTED`].
    pub limit: usize,
}

impl TaskQuery {
    /// The first page of `state`, oldest first, of up to 100 attempts.
    pub fn new(state: StateName) -> Self {
        Self {
            state,
            order: ListOrder::Oldest,
            after: None,
            limit: 100,
        }
    }
}

/// One attempt of a listing: small columns only. The brief, the lease and
/// the last error are [`Store::read_task`](crate::Store::read_task)'s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskListing {
    /// The task.
    pub task: TaskRef,
    /// Its queue.
    pub queue: QueueName,
    /// The attempt.
    pub attempt: AttemptNumber,
    /// Its state, with a backoff's end or a discard's reason.
    pub state: TaskState,
    /// The tries it has had.
    pub tries: u32,
    /// When the attempt reached its state: how long it has waited there
    /// (ready, scheduled, in backoff) or when it finished.
    pub changed_at: DateTime<Utc>,
    /// Its task's partition key, if it has one.
    pub partition_key: Option<PartitionKey>,
    /// The last progress value a heartbeat carried for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<serde_json::Value>,
}

/// One page of [`Store::list_tasks`](crate::Store::list_tasks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPage {
    /// The attempts, in the query's order.
    pub tasks: Vec<TaskListing>,
    /// Where the next page starts; `None` once the listing is done.
    pub next: Option<TaskCursor>,
}

pub(crate) fn not_found(task: &TaskRef) -> Error {
    Error::NotFound {
        what: format!("task {task}"),
    }
}

/// A call under a fencing token found no such task: it was purged.
pub(crate) fn purged(task: &TaskRef) -> Error {
    Error::TaskPurged {
        what: format!("task {task}"),
    }
}

/// `duration` in the whole milliseconds times are stored at.
pub(crate) fn whole_millis(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn briefs_are_size_checked_and_round_trip() {
        let json = Brief::Json(serde_json::json!({"frame": 7}));
        let (bytes, format) = json.encode().unwrap();
        assert_eq!(Brief::decode(bytes.into_owned(), format).unwrap(), json);
        let big = Brief::Bytes(vec![0; tessera_lease::MAX_BRIEF_BYTES + 1]);
        assert_eq!(big.encode().unwrap_err().status(), 400);
    }

    #[test]
    fn output_digest_is_the_sha256_of_the_bytes() {
        let output = Output::bytes(b"abc".to_vec());
        assert_eq!(
            output.payload_digest().to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
