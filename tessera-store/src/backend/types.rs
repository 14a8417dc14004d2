//! The seam's data: what the core hands a backend and what a backend
//! hands back, beside the traits in the module above.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tessera_admission::DailyRowAllowance;
use tessera_lease::{
    IdempotencyKey, Namespace, ParentEnd, PartitionKey, Principal, QueueName, Receipt, RunAfter,
    ScheduleName, StateName, TaskId, TaskRecord, UniqueKey, UniqueSlot, UniqueStates,
};

use crate::key::KeyId;
use crate::model::access::{Grant, KeyInfo, PrincipalId, Scope};
use crate::model::task::{Brief, TaskRef};

use super::rows;

/// A submission that a backend may accept in one statement, with the
/// next claim ([`Backend::submit_and_claim_quick`]).
///
/// The statement accepts it when it needs no decision beyond the
/// statement's: the task's single attempt, leased under the token to
/// the submitting principal and not expired, no unique slot held, and no
/// receipt under the key. It writes the attempt done, the receipt and the
/// audit row, and returns the task as it was before, so the store checks
/// the acceptance against the lease rules. Anything else (a replay, a
/// stale token, several attempts, a slot to release) it declines.
#[derive(Debug, Clone)]
// Only a backend that submits in one statement reads it.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct QuickSubmit<'a> {
    pub(crate) task: &'a TaskRef,
    pub(crate) submission: &'a tessera_lease::Submission,
    pub(crate) output: Option<&'a [u8]>,
    /// The acceptance's audit row, its resource included.
    pub(crate) event: rows::EventRow,
}

/// What a [`Backend::submit_and_claim_quick`] came to.
#[derive(Debug, Clone)]
// Only a backend that submits in one statement makes all of them.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum QuickSubmitted {
    /// The statement could not decide the submission or the claim:
    /// nothing was written.
    Declined,
    /// The submission was accepted and the claim made
    /// ([`QuickClaimed::Leased`]) or found the queue empty
    /// ([`QuickClaimed::Empty`]), committed together.
    Accepted(Box<QuickAcceptance>),
}

/// A submission a [`Backend::submit_and_claim_quick`] accepted, as the
/// statement wrote it, and its claim.
#[derive(Debug, Clone)]
// Only a backend that submits in one statement makes one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct QuickAcceptance {
    /// The submitted task as it was before, without its brief.
    pub(crate) before: LoadedTask,
    /// The submitted attempt's row as the statement wrote it.
    pub(crate) after: rows::AttemptRow,
    /// The receipt's acceptance time as written.
    pub(crate) accepted_at: DateTime<Utc>,
    /// The audit row's resource as written.
    pub(crate) resource: Option<String>,
    /// The claim: [`QuickClaimed::Leased`] or [`QuickClaimed::Empty`].
    pub(crate) claimed: QuickClaimed,
}

/// A claim of one task that a backend may make in one statement.
///
/// The statement takes the queue's first task of the claim index, locked
/// or skipped as the general claim takes it, when it is of the shape
/// whose grant needs no decision beyond the statement's: one attempt,
/// ready, with no due lapsed lease of a higher priority before it. It
/// writes the attempt's lease under the task's next token, the task's
/// token counter and claim column, and the audit row, and returns the
/// task as it was before, so the store checks the grant against the lease
/// rules. Anything else (a lapse to record, a backoff or schedule that
/// ended, an attempt out of step with its claim column, several
/// attempts, a unique slot held, a queue with settings: paused or
/// limited) it declines, writing nothing.
#[derive(Debug, Clone)]
// Only a backend that claims in one statement reads it.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct QuickClaim<'a> {
    pub(crate) namespace: &'a Namespace,
    pub(crate) queue: &'a QueueName,
    /// The lease's holder.
    pub(crate) holder: &'a Principal,
    /// The grant's time.
    pub(crate) now: DateTime<Utc>,
    /// The lease's expiry, from the lease rules' arithmetic.
    pub(crate) expires_at: DateTime<Utc>,
    /// The audit row of the grant, but its resource, which names the
    /// task the statement takes.
    pub(crate) event: rows::EventRow,
}

/// A grant of a [`Backend::claim_quick`], as the statement made it.
#[derive(Debug, Clone)]
// Only a backend that claims in one statement makes one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct QuickGrant {
    /// The task as it was before the grant, its brief included.
    pub(crate) before: LoadedTask,
    /// The leased attempt's row as the statement wrote it.
    pub(crate) after: rows::AttemptRow,
    /// The audit row's resource as the statement wrote it.
    pub(crate) resource: Option<String>,
}

/// What a [`Backend::claim_quick`] came to.
#[derive(Debug, Clone)]
// Only a backend that claims in one statement makes all of them.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum QuickClaimed {
    /// The statement could not decide: the general lease transaction
    /// claims. Nothing was written.
    Declined,
    /// Nothing in the queue was claimable (and nothing written).
    Empty,
    /// No claimable task was free, but one was seen that another
    /// statement held locked (or took since the statement's snapshot):
    /// the claim asks again rather than answer empty. Nothing was written
    /// for the claim.
    Skipped,
    /// One grant, committed.
    Leased(Box<QuickGrant>),
}

/// What a backend heard of.
#[derive(Debug, Clone, Copy)]
// Only a backend that hears other processes makes them.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Signal<'a> {
    /// A queue received work.
    Enqueued {
        namespace: &'a Namespace,
        queue: &'a QueueName,
    },
    /// Signals stopped arriving for a while: every long-poll looks again.
    Lost,
}

/// What a backend calls with a [`Signal`].
pub(crate) type SignalSink = Arc<dyn Fn(Signal<'_>) + Send + Sync>;

/// What the store's policy asks of a backend when it opens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenPolicy {
    pub(crate) now: DateTime<Utc>,
    pub(crate) refuse_writes: bool,
    pub(crate) daily_rows_written_allowance: u64,
    /// How the backend coalesces what one process's threads commit (the
    /// PostgreSQL backend's coalesced statements).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) ack_batching: crate::config::AckBatching,
}

impl OpenPolicy {
    /// What `config` asks, at its clock's now.
    pub(crate) fn of(config: &crate::config::StoreConfig) -> Self {
        Self {
            now: crate::clock::storable(config.clock().now_utc()),
            refuse_writes: config.refuses_writes(),
            daily_rows_written_allowance: config.daily_rows_written_allowance(),
            ack_batching: config.ack_batching(),
        }
    }
}

/// What a backend can do beyond the operations every backend has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Whether [`Backend::meter`] counts rows (and the daily allowance can
    /// be kept).
    pub(crate) metered: bool,
    /// Whether a claim passes over a task another transaction holds
    /// locked (PostgreSQL's `SKIP LOCKED`), so that one that found nothing
    /// may have passed over work: it looks again before it answers empty.
    pub(crate) skips_locked: bool,
    /// Whether every statement and commit is a round trip to a server
    /// (PostgreSQL), so that a claim carried in a submission's
    /// transaction saves one, and the submissions several threads carry
    /// at once share a statement. In the process (SQLite) a commit costs
    /// no trip, the writer takes one transaction at a time, and a
    /// [`Worker`](crate::Worker) refilling ten at once does less than ten
    /// submissions carrying a claim each.
    pub(crate) round_trips: bool,
}

/// How a committed write transaction ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Committed {
    /// Whether its optional tail ([`WriteTransaction::optional`]) was kept.
    pub(crate) tail: bool,
}

/// A task's place in the backend, valid for as long as the task exists.
///
/// The core never reads it; it hands back what a load gave it, so a
/// write after a load finds the task without a second search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TaskHandle(pub(crate) i64);

/// A task as loaded: its lease record with where it lives.
#[derive(Debug, Clone)]
pub(crate) struct LoadedTask {
    /// Where it is.
    pub(crate) handle: TaskHandle,
    /// Its queue.
    pub(crate) queue: QueueName,
    /// When it was enqueued.
    pub(crate) created_at: DateTime<Utc>,
    /// Its brief, when the load asked for it.
    pub(crate) brief: Option<Brief>,
    /// Its partition key, if it has one.
    pub(crate) partition_key: Option<PartitionKey>,
    /// Its unique key, if it was enqueued unique.
    pub(crate) unique_key: Option<UniqueKey>,
    /// While it holds its unique slot: the states in which it does.
    pub(crate) unique_held: Option<UniqueStates>,
    /// Its attempts, leases and token counter.
    pub(crate) record: TaskRecord,
}

/// A task to insert, with its attempts all ready.
#[derive(Debug, Clone)]
pub(crate) struct NewTask<'a> {
    pub(crate) task: &'a TaskRef,
    pub(crate) queue: &'a QueueName,
    /// The encoded brief and its format name ([`Brief::encode`]).
    pub(crate) brief: &'a [u8],
    pub(crate) brief_format: &'a str,
    /// The task as the lease rules made it ([`Task::new`](tessera_lease::Task::new)):
    /// its attempts' first states and its claim time are written as they are.
    pub(crate) record: &'a TaskRecord,
    pub(crate) created_at: DateTime<Utc>,
    /// The enqueuing principal's name.
    pub(crate) enqueued_by: &'a str,
    /// Its partition key.
    pub(crate) partition_key: Option<&'a PartitionKey>,
    /// Its unique key, if it is unique.
    pub(crate) unique_key: Option<&'a UniqueKey>,
    /// The unique slot it holds (taken already, by
    /// [`WriteTransaction::take_unique_slot`]), if it holds one.
    pub(crate) unique: Option<NewUnique<'a>>,
    /// The store drew its id (`t-` and the enqueue time, then random
    /// bits): no stored task has its reference, so a backend may insert
    /// it without looking for one (a collision, with an id someone chose
    /// by hand, fails the transaction and writes nothing). The PostgreSQL
    /// backend's set-based insert reads it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) drawn_id: bool,
}

/// What a task holding a unique slot stores: the slot, and the states in
/// which it holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewUnique<'a> {
    pub(crate) slot: &'a UniqueSlot,
    pub(crate) states: UniqueStates,
}

/// A receipt to look up: the one `principal` stored under `key` for a
/// task.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReceiptKey<'a> {
    pub(crate) task: &'a TaskRef,
    pub(crate) handle: TaskHandle,
    pub(crate) principal: &'a Principal,
    pub(crate) key: &'a IdempotencyKey,
}

/// What lease rules made of one task: its record as loaded and as it is
/// now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TaskChange<'a> {
    pub(crate) handle: TaskHandle,
    pub(crate) before: &'a TaskRecord,
    pub(crate) after: &'a TaskRecord,
    /// When the rules ran: the changed attempts' `changed_at`.
    pub(crate) at: DateTime<Utc>,
}

/// An edge to write: `child` waits on `parent`, under `run_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewEdge {
    pub(crate) parent: TaskHandle,
    pub(crate) child: TaskHandle,
    pub(crate) run_after: RunAfter,
    /// How the parent ended, if it had at the child's enqueue.
    pub(crate) ended: Option<ParentEnd>,
    /// The parent's place in the child's list.
    pub(crate) place: usize,
}

/// An edge whose parent ended, as [`end_edges`](super::WriteTransaction::end_edges)
/// answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndedEdge {
    pub(crate) child: TaskRef,
    pub(crate) run_after: RunAfter,
    pub(crate) end: ParentEnd,
}

/// An accepted receipt to store, with the output bytes if kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewReceipt<'a> {
    pub(crate) handle: TaskHandle,
    pub(crate) receipt: &'a Receipt,
    pub(crate) output: Option<&'a [u8]>,
}

/// Whether a namespace belongs to a keyed principal or a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NamespaceKind {
    Keyed,
    Session,
}

impl NamespaceKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Session => "session",
        }
    }
}

/// A key as stored: what a caller may see, and the hash it is checked by.
#[derive(Debug, Clone)]
pub(crate) struct StoredKey {
    pub(crate) info: KeyInfo,
    /// SHA-256 of the whole presented key.
    pub(crate) secret_hash: Vec<u8>,
}

/// A key to insert.
#[derive(Debug, Clone)]
pub(crate) struct NewKey<'a> {
    pub(crate) key_id: &'a KeyId,
    pub(crate) principal: PrincipalId,
    pub(crate) secret_hash: &'a [u8],
    pub(crate) label: &'a str,
    pub(crate) scopes: &'a [Scope],
    pub(crate) grants: &'a [Grant],
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// When retention deletes it (anonymous sessions only).
    pub(crate) purge_at: Option<DateTime<Utc>>,
}

/// A key change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyChange {
    /// Revoked at this time.
    Revoke(DateTime<Utc>),
    /// Stops working at this time.
    Expire(DateTime<Utc>),
}

/// What one retention batch deletes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Anonymous sessions' keys whose purge time is at or before the
    /// threshold.
    Keys,
    /// Anonymous principals, likewise.
    Principals,
    /// Per-address limit rows, likewise.
    Limits,
    /// Audit events older than the threshold.
    Events,
    /// Counters of minutes that start before the threshold (SQLite,
    /// which overwrites a counter's row a day later, deletes those that
    /// went quiet).
    Counters,
    /// Tasks (with their attempts and receipts) of namespaces whose purge
    /// time is at or before the threshold: what an anonymous session made.
    SessionTasks,
    /// Namespaces past their purge time whose tasks are gone.
    Namespaces,
}

impl Purge {
    /// Every table retention deletes from, in the order it runs.
    pub(crate) const ALL: [Purge; 7] = [
        Self::Keys,
        Self::Principals,
        Self::Limits,
        Self::Events,
        Self::Counters,
        Self::SessionTasks,
        Self::Namespaces,
    ];
}

/// A per-address limit window's stored count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitWindow<'a> {
    /// Who is counted, e.g. `mint:<ip hash>`.
    pub(crate) subject: &'a str,
    pub(crate) start: DateTime<Utc>,
    /// When the row may be deleted (the window's end).
    pub(crate) end: DateTime<Utc>,
}

/// A periodic schedule as stored: its cron text and zone as written, its
/// brief encoded as a task's, its enqueue options as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
// Only a build with the `schedule` feature reads and writes them.
#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
pub(crate) struct ScheduleRow {
    pub(crate) namespace: Namespace,
    pub(crate) name: ScheduleName,
    pub(crate) queue: QueueName,
    pub(crate) cron: String,
    pub(crate) zone: String,
    pub(crate) brief: Vec<u8>,
    pub(crate) brief_format: String,
    pub(crate) options: String,
    pub(crate) paused: bool,
    /// Run-ats at or before it never fire.
    pub(crate) active_since: DateTime<Utc>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    /// Who put it first: its fires' tasks are enqueued as this principal.
    pub(crate) created_by: String,
    /// The last run-at fired, when reading (ignored when writing).
    pub(crate) last_run_at: Option<DateTime<Utc>>,
}

/// One fire to record: the run-at of a schedule, and its task.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
pub(crate) struct NewFire<'a> {
    pub(crate) namespace: &'a Namespace,
    pub(crate) schedule: &'a ScheduleName,
    pub(crate) run_at: DateTime<Utc>,
    pub(crate) task_id: &'a TaskId,
    pub(crate) fired_at: DateTime<Utc>,
}

/// A finished task's place and what retention weighs: each attempt's
/// state and when it was reached.
#[derive(Debug, Clone)]
pub(crate) struct FinishedTask {
    pub(crate) handle: TaskHandle,
    pub(crate) namespace: Namespace,
    pub(crate) queue: QueueName,
    pub(crate) attempts: Vec<(StateName, DateTime<Utc>)>,
}

/// Where a search of finished attempts stands: the (changed_at in ms,
/// task row) of the last entry read.
pub(crate) type FinishedPosition = (i64, i64);

/// A row a read-modify-write changes, named whether or not it exists yet
/// (see [`WriteTransaction::lock_row`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowLock<'a> {
    /// A queue's settings.
    QueueSettings(&'a Namespace, &'a QueueName),
    /// A schedule.
    #[cfg_attr(not(feature = "schedule"), allow(dead_code))]
    Schedule(&'a Namespace, &'a ScheduleName),
    /// An API key.
    Key(&'a KeyId),
    /// A rate limit's count in its window (`access_limits`).
    Limit(&'a str),
}

impl RowLock<'_> {
    /// The lock's name: distinct for distinct rows (names hold no `/`).
    /// PostgreSQL locks by it; SQLite's writer is alone.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn name(self) -> String {
        match self {
            Self::QueueSettings(namespace, queue) => format!("queue/{namespace}/{queue}"),
            Self::Schedule(namespace, name) => format!("schedule/{namespace}/{name}"),
            Self::Key(key) => format!("key/{key}"),
            Self::Limit(subject) => format!("limit/{subject}"),
        }
    }
}

/// How a transaction that wrote `rows`, `tail` of them in its optional
/// tail, fits today's rows-written allowance at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Commit it whole.
    Whole,
    /// Roll the optional tail back, then commit the rest.
    WithoutTail,
    /// Roll it all back: `503 storage_quota_exhausted`.
    Refused,
}

impl Fit {
    /// The allowance's verdict ([`DailyRowAllowance`]); a tail that alone
    /// takes the transaction past it is given up, never the action.
    pub(crate) fn of(
        allowance: &mut DailyRowAllowance,
        now: DateTime<Utc>,
        rows: u64,
        tail: Option<u64>,
    ) -> Self {
        if allowance.admits(now, rows) {
            return Self::Whole;
        }
        match tail {
            Some(tail) if allowance.admits(now, rows.saturating_sub(tail)) => Self::WithoutTail,
            _ => Self::Refused,
        }
    }
}
