//! Tasks: enqueue, heartbeat, submit, fail, lease expiry and the reads of
//! tasks, receipts and alternatives, each applying `tessera-lease`'s rules
//! inside one transaction.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tessera_audit::{Action, Outcome, Resource};
use tessera_lease::{
    AttemptNumber, AttemptRecord, BriefVersion, Digest, FencingToken, Idempotency, IdempotencyKey,
    Lease, LeaseError, LeaseRecord, MAX_ALTERNATIVES, Namespace, Principal, QueueName, Receipt,
    Retry, StateName, Submission, Submitted, Task, TaskId, TaskRecord, TaskSpec, TaskState,
    check_brief_size, decide_idempotency,
};

use crate::access::{Caller, PrincipalKind, Scope};
use crate::audit::Trail;
use crate::db::{Reader, Writer};
use crate::error::{Error, corrupt};
use crate::sql::tasks::{self as sql, AttemptRow, NewReceipt, NewTask, ReceiptRow, TaskRow};
use crate::sql::{from_millis, millis};
use crate::store::Store;

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
    fn encode(&self) -> Result<(Cow<'_, [u8]>, &'static str), Error> {
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

    fn decode(bytes: Vec<u8>, format: &str) -> Result<Self, Error> {
        match format {
            "bytes" => Ok(Self::Bytes(bytes)),
            "json" => serde_json::from_slice(&bytes)
                .map(Self::Json)
                .map_err(|_| corrupt("task brief")),
            _ => Err(corrupt("task brief format")),
        }
    }
}

/// How [`Store::enqueue`] sets a task up.
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
    task_id: Option<TaskId>,
    version: Option<BriefVersion>,
    spec: TaskSpec,
}

impl EnqueueOptions {
    /// The brief's id (default: a random `t-<16 hex digits>`).
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
    /// [`MAX_ALTERNATIVES`]).
    pub fn with_alternatives(mut self, alternatives: u16) -> Self {
        self.spec.alternatives = alternatives;
        self
    }

    /// How long an attempt whose lease lapsed waits before it can be
    /// claimed again (default zero: at once).
    pub fn with_lapse_backoff(mut self, backoff: Duration) -> Self {
        self.spec.lapse_backoff = backoff;
        self
    }
}

/// A submission's output: its digest, and the bytes if the store is to
/// keep them (at most [`MAX_BRIEF_BYTES`](tessera_lease::MAX_BRIEF_BYTES)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    digest: Digest,
    bytes: Option<Vec<u8>>,
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

/// A receipt as stored, with the output bytes if they were kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReceipt {
    /// The receipt.
    pub receipt: Receipt,
    /// The output, when it was submitted as bytes.
    pub output: Option<Vec<u8>>,
}

/// A task as [`Store::read_task`] returns it.
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
    /// Its attempts, their states and leases, and the token counter.
    pub record: TaskRecord,
}

fn not_found(task: &TaskRef) -> Error {
    Error::NotFound {
        what: format!("task {task}"),
    }
}

fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// `duration` in the whole milliseconds times are stored at.
fn whole_millis(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

impl TaskRow {
    pub(crate) fn queue_name(&self) -> Result<QueueName, Error> {
        QueueName::parse(&self.queue).map_err(|_| corrupt("task queue"))
    }

    /// Takes the brief out of a row read with it.
    pub(crate) fn take_brief(&mut self) -> Result<Brief, Error> {
        let bytes = self.brief.take().ok_or_else(|| corrupt("task brief"))?;
        Brief::decode(bytes, &self.brief_format)
    }

    fn record(&self, attempts: Vec<AttemptRow>) -> Result<TaskRecord, Error> {
        Ok(TaskRecord {
            id: TaskId::parse(&self.task_id).map_err(|_| corrupt("task row"))?,
            version: u32::try_from(self.version)
                .ok()
                .and_then(|v| BriefVersion::new(v).ok())
                .ok_or_else(|| corrupt("task version"))?,
            lapse_backoff: Duration::from_millis(
                u64::try_from(self.lapse_backoff_ms).map_err(|_| corrupt("task row"))?,
            ),
            last_token: match self.last_token {
                0 => None,
                token => Some(FencingToken::new(token).map_err(|_| corrupt("task row"))?),
            },
            attempts: attempts
                .iter()
                .map(AttemptRow::record)
                .collect::<Result<_, _>>()?,
        })
    }
}

impl AttemptRow {
    fn record(&self) -> Result<AttemptRecord, Error> {
        let bad = || corrupt("attempt row");
        let name: StateName = self.state.parse().map_err(|_| bad())?;
        let state =
            TaskState::from_parts(name, self.until_at.map(from_millis)).map_err(|_| bad())?;
        let lease = match (&self.holder, self.token, self.granted_at, self.expires_at) {
            (Some(holder), Some(token), Some(granted_at), Some(expires_at)) => Some(LeaseRecord {
                holder: holder.parse().map_err(|_| bad())?,
                token: FencingToken::new(token).map_err(|_| bad())?,
                granted_at: from_millis(granted_at),
                expires_at: from_millis(expires_at),
            }),
            (None, None, None, None) => None,
            _ => return Err(bad()),
        };
        Ok(AttemptRecord {
            number: u16::try_from(self.number)
                .ok()
                .and_then(|n| AttemptNumber::new(n).ok())
                .ok_or_else(bad)?,
            state,
            tries: u32::try_from(self.tries).map_err(|_| bad())?,
            lease,
        })
    }

    /// The row of `record`, an attempt of a task with `lapse_backoff`.
    fn from_record(record: &AttemptRecord, lapse_backoff: Duration) -> Self {
        let lease = record.lease.as_ref();
        let lapses_at = match (record.state, lease) {
            (TaskState::Leased, Some(lease)) => {
                Some(millis(lease.expires_at).saturating_add(duration_millis(lapse_backoff)))
            }
            _ => None,
        };
        Self {
            number: i64::from(record.number.as_u16()),
            state: record.state.as_str().to_owned(),
            until_at: record.state.until().map(millis),
            tries: i64::from(record.tries),
            holder: lease.map(|l| l.holder.as_str().to_owned()),
            token: lease.map(|l| l.token.as_i64()),
            granted_at: lease.map(|l| millis(l.granted_at)),
            expires_at: lease.map(|l| millis(l.expires_at)),
            lapses_at,
        }
    }
}

impl ReceiptRow {
    fn stored(self, task: &TaskRef) -> Result<StoredReceipt, Error> {
        let bad = |_| corrupt("receipt row");
        let receipt = Receipt {
            task: task.id.clone(),
            version: task.version,
            attempt: u16::try_from(self.attempt)
                .ok()
                .and_then(|n| AttemptNumber::new(n).ok())
                .ok_or_else(|| corrupt("receipt row"))?,
            token: FencingToken::new(self.token).map_err(bad)?,
            principal: self.principal.parse().map_err(bad)?,
            idempotency_key: self.idempotency_key.parse().map_err(bad)?,
            artifact: self.artifact.parse().map_err(bad)?,
            digest: self.digest.parse().map_err(bad)?,
            accepted_at: from_millis(self.accepted_at),
        };
        Ok(StoredReceipt {
            receipt,
            output: self.output,
        })
    }
}

/// When a task can next be claimed without a lease lapsing, as the claim
/// index stores it: 0 while an attempt is ready, the earliest backoff end
/// otherwise, `None` while every unfinished attempt is leased or once all
/// are done or failed. A leased attempt's lapse is its row's `lapses_at`
/// in `attempts_leased` instead, so a heartbeat leaves the task as it is.
/// With those, the indexes mirror the lease rules' own claimability and
/// never offer a task the rules refuse.
pub(crate) fn claimable_at(record: &TaskRecord) -> Option<i64> {
    record
        .attempts
        .iter()
        .filter_map(|attempt| match attempt.state {
            TaskState::Ready => Some(0),
            TaskState::Backoff { until } => Some(millis(until)),
            _ => None,
        })
        .min()
}

/// Loads a task and its attempts through `reader`.
pub(crate) fn load(reader: &Reader<'_>, row: &TaskRow) -> Result<Task, Error> {
    let attempts = sql::attempts_of_task(reader, row.id)?;
    Ok(Task::restore(row.record(attempts)?)?)
}

/// A task's row by reference, with its brief if asked; `404` if none.
fn find_row(reader: &Reader<'_>, task: &TaskRef, with_brief: bool) -> Result<TaskRow, Error> {
    sql::task_by_ref(
        reader,
        task.namespace.as_str(),
        task.id.as_str(),
        i64::from(task.version.as_u32()),
        with_brief,
    )?
    .ok_or_else(|| not_found(task))
}

/// Loads a task by reference: its row (with the brief if asked) and rules.
fn load_ref(
    reader: &Reader<'_>,
    task: &TaskRef,
    with_brief: bool,
) -> Result<(TaskRow, Task), Error> {
    let row = find_row(reader, task, with_brief)?;
    let loaded = load(reader, &row)?;
    Ok((row, loaded))
}

/// Applies one lease rule to `task`, stored as row `id`, and writes what it
/// changed: attempts, the token counter and the claim time.
pub(crate) fn apply<T>(
    writer: &Writer<'_>,
    id: i64,
    task: &mut Task,
    rule: impl FnOnce(&mut Task) -> Result<T, LeaseError>,
) -> Result<T, Error> {
    let before = task.record().clone();
    let value = rule(task)?;
    write_changes(writer, id, &before, task.record())?;
    Ok(value)
}

/// Writes the attempts of `after` that differ from `before`, and the task's
/// token counter and claim time if they changed.
fn write_changes(
    writer: &Writer<'_>,
    id: i64,
    before: &TaskRecord,
    after: &TaskRecord,
) -> Result<(), Error> {
    /// The grant an attempt's lease names: all of it but the expiry.
    fn grant(attempt: &AttemptRecord) -> Option<(&Principal, FencingToken, DateTime<Utc>)> {
        let lease = attempt.lease.as_ref()?;
        Some((&lease.holder, lease.token, lease.granted_at))
    }
    for (old, new) in before.attempts.iter().zip(&after.attempts) {
        if old == new {
            continue;
        }
        let row = AttemptRow::from_record(new, after.lapse_backoff);
        if old.lease == new.lease && old.tries == new.tries {
            sql::update_attempt_state(writer, id, &row)?;
        } else if row.expires_at.is_some()
            && old.state == new.state
            && old.tries == new.tries
            && grant(old) == grant(new)
        {
            // Only the expiry moves on a heartbeat.
            sql::extend_attempt(writer, id, &row)?;
        } else {
            sql::update_attempt(writer, id, &row)?;
        }
    }
    let claimable = claimable_at(after);
    let token = after.last_token.map_or(0, FencingToken::as_i64);
    match (
        before.last_token != after.last_token,
        claimable_at(before) != claimable,
    ) {
        (true, true) => sql::update_task(writer, id, token, claimable)?,
        (true, false) => sql::update_token(writer, id, token)?,
        (false, true) => sql::update_claimable(writer, id, claimable)?,
        (false, false) => {}
    }
    Ok(())
}

/// Rewrites what the claim indexes hold of a task from its record: its
/// claim time and its leased attempts' lapse times. For stored times the
/// lease rules disagree with.
pub(crate) fn resync(writer: &Writer<'_>, id: i64, record: &TaskRecord) -> Result<(), Error> {
    for attempt in &record.attempts {
        if attempt.state == TaskState::Leased {
            let row = AttemptRow::from_record(attempt, record.lapse_backoff);
            sql::update_attempt(writer, id, &row)?;
        }
    }
    sql::update_claimable(writer, id, claimable_at(record))?;
    Ok(())
}

fn random_task_id() -> Result<TaskId, Error> {
    let mut bytes = [0_u8; 8];
    getrandom::fill(&mut bytes).map_err(|_| Error::RandomnessUnavailable)?;
    Ok(TaskId::parse(&format!("t-{}", crate::key::hex(&bytes))).expect("t-<hex> is a task id"))
}

impl Store {
    /// Puts a task with a versioned brief into `queue` of `namespace` and
    /// returns its reference.
    ///
    /// Needs the `enqueue` scope and a grant for the namespace (`403`
    /// otherwise, counted). The brief is refused over
    /// [`MAX_BRIEF_BYTES`](tessera_lease::MAX_BRIEF_BYTES) (`400`); an id and
    /// version already enqueued in the namespace is `409`. One transaction:
    /// the namespace row on its first use, the task, one row per attempt and
    /// the audit row. Afterwards the queue's empty-claim pacing starts again
    /// at 5 s and long-polls on the queue wake.
    pub fn enqueue(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        brief: &Brief,
        options: &EnqueueOptions,
    ) -> Result<TaskRef, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::Enqueue)?;
        let prepared = (|| {
            let (bytes, format) = brief.encode()?;
            let id = match &options.task_id {
                Some(id) => id.clone(),
                None => random_task_id()?,
            };
            let version = options.version.unwrap_or(BriefVersion::FIRST);
            // Checks the alternatives and backoff before anything is written.
            Task::new(id.clone(), version, options.spec)?;
            Ok::<_, Error>((bytes, format, TaskRef::new(namespace.clone(), id, version)))
        })();
        let (bytes, format, task) =
            prepared.inspect_err(|error| self.count(&scope, error.outcome()))?;
        let now = self.now_utc();
        let principal = caller.principal().to_string();
        self.perform(&scope, now, |writer| {
            self.open_namespace(writer, caller, namespace, now)?;
            let inserted = insert_task(
                writer,
                &task,
                queue,
                &bytes,
                format,
                options.spec,
                now,
                &principal,
            )?;
            if !inserted {
                return Err(Error::Conflict {
                    reason: format!("task {task} already exists"),
                });
            }
            let resource = task.resource("");
            Ok((task.clone(), resource))
        })?;
        self.namespace_changed(namespace);
        self.queue_received_work(namespace, queue);
        Ok(task)
    }

    /// Creates `namespace`'s row on its first use. A session's namespace
    /// also gets its practice tasks then, never when the session is minted.
    pub(crate) fn open_namespace(
        &self,
        writer: &Writer<'_>,
        caller: &Caller,
        namespace: &Namespace,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let session = caller.kind() == PrincipalKind::Anonymous;
        let kind = if session { "session" } else { "keyed" };
        let created = sql::insert_namespace(writer, namespace.as_str(), kind, millis(now))?;
        if created && session {
            let queue = QueueName::parse(PRACTICE_QUEUE).expect("a valid queue name");
            let principal = caller.principal().to_string();
            for n in 1..=self.config.session_practice_tasks() {
                let id = TaskId::parse(&format!("practice-{n}")).expect("a valid task id");
                let task = TaskRef::new(namespace.clone(), id, BriefVersion::FIRST);
                let brief = serde_json::json!({ "practice": n, "task": "return the brief" });
                let bytes = serde_json::to_vec(&brief).expect("a JSON value serializes");
                insert_task(
                    writer,
                    &task,
                    &queue,
                    &bytes,
                    "json",
                    TaskSpec::default(),
                    now,
                    &principal,
                )?;
            }
        }
        Ok(())
    }

    /// Extends the lease `token` on `task` that `caller` holds, by the
    /// store's lease duration from now (never shortening it).
    ///
    /// Needs the `claim` scope and the namespace grant. A stale, foreign or
    /// expired token, or a lease that ended, is `409 conflict`; an unknown
    /// task `404`. Writes the attempt's expiry (its row and its entry in
    /// the leased-attempts index) and the audit row, never the task row: a
    /// leased task is out of the claim index, and its lapse is found
    /// through that entry. Never enters claim admission.
    pub fn heartbeat(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
    ) -> Result<Lease, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Claim, Action::Heartbeat)?;
        let now = self.now_utc();
        let holder = caller.lease_principal();
        let extension = self.config.lease_duration();
        let lease = self.perform(&scope, now, |writer| {
            let (row, mut rules) = load_ref(writer, task, false)?;
            let lease = apply(writer, row.id, &mut rules, |rules| {
                rules.heartbeat(&holder, token, now, extension)
            })?;
            let resource = task.resource(&format!("/a{}/t{}", lease.attempt(), lease.token()));
            Ok((lease, resource))
        })?;
        self.namespace_changed(&task.namespace);
        Ok(lease)
    }

    /// Submits the output of the lease `token` on `task` under an
    /// idempotency key, and returns the receipt.
    ///
    /// Needs the `claim` scope and the namespace grant. The key is scoped to
    /// the caller's principal and the task. The same key with the same
    /// output digest returns the stored receipt as
    /// [`Submitted::Replayed`] and writes nothing (not even an audit row: a
    /// replay is counted), even after the lease ended; the same key with a
    /// different digest is `409 conflict`. A fresh submission needs the live
    /// lease (`409` for a stale, foreign or expired token) and writes the
    /// receipt, the attempt's state and the audit row in one transaction.
    pub fn submit(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        key: &IdempotencyKey,
        output: &Output,
    ) -> Result<Submitted, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Claim, Action::Submit)?;
        if let Some(bytes) = &output.bytes {
            check_brief_size(bytes.len())
                .map_err(Error::from)
                .inspect_err(|error| self.count(&scope, error.outcome()))?;
        }
        let submission = Submission {
            principal: caller.lease_principal(),
            token,
            key: key.clone(),
            digest: output.digest,
        };
        let principal = submission.principal.as_str().to_owned();
        // A replay is decided on a read connection, so it writes nothing.
        let stored = self
            .read(|reader| {
                let row = find_row(reader, task, false)?;
                sql::receipt_by_key(reader, &principal, row.id, key.as_str())?
                    .map(|stored| stored.stored(task))
                    .transpose()
            })
            .inspect_err(|error| self.count(&scope, error.outcome()))?;
        if let Some(stored) = stored {
            return match decide_idempotency(Some(&stored.receipt), &submission) {
                Idempotency::Replay(receipt) => {
                    self.count(&scope, Outcome::Ok);
                    Ok(Submitted::Replayed(receipt))
                }
                _ => {
                    let error = Error::from(LeaseError::IdempotencyConflict);
                    self.count(&scope, error.outcome());
                    Err(error)
                }
            };
        }
        let now = self.now_utc();
        let submitted = self.perform_or_count(&scope, now, |writer| {
            let (row, mut rules) = load_ref(writer, task, false)?;
            // Looked up again under the write lock: a concurrent retry may
            // have stored it since.
            let stored = sql::receipt_by_key(writer, &principal, row.id, key.as_str())?
                .map(|stored| stored.stored(task))
                .transpose()?;
            let submitted = apply(writer, row.id, &mut rules, |rules| {
                rules.submit(&submission, stored.as_ref().map(|s| &s.receipt), now)
            })?;
            let receipt = match &submitted {
                Submitted::Replayed(_) => return Ok((submitted, Trail::Count(Outcome::Ok))),
                Submitted::Accepted(receipt) => receipt,
            };
            sql::insert_receipt(
                writer,
                &NewReceipt {
                    task: row.id,
                    attempt: i64::from(receipt.attempt.as_u16()),
                    token: receipt.token.as_i64(),
                    principal: &principal,
                    idempotency_key: key.as_str(),
                    artifact: receipt.artifact.as_str(),
                    digest: &receipt.digest.to_string(),
                    accepted_at: millis(receipt.accepted_at),
                    output: output.bytes.as_deref(),
                },
            )?;
            let resource = task.resource(&format!("/a{}/t{}", receipt.attempt, receipt.token));
            Ok((submitted, Trail::Row(resource)))
        })?;
        if matches!(submitted, Submitted::Accepted(_)) {
            self.namespace_changed(&task.namespace);
        }
        Ok(submitted)
    }

    /// Ends the lease `token` on `task` with a failure report:
    /// [`Retry::Never`] fails its attempt for good, [`Retry::After`] makes
    /// it claimable again after the backoff (counted in whole
    /// milliseconds, as times are stored). Returns the attempt's new
    /// state. Same permissions and token rules as
    /// [`heartbeat`](Self::heartbeat).
    pub fn fail(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        retry: Retry,
    ) -> Result<TaskState, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Claim, Action::Fail)?;
        let now = self.now_utc();
        let holder = caller.lease_principal();
        let retry = match retry {
            Retry::After(backoff) => Retry::After(whole_millis(backoff)),
            Retry::Never => Retry::Never,
        };
        let state = self.perform(&scope, now, |writer| {
            let (row, mut rules) = load_ref(writer, task, false)?;
            let state = apply(writer, row.id, &mut rules, |rules| {
                rules.fail(&holder, token, now, retry)
            })?;
            Ok((state, task.resource(&format!("/t{token}"))))
        })?;
        self.namespace_changed(&task.namespace);
        Ok(state)
    }

    /// Returns the lapsed leases of `namespace` to their attempts' next
    /// state (ready, or a lapse backoff), at most `limit` tasks per call,
    /// and returns the tasks changed.
    ///
    /// Optional upkeep for hosts with a timer: a claim already takes over
    /// a lapsed lease whether or not this ran (it searches leases by when
    /// they lapse). The expired leases are found by reading the namespace's
    /// entries in the partial `attempts_leased` index (one per leased
    /// attempt, never a table scan). Not audited.
    pub fn expire_leases(
        &self,
        namespace: &Namespace,
        limit: usize,
    ) -> Result<Vec<TaskRef>, Error> {
        let now = self.now_utc();
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let changed = self.write(|writer| {
            let mut ids = sql::lapsed_leases(writer, namespace.as_str(), millis(now), limit)?;
            // A task with several lapsed attempts is listed once per attempt.
            ids.sort_unstable();
            ids.dedup();
            let mut changed = Vec::new();
            for id in ids {
                let Some(row) = sql::task_by_id(writer, id, false)? else {
                    continue;
                };
                let mut rules = load(writer, &row)?;
                if apply(writer, row.id, &mut rules, |rules| Ok(rules.expire(now)))?.is_empty() {
                    continue;
                }
                let record = rules.record();
                changed.push(TaskRef::new(
                    namespace.clone(),
                    record.id.clone(),
                    record.version,
                ));
            }
            Ok(changed)
        })?;
        if !changed.is_empty() {
            self.namespace_changed(namespace);
        }
        Ok(changed)
    }

    /// Reads a task: its brief, queue, attempts and leases. Needs the
    /// `read` scope and the namespace grant; audited as `read_task` naming
    /// the task.
    pub fn read_task(&self, caller: &Caller, task: &TaskRef) -> Result<TaskView, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ReadTask)?;
        self.perform_read(&scope, |reader| {
            let (mut row, rules) = load_ref(reader, task, true)?;
            let view = TaskView {
                task: task.clone(),
                queue: row.queue_name()?,
                brief: row.take_brief()?,
                created_at: from_millis(row.created_at),
                record: rules.into_record(),
            };
            Ok((view, task.resource("")))
        })
    }

    /// Reads the execution receipt of one attempt of `task`, with its
    /// output. Needs the `read` scope and the namespace grant; `404` if the
    /// attempt has none. Audited as `read_receipt` naming the run
    /// (`task:<id>@<version>/a<attempt>/t<token>`).
    pub fn read_receipt(
        &self,
        caller: &Caller,
        task: &TaskRef,
        attempt: AttemptNumber,
    ) -> Result<StoredReceipt, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ReadReceipt)?;
        self.perform_read(&scope, |reader| {
            let row = find_row(reader, task, false)?;
            let stored = sql::receipts_of_attempt(reader, row.id, i64::from(attempt.as_u16()))?
                .into_iter()
                .next()
                .ok_or_else(|| Error::NotFound {
                    what: format!("receipt of {task} attempt {attempt}"),
                })?
                .stored(task)?;
            let resource = task.resource(&format!(
                "/a{}/t{}",
                stored.receipt.attempt, stored.receipt.token
            ));
            Ok((stored, resource))
        })
    }

    /// The finished alternatives of `task`: one receipt per done attempt,
    /// in attempt order, with outputs, for a comparison step. Needs the
    /// `read` scope and the namespace grant; audited as `list_attempts`.
    pub fn alternatives(
        &self,
        caller: &Caller,
        task: &TaskRef,
    ) -> Result<Vec<StoredReceipt>, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ListAttempts)?;
        self.perform_read(&scope, |reader| {
            let (row, rules) = load_ref(reader, task, false)?;
            let stored = sql::receipts_of_task(reader, row.id, i64::from(MAX_ALTERNATIVES))?
                .into_iter()
                .map(|row| row.stored(task))
                .collect::<Result<Vec<_>, _>>()?;
            let chosen: Vec<StoredReceipt> = {
                let receipts: Vec<&Receipt> = stored.iter().map(|s| &s.receipt).collect();
                let kept = rules.alternatives(receipts.iter().copied());
                stored
                    .iter()
                    .filter(|s| kept.contains(&&s.receipt))
                    .cloned()
                    .collect()
            };
            Ok((chosen, task.resource("")))
        })
    }
}

/// Inserts a task and its attempts; `false` if the reference exists.
#[allow(clippy::too_many_arguments)]
fn insert_task(
    writer: &Writer<'_>,
    task: &TaskRef,
    queue: &QueueName,
    brief: &[u8],
    format: &str,
    spec: TaskSpec,
    now: DateTime<Utc>,
    enqueued_by: &str,
) -> Result<bool, Error> {
    let inserted = sql::insert_task(
        writer,
        &NewTask {
            namespace: task.namespace.as_str(),
            queue: queue.as_str(),
            task_id: task.id.as_str(),
            version: i64::from(task.version.as_u32()),
            brief,
            brief_format: format,
            alternatives: i64::from(spec.alternatives),
            lapse_backoff_ms: duration_millis(spec.lapse_backoff),
            created_at: millis(now),
            enqueued_by,
        },
    )?;
    let Some(id) = inserted else {
        return Ok(false);
    };
    for number in 1..=spec.alternatives {
        sql::insert_attempt(
            writer,
            id,
            i64::from(number),
            task.namespace.as_str(),
            queue.as_str(),
        )?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap()
            + chrono::TimeDelta::seconds(seconds)
    }

    #[test]
    fn claimable_at_mirrors_the_lease_rules() {
        let who = Principal::parse("p1").unwrap();
        let spec = TaskSpec {
            alternatives: 2,
            lapse_backoff: Duration::from_secs(5),
        };
        let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
        assert_eq!(claimable_at(task.record()), Some(0));
        task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
        assert_eq!(claimable_at(task.record()), Some(0), "attempt 2 is ready");
        let second = task.claim(&who, at(1), Duration::from_secs(30)).unwrap();
        // Both leased: out of the claim index; each lease's row holds its
        // lapse plus the lapse backoff.
        assert_eq!(claimable_at(task.record()), None);
        let lapses = |task: &Task| -> Vec<Option<i64>> {
            task.record()
                .attempts
                .iter()
                .map(|a| AttemptRow::from_record(a, spec.lapse_backoff).lapses_at)
                .collect()
        };
        assert_eq!(
            lapses(&task),
            vec![Some(millis(at(35))), Some(millis(at(36)))]
        );
        assert_eq!(task.next_claimable_at(at(2)), Some(at(35)));
        // A retry backoff puts it back, at the backoff's end.
        task.fail(
            &who,
            second.token(),
            at(2),
            Retry::After(Duration::from_secs(10)),
        )
        .unwrap();
        assert_eq!(claimable_at(task.record()), Some(millis(at(12))));
        assert_eq!(lapses(&task), vec![Some(millis(at(35))), None]);
        assert_eq!(task.next_claimable_at(at(2)), Some(at(12)));
    }

    #[test]
    fn attempt_rows_round_trip() {
        let who = Principal::parse("p1").unwrap();
        let mut task = Task::new(
            TaskId::parse("t").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap();
        task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
        let record = &task.record().attempts[0];
        let row = AttemptRow::from_record(record, Duration::ZERO);
        assert_eq!(row.lapses_at, row.expires_at, "leased, no lapse backoff");
        assert_eq!(&row.record().unwrap(), record);
        let mut broken = row.clone();
        broken.holder = None;
        assert!(broken.record().is_err());
    }

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
