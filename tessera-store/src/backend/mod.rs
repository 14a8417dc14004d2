//! The seam between the core and a database.
//!
//! The core runs every operation through these traits, with domain types
//! in and out; it never sees SQL, a connection or a driver's error. A
//! backend (`crate::sqlite`, and any other) implements them with its own
//! schema, migrations and query plans, and classifies its errors into a
//! [`StorageError`] by kind. The shape follows River's driver interface:
//! methods are whole operations with typed parameters, not statements.
//!
//! - [`Backend`]: one database, opened once; runs read and write
//!   transactions and answers the store-wide questions (metering, refusal).
//! - [`ReadTransaction`]: the reads an operation makes.
//! - [`WriteTransaction`]: the writes, inside one atomic transaction; it
//!   reads too, seeing its own writes.
//!
//! The store holds its backend as `Box<dyn Backend>`: the backend is chosen
//! at run time when the store is opened (a host picks SQLite or another
//! from its settings), the core is compiled once, and one virtual call per
//! statement is noise beside the statement itself.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, ParentEnd, PartitionKey, Principal, QueueName,
    ScheduleName, StateName, TaskRecord, UniqueSlot,
};

use crate::error::{Error, StorageError};
use crate::key::KeyId;
use crate::meter::MeterSnapshot;
use crate::model::access::{KeyInfo, PrincipalId, PrincipalKind};
use crate::model::audit::AuditCursor;
use crate::model::bulk::{BulkFilter, BulkPosition};
use crate::model::health::{QueueDepth, StateCounts};
use crate::model::queue::QueueSettings;
use crate::model::task::{ListOrder, StoredReceipt, TaskCursor, TaskListing, TaskRef};

pub(crate) mod rows;
pub(crate) mod schedules;
mod types;

pub(crate) use types::*;

/// What a backend's call returns: its value, or a classified fault.
pub(crate) type Result<T> = std::result::Result<T, StorageError>;

/// One database behind the store.
///
/// Transactions take their work as a closure over the transaction; the
/// work returns the store's [`Error`], so a rule that refuses (a stale
/// token, a conflict) rolls the transaction back like a storage fault.
/// Errors a backend returns are [`Error::Storage`] with a classified
/// [`StorageError`]; the store turns a quota refusal into `503` itself.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// Runs `work` on a read-only view of the last committed state.
    fn read(
        &self,
        work: &mut dyn FnMut(&dyn ReadTransaction) -> std::result::Result<(), Error>,
    ) -> std::result::Result<(), Error>;

    /// Runs `work` as one atomic write transaction at `now` (the day its
    /// rows count against): committed if it returns `Ok` and storage
    /// accepts it, rolled back whole otherwise.
    fn write(
        &self,
        now: DateTime<Utc>,
        work: &mut dyn FnMut(&dyn WriteTransaction) -> std::result::Result<(), Error>,
    ) -> std::result::Result<Committed, Error>;

    /// Starts or stops refusing every write, as a provider with a spent
    /// allowance does; reads go on.
    fn set_refusing(&self, refuse: bool);

    /// Whether writes are being refused.
    fn is_refusing(&self) -> bool;

    /// Rows written and read so far, where the backend meters them.
    fn meter(&self) -> MeterSnapshot;

    /// Rows written today (UTC), as the daily allowance counts them.
    fn rows_written_today(&self, now: DateTime<Utc>) -> u64;

    /// What the backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Releases what the backend holds before the store goes away (best
    /// effort, never fails).
    fn close(&mut self);

    /// Hands the backend what to call when it hears of a change made
    /// through another store on the same database. A backend that cannot
    /// hear of them ignores it (the default): its store's signals are then
    /// its own process's.
    fn listen(&self, _sink: SignalSink) {}

    /// How often a long-poll must read its queue again itself, because
    /// signals may be missed just now; `None` while every enqueue is
    /// signalled (the default).
    fn poll_interval(&self) -> Option<Duration> {
        None
    }

    /// Claims the first claimable task of a queue in one statement, its
    /// own transaction, where the backend can and the task is of the one
    /// shape the statement decides (see [`QuickClaim`]); [`QuickClaimed::Declined`]
    /// (the default) leaves the claim to the general lease transaction,
    /// with nothing written.
    fn claim_quick(&self, _claim: &QuickClaim<'_>) -> std::result::Result<QuickClaimed, Error> {
        Ok(QuickClaimed::Declined)
    }

    /// Accepts a submission and makes the next claim in one statement,
    /// its own transaction, where the backend can and both are of the
    /// shapes the statement decides (see [`QuickSubmit`] and
    /// [`QuickClaim`]); [`QuickSubmitted::Declined`] (the default) leaves
    /// both to the general transaction, with nothing written.
    fn submit_and_claim_quick(
        &self,
        _submit: &QuickSubmit<'_>,
        _claim: &QuickClaim<'_>,
    ) -> std::result::Result<QuickSubmitted, Error> {
        Ok(QuickSubmitted::Declined)
    }
}

/// The reads operations make.
#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
pub(crate) trait ReadTransaction {
    /// The key with this public id, with its principal.
    fn key(&self, key_id: &KeyId) -> Result<Option<StoredKey>>;

    /// Up to `limit` keys after `after` in key id order: one principal's,
    /// or everyone's.
    fn keys(
        &self,
        principal: Option<PrincipalId>,
        after: Option<&KeyId>,
        limit: usize,
    ) -> Result<Vec<KeyInfo>>;

    /// A principal's kind and account.
    fn principal(&self, principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>>;

    /// Audit events at or after `since` and before the cursor `before`,
    /// newest first, each with its own cursor: one principal's (by its
    /// audit name) or everyone's.
    fn events(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        before: Option<AuditCursor>,
        limit: usize,
    ) -> Result<Vec<(AuditCursor, AuditEvent)>>;

    /// Counters of minutes starting at or after `since`, newest minute
    /// first.
    fn counters(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Counter>>;

    /// Whether a namespace has been opened.
    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool>;

    /// A task, with its brief if `with_brief`.
    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>>;

    /// Where a task is, without loading its attempts.
    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>>;

    /// The task a claim of `queue` takes at `now`, with its brief, in
    /// `tessera-lease`'s claim order.
    fn next_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<Option<LoadedTask>>;

    /// Whether `queue` has a task claimable at `now`.
    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool>;

    /// The receipt `principal` stored under `key` for a task.
    fn receipt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredReceipt>>;

    /// The receipts of one attempt, oldest first.
    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>>;

    /// A task's receipts in attempt order, at most `limit`.
    fn receipts_of_task(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        limit: usize,
    ) -> Result<Vec<StoredReceipt>>;

    /// A namespace's attempts in `state`, in `order` of (task row, attempt
    /// number), after `after`, at most `limit`: one search of an index on
    /// (namespace, state, task, number).
    fn tasks_by_state(
        &self,
        namespace: &Namespace,
        state: StateName,
        order: ListOrder,
        after: Option<TaskCursor>,
        limit: usize,
    ) -> Result<Vec<(TaskCursor, TaskListing)>>;

    /// The attempts of a namespace that match `filter` and whose state
    /// last changed at or before `upto`, after `after` in (changed_at,
    /// task row, number) order, at most `limit`, each with its task:
    /// those at rest, or the leased ones when `after` is among them
    /// ([`BulkPosition::leased`]). One range of an index on (namespace,
    /// changed_at, task, number), the filter's time range its bounds.
    fn attempts_matching(
        &self,
        namespace: &Namespace,
        filter: &BulkFilter,
        after: BulkPosition,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(BulkPosition, TaskRef)>>;

    /// The last progress each attempt of a task was given, as JSON text,
    /// in attempt order; attempts without one are left out.
    fn progress_of_task(&self, handle: TaskHandle) -> Result<Vec<(AttemptNumber, String)>>;

    /// Attempts per state in a namespace, and how many leases there have
    /// expired by `now`.
    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)>;

    /// A store-wide setting kept in the database.
    fn meta(&self, key: &str) -> Result<Option<String>>;

    /// How many times `subject` was counted in the window starting at
    /// `start`.
    fn limit_count(&self, subject: &str, start: DateTime<Utc>) -> Result<u64>;

    /// A queue's stored settings, `None` when it has no row (running, no
    /// limit). In a write transaction a backend that locks rows locks the
    /// row for the rest of it, so claims of a limited queue count its
    /// leases one at a time.
    fn queue_settings(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<QueueSettings>>;

    /// Every queue of `namespace` with unfinished tasks, by name: its
    /// tasks claimable at `now`, those claimable later, and its leases.
    /// Reads the claim order and the lease index only.
    fn queue_depths(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<Vec<QueueDepth>>;

    /// Every stored queue setting of a namespace, by queue name.
    fn namespace_queue_settings(&self, namespace: &Namespace) -> Result<Vec<QueueSettings>>;

    /// A queue's own keep times for finished work, if it has them.
    fn queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<tessera_lease::Retention>>;

    /// Every queue of a namespace with keep times of its own, by name.
    fn namespace_retention(
        &self,
        namespace: &Namespace,
    ) -> Result<Vec<(QueueName, tessera_lease::Retention)>>;

    /// How many of the queue's attempts are stored as leased (lapsed ones
    /// whose lapse is not yet recorded included): the slots
    /// [`ConcurrencyLimit`](tessera_lease::ConcurrencyLimit) counts.
    fn leased_in_queue(&self, namespace: &Namespace, queue: &QueueName) -> Result<u32>;

    /// How many of the queue's attempts whose task has partition key
    /// `key` are stored as leased.
    fn leased_in_partition(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        key: &PartitionKey,
    ) -> Result<u32>;

    /// Up to about `limit` tasks claimable at `now` in `queue`, in the
    /// lease rules' claim order ([`ClaimKey`](tessera_lease::ClaimKey)),
    /// each once: what a claim that must skip some (a full partition)
    /// walks through. Index searches of `tasks_claim_order` and
    /// `attempts_lapse_order`, one per priority, highest first.
    fn claim_candidates(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>>;

    /// Namespace names after `after` in name order, at most `limit`.
    fn namespace_names(&self, after: Option<&Namespace>, limit: usize) -> Result<Vec<Namespace>>;

    /// Attempts of `namespace` in `state` (a final one) that reached it at
    /// or before `cutoff`, after `after` in (changed_at, task) order, at
    /// most `limit`: one range of the index of attempts at rest by when
    /// they changed.
    fn finished_attempts(
        &self,
        namespace: &Namespace,
        state: StateName,
        cutoff: DateTime<Utc>,
        after: FinishedPosition,
        limit: usize,
    ) -> Result<Vec<FinishedPosition>>;

    /// The task at `handle`, with its brief; in a write transaction a
    /// backend that locks rows locks it, or answers `None` if another
    /// transaction holds it.
    fn task_by_handle(&self, handle: TaskHandle) -> Result<Option<LoadedTask>>;

    /// How many of the task at `handle`'s parents have not ended: its
    /// edges not yet marked ended.
    fn open_parents(&self, child: TaskHandle) -> Result<u64>;

    /// The parents of the task at `child`, in the order its enqueue named
    /// them.
    fn parents_of(&self, child: TaskHandle) -> Result<Vec<TaskRef>>;

    /// Of the tasks at `parents`, those with a child still waiting:
    /// retention keeps them, and their outputs, for it.
    fn parents_of_waiting(&self, parents: &[TaskHandle]) -> Result<Vec<TaskHandle>>;

    /// A schedule, with its last fire.
    fn schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<Option<ScheduleRow>>;

    /// Up to `limit` schedules of a namespace after `after` in name order,
    /// paused ones included, each with its last fire.
    fn schedules_of(
        &self,
        namespace: &Namespace,
        after: Option<&ScheduleName>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>>;

    /// Up to `limit` unpaused schedules of every namespace after `after`
    /// in (namespace, name) order, each with its last fire.
    fn active_schedules(
        &self,
        after: Option<(&Namespace, &ScheduleName)>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>>;
}

/// The writes operations make, inside one transaction.
#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
pub(crate) trait WriteTransaction: ReadTransaction {
    /// This transaction as its reads.
    fn reads(&self) -> &dyn ReadTransaction;

    /// Inserts a principal and returns its id.
    fn insert_principal(
        &self,
        kind: PrincipalKind,
        account: &str,
        created_at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<PrincipalId>;

    /// Inserts a key; `false` if its key id is taken.
    fn insert_key(&self, key: &NewKey<'_>) -> Result<bool>;

    /// Changes a key.
    fn change_key(&self, key_id: &KeyId, change: KeyChange) -> Result<()>;

    /// Records a principal's `last_used_at`.
    fn touch_principal(&self, principal: PrincipalId, at: DateTime<Utc>) -> Result<()>;

    /// Appends an audit event.
    fn insert_event(&self, event: &AuditEvent) -> Result<()>;

    /// Adds a counter's count to its stored row, creating it if needed.
    fn add_counter(&self, counter: &Counter) -> Result<()>;

    /// One retention batch: deletes up to `limit` rows of `what` past
    /// `threshold`; returns how many.
    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize>;

    /// Opens a namespace unless it is open; returns whether it was opened.
    /// One with a purge time (an anonymous session's) is deleted with its
    /// tasks by retention from then on.
    fn insert_namespace(
        &self,
        namespace: &Namespace,
        kind: NamespaceKind,
        at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<bool>;

    /// Inserts a task and its attempts; `false` if the reference exists.
    fn insert_task(&self, task: &NewTask<'_>) -> Result<bool>;

    /// Inserts many tasks and their attempts; one entry per task, in
    /// order, `false` where its reference exists (before, or earlier in
    /// the same call). A backend that can should insert them set-based
    /// (the default inserts them one by one, as
    /// [`insert_task`](Self::insert_task)).
    fn insert_tasks(&self, tasks: &[NewTask<'_>]) -> Result<Vec<bool>> {
        tasks.iter().map(|task| self.insert_task(task)).collect()
    }

    /// Takes the unique `slot` of `queue` for `task`, which is about to be
    /// inserted, unless a task holds it: then it returns the holder's
    /// reference and writes nothing. One insert that meets the slots'
    /// unique index, never a lock; a concurrent transaction holding the
    /// slot is waited for where the backend has several writers.
    fn take_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
        ends_at: Option<DateTime<Utc>>,
        task: &TaskRef,
    ) -> Result<Option<TaskRef>>;

    /// Deletes up to `limit` unique slots whose window ended at or before
    /// `cutoff`, in the order they ended; answers how many.
    fn purge_ended_slots(&self, cutoff: DateTime<Utc>, limit: usize) -> Result<usize>;

    /// Gives back the unique `slot` of `queue` taken for a task that was not
    /// inserted after all (its reference existed).
    fn free_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
    ) -> Result<()>;

    /// Releases the unique slot the task at `handle` holds: its row in the
    /// slots' index goes, and the task's slot columns become `NULL`. A
    /// later enqueue with the same key creates a task.
    fn release_unique_slot(&self, handle: TaskHandle) -> Result<()>;

    /// Replaces a task's brief ([`Brief::encode`]'s bytes and format).
    fn replace_brief(&self, handle: TaskHandle, brief: &[u8], format: &str) -> Result<()>;

    /// Writes what a lease rule changed between `before` and `after` at
    /// `at` (the `changed_at` of each attempt whose state it wrote).
    fn save_task(
        &self,
        handle: TaskHandle,
        before: &TaskRecord,
        after: &TaskRecord,
        at: DateTime<Utc>,
    ) -> Result<()>;

    /// Writes `writes` to the task at `handle`: what
    /// [`save_task`](Self::save_task) writes, with the receipts its
    /// attempts' state writes carry.
    fn save_writes(&self, handle: TaskHandle, writes: rows::TaskWrites) -> Result<()>;

    /// Writes what a heartbeat changed, as [`save_task`](Self::save_task),
    /// and the progress value (JSON text) it carried for `attempt`, in
    /// the statement that moves the lease's expiry.
    fn save_heartbeat(
        &self,
        handle: TaskHandle,
        before: &TaskRecord,
        after: &TaskRecord,
        at: DateTime<Utc>,
        attempt: AttemptNumber,
        progress: &str,
    ) -> Result<()>;

    /// Rewrites what the claim order keeps of a task from its record, for
    /// stored claim times the lease rules disagree with.
    fn resync_task(&self, handle: TaskHandle, record: &TaskRecord) -> Result<()>;

    /// Tasks of a namespace (of its `queue` alone, if given) with an
    /// expired lease, at most `limit`, each once, loaded; those of one
    /// queue in the order their leases expired.
    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        queue: Option<&QueueName>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>>;

    /// Up to `count` claimable tasks of `queue` at `now` in claim order,
    /// with their briefs, each locked for the rest of the transaction (a
    /// task another transaction holds is skipped): a batch claim's tasks
    /// in one statement, where the backend can. `None` when it cannot,
    /// when the queue has a settings row (paused or limited), when it
    /// found no claimable task, or when the queue has a due lapsed lease,
    /// whose recording comes first in claim order; the
    /// claim then takes its tasks one at a time with
    /// [`next_claimable`](ReadTransaction::next_claimable). The default
    /// is `None`.
    fn lock_claimable(
        &self,
        _namespace: &Namespace,
        _queue: &QueueName,
        _now: DateTime<Utc>,
        _count: usize,
    ) -> Result<Option<Vec<LoadedTask>>> {
        Ok(None)
    }

    /// Many tasks at once, without their briefs, each locked for the
    /// rest of the transaction where the backend locks rows; `None` for
    /// a reference with no task. One entry per reference, in order. The
    /// caller passes them sorted, so two transactions locking several
    /// tasks take them in one order and never wait on each other in a
    /// circle. A backend that can should read them in one statement (the
    /// default loads them one by one).
    fn lock_tasks(&self, tasks: &[&TaskRef]) -> Result<Vec<Option<LoadedTask>>> {
        tasks.iter().map(|task| self.task(task, false)).collect()
    }

    /// The receipts stored under many keys at once, one entry per key, in
    /// order (the default reads them one by one).
    fn receipts_by_key(&self, keys: &[ReceiptKey<'_>]) -> Result<Vec<Option<StoredReceipt>>> {
        keys.iter()
            .map(|key| self.receipt(key.task, key.handle, key.principal, key.key))
            .collect()
    }

    /// Writes what a batch of acknowledgements decided: what lease rules
    /// changed in many tasks (each at most once), the receipts they
    /// accepted (each in the row of the attempt it ended, written with
    /// that attempt's state) and their audit rows, in order. A backend
    /// that can should write them set-based, in as few statements as it
    /// can (the default writes them one task at a time, as
    /// [`save_writes`](Self::save_writes) and
    /// [`insert_event`](Self::insert_event) do).
    fn write_acknowledged(
        &self,
        changes: &[TaskChange<'_>],
        receipts: &[NewReceipt<'_>],
        events: &[AuditEvent],
    ) -> Result<()> {
        for (change, writes) in changes
            .iter()
            .zip(rows::acknowledged_writes(changes, receipts)?)
        {
            self.save_writes(change.handle, writes)?;
        }
        events.iter().try_for_each(|event| self.insert_event(event))
    }

    /// Sets a store-wide setting unless one is set.
    fn insert_meta(&self, key: &str, value: &str) -> Result<()>;

    /// Tells the stores of other processes on this database, once the
    /// transaction commits, that `queue` received work (the default: no
    /// one else to tell).
    fn signal_enqueued(&self, _namespace: &Namespace, _queue: &QueueName) -> Result<()> {
        Ok(())
    }

    /// Counts `window.subject` once more in its window.
    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()>;

    /// The tasks of `handles` another transaction does not hold, locked
    /// for the rest of this one, each with its attempts' states and when
    /// each was reached; gone ones left out.
    fn lock_finished(&self, handles: &[TaskHandle]) -> Result<Vec<FinishedTask>>;

    /// Deletes the tasks of `handles` with every row of their own: their
    /// attempts, receipts and unique slot. Returns the rows deleted.
    fn delete_tasks(&self, handles: &[TaskHandle]) -> Result<usize>;

    /// Writes edges: each child waits on its parent. On a backend whose
    /// one-statement submissions skip the general transaction, each
    /// parent's row counts its children, so those statements leave a
    /// parent to it; the caller holds each parent locked.
    fn insert_edges(&self, edges: &[NewEdge]) -> Result<()>;

    /// Marks the open edges of each parent in `parents` ended as it ended,
    /// and answers them: each child, its rule and the parent's end, with
    /// the child's reference. Each edge ends once, so a child is told of
    /// each parent once however many transactions end parents at once.
    fn end_edges(&self, parents: &[(TaskHandle, ParentEnd)]) -> Result<Vec<EndedEdge>>;

    /// Holds `row`'s lock until the transaction ends, whether or not the
    /// row exists yet, so read-modify-writes of it take turns and each
    /// reads what the one before it wrote. The default does nothing, for a
    /// backend whose writes take turns anyway (SQLite); PostgreSQL takes a
    /// transaction-level advisory lock on the row's name.
    fn lock_row(&self, row: RowLock<'_>) -> Result<()> {
        let _ = row;
        Ok(())
    }

    /// Stores a queue's settings at `now`, or deletes its row when every
    /// setting is the default.
    fn put_queue_settings(
        &self,
        namespace: &Namespace,
        settings: &QueueSettings,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Stores a queue's own keep times at `now`, or deletes them (`None`:
    /// the store's apply).
    fn put_queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        retention: Option<&tessera_lease::Retention>,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Inserts a schedule, or replaces every column of the one with its
    /// namespace and name but its creation time and creator.
    fn put_schedule(&self, schedule: &ScheduleRow) -> Result<()>;

    /// Deletes a schedule and its fires; `false` if there was none.
    fn delete_schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<bool>;

    /// A schedule with its last fire, locked for the rest of the
    /// transaction where the backend locks rows, so two fires of one
    /// schedule take turns and each sees the other's last fire (the
    /// default reads it, for a backend whose writes take turns anyway).
    fn lock_schedule(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<Option<ScheduleRow>> {
        self.schedule(namespace, name)
    }

    /// Records a fire; `false`, writing nothing, if its run-at is in the
    /// unique index already.
    fn insert_fire(&self, fire: &NewFire<'_>) -> Result<bool>;

    /// Deletes a schedule's fire rows but its latest, at most `limit`:
    /// a fire is due only after the latest fire, which a scheduler reads
    /// under the schedule's lock, so the older rows decide nothing. One
    /// range of `schedule_fires_run_at`. Returns the rows deleted.
    fn trim_fires(&self, namespace: &Namespace, name: &ScheduleName, limit: usize)
    -> Result<usize>;

    /// Runs `work` as the transaction's optional tail: a write it may carry
    /// but must never fail for (an observation). If it fails it alone is
    /// rolled back; if the transaction fits the daily allowance only
    /// without it, it is dropped before the commit. At most one, and last.
    /// Returns whether it is part of the transaction so far.
    fn optional(&self, work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<()>) -> bool;
}
