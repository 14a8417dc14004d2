//! [`ReadTransaction`] on a read connection, and on the write connection
//! inside a write transaction.

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, PartitionKey, Principal, QueueName, ScheduleName,
    StateName,
};

use super::load;
use crate::backend::rows::{
    self, CounterRow, KeyRow, QueueRetentionRow, QueueSettingsRow, corrupt, count, millis,
    minute_number, state_counts,
};
use crate::backend::{
    FinishedPosition, LoadedTask, ReadTransaction, Result, ScheduleRow, StoredKey, TaskHandle,
};
use crate::key::KeyId;
use crate::model::access::{KeyInfo, PrincipalId, PrincipalKind};
use crate::model::audit::AuditCursor;
use crate::model::bulk::{BulkFilter, BulkPosition};
use crate::model::health::{QueueDepth, StateCounts};
use crate::model::queue::QueueSettings;
use crate::model::task::{ListOrder, StoredReceipt, TaskCursor, TaskListing, TaskRef};
use crate::sqlite::readers::Reader;
use crate::sqlite::statements::{
    attempts, audit, claim, edges, health, keys, limits, meta, namespaces, queues, receipts,
    schedules, tasks,
};
use crate::sqlite::writer::Writer;

impl ReadTransaction for Reader<'_> {
    fn namespace_names(&self, after: Option<&Namespace>, limit: usize) -> Result<Vec<Namespace>> {
        let after = after.map_or("", Namespace::as_str);
        namespaces::namespace_names(self, after, count(limit))?
            .iter()
            .map(|name| Namespace::parse(name).map_err(|_| corrupt("a namespace's name")))
            .collect()
    }

    fn finished_attempts(
        &self,
        namespace: &Namespace,
        state: StateName,
        cutoff: DateTime<Utc>,
        after: FinishedPosition,
        limit: usize,
    ) -> Result<Vec<FinishedPosition>> {
        Ok(attempts::finished_attempts(
            self,
            namespace.as_str(),
            state.as_str(),
            millis(cutoff),
            after,
            count(limit),
        )?)
    }

    fn key(&self, key_id: &KeyId) -> Result<Option<StoredKey>> {
        keys::key_by_key_id(self, key_id.as_str())?
            .map(KeyRow::stored)
            .transpose()
    }

    fn keys(
        &self,
        principal: Option<PrincipalId>,
        after: Option<&KeyId>,
        limit: usize,
    ) -> Result<Vec<KeyInfo>> {
        let after = after.map_or("", KeyId::as_str);
        let rows = match principal {
            Some(principal) => keys::keys_of_principal(self, principal.0, after, count(limit))?,
            None => keys::keys_all(self, after, count(limit))?,
        };
        rows.iter().map(KeyRow::info).collect()
    }

    fn principal(&self, principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>> {
        keys::principal_by_id(self, principal.0)?
            .map(|(kind, account)| {
                let kind = PrincipalKind::parse(&kind).ok_or_else(|| corrupt("principal kind"))?;
                Ok((kind, account))
            })
            .transpose()
    }

    fn events(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        before: Option<AuditCursor>,
        limit: usize,
    ) -> Result<Vec<(AuditCursor, AuditEvent)>> {
        let before = before.map(|cursor| (cursor.at, cursor.id));
        audit::events(self, principal, millis(since), before, count(limit))?
            .iter()
            .map(|row| Ok((row.cursor(), row.event()?)))
            .collect()
    }

    fn counters(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Counter>> {
        audit::counters(self, principal, minute_number(since), count(limit))?
            .iter()
            .map(CounterRow::counter)
            .collect()
    }

    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool> {
        Ok(namespaces::namespace_exists(self, namespace.as_str())?)
    }

    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>> {
        let row = tasks::task_by_ref(
            self,
            task.namespace.as_str(),
            task.id.as_str(),
            i64::from(task.version.as_u32()),
            with_brief,
        )?;
        row.map(|row| load(self, row)).transpose()
    }

    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>> {
        let row = tasks::task_by_ref(
            self,
            task.namespace.as_str(),
            task.id.as_str(),
            i64::from(task.version.as_u32()),
            false,
        )?;
        Ok(row.map(|row| TaskHandle(row.id)))
    }

    /// Index searches of `tasks_claim_order` and `attempts_lapse_order`, one
    /// per priority down to the first with a due entry, and the chosen
    /// task's row; the lease rules' claim order decides.
    fn next_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<Option<LoadedTask>> {
        let (namespace, queue, now) = (namespace.as_str(), queue.as_str(), millis(now));
        let row = rows::next_claimable(
            claim::oldest_claimable(self, namespace, queue, now)?,
            |floor| Ok(claim::oldest_lapsed(self, namespace, queue, now, floor)?),
            |task| Ok(tasks::task_by_id(self, task, true)?),
        )?;
        row.map(|row| load(self, row)).transpose()
    }

    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(claim::has_claimable(
            self,
            namespace.as_str(),
            queue.as_str(),
            millis(now),
        )?)
    }

    fn receipt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredReceipt>> {
        receipts::receipt_by_key(self, principal.as_str(), handle.0, key.as_str())?
            .map(|row| row.stored(task))
            .transpose()
    }

    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>> {
        receipts::receipts_of_attempt(self, handle.0, i64::from(attempt.as_u16()))?
            .into_iter()
            .map(|row| row.stored(task))
            .collect()
    }

    fn receipts_of_task(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        limit: usize,
    ) -> Result<Vec<StoredReceipt>> {
        receipts::receipts_of_task(self, handle.0, count(limit))?
            .into_iter()
            .map(|row| row.stored(task))
            .collect()
    }

    fn tasks_by_state(
        &self,
        namespace: &Namespace,
        state: StateName,
        order: ListOrder,
        after: Option<TaskCursor>,
        limit: usize,
    ) -> Result<Vec<(TaskCursor, TaskListing)>> {
        // The cursor's row is the attempt's row id here.
        let (sql, start) = match order {
            ListOrder::Oldest => (attempts::TASKS_BY_STATE_OLDEST, 0),
            ListOrder::Newest => (attempts::TASKS_BY_STATE_NEWEST, i64::MAX),
        };
        let after = after.map_or(start, |cursor| cursor.row);
        attempts::tasks_by_state(
            self,
            sql,
            namespace.as_str(),
            state.as_str(),
            after,
            count(limit),
        )?
        .into_iter()
        .map(|row| row.listing(namespace))
        .collect()
    }

    fn attempts_matching(
        &self,
        namespace: &Namespace,
        filter: &BulkFilter,
        after: BulkPosition,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(BulkPosition, TaskRef)>> {
        let Some((start, end)) = rows::bulk_range(filter, after, upto) else {
            return Ok(Vec::new());
        };
        let found = attempts::attempts_matching(
            self,
            start.leased,
            namespace.as_str(),
            (start.changed_at, start.task, start.number),
            end,
            filter.queue.as_ref().map(QueueName::as_str),
            filter.state.map(StateName::as_str),
            filter.partition_key.as_ref().map(PartitionKey::as_str),
            count(limit),
        )?;
        rows::matching(namespace, start.leased, found)
    }

    fn progress_of_task(&self, handle: TaskHandle) -> Result<Vec<(AttemptNumber, String)>> {
        rows::progress_list(attempts::progress_of_task(self, handle.0)?)
    }

    /// Attempts per state from the `attempts_state` index and the expired
    /// leases from the namespace's `attempts_leased` entries.
    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)> {
        let attempts = state_counts(health::count_by_state(self, namespace.as_str())?)?;
        let expired = health::count_lapsed_leases(self, namespace.as_str(), millis(now))?;
        Ok((attempts, u64::try_from(expired).unwrap_or(0)))
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(meta::meta_value(self, key)?)
    }

    fn schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<Option<ScheduleRow>> {
        schedules::schedule(self, namespace.as_str(), name.as_str())
    }

    fn schedules_of(
        &self,
        namespace: &Namespace,
        after: Option<&ScheduleName>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        let after = after.map_or("", ScheduleName::as_str);
        schedules::schedules_of(self, namespace.as_str(), after, limit)
    }

    fn active_schedules(
        &self,
        after: Option<(&Namespace, &ScheduleName)>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        let after = after.map_or(("", ""), |(namespace, name)| {
            (namespace.as_str(), name.as_str())
        });
        schedules::active_schedules(self, after, limit)
    }

    fn limit_count(&self, subject: &str, start: DateTime<Utc>) -> Result<u64> {
        let stored = limits::limit_count(self, subject, millis(start))?;
        Ok(u64::try_from(stored).unwrap_or(0))
    }

    fn queue_settings(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<QueueSettings>> {
        queues::queue_settings(self, namespace.as_str(), queue.as_str())?
            .map(QueueSettingsRow::settings)
            .transpose()
    }

    fn queue_depths(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<Vec<QueueDepth>> {
        let claimable = health::queue_claimable(self, namespace.as_str(), millis(now))?;
        let leased = health::queue_leased(self, namespace.as_str())?;
        let oldest = health::queue_oldest_ready(self, namespace.as_str(), millis(now))?;
        rows::queue_depths(claimable, leased, oldest)
    }

    fn namespace_queue_settings(&self, namespace: &Namespace) -> Result<Vec<QueueSettings>> {
        queues::namespace_queue_settings(self, namespace.as_str())?
            .into_iter()
            .map(QueueSettingsRow::settings)
            .collect()
    }

    fn queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<tessera_lease::Retention>> {
        queues::queue_retention(self, namespace.as_str(), queue.as_str())?
            .map(|row| Ok(row.retention()?.1))
            .transpose()
    }

    fn namespace_retention(
        &self,
        namespace: &Namespace,
    ) -> Result<Vec<(QueueName, tessera_lease::Retention)>> {
        queues::namespace_retention(self, namespace.as_str())?
            .into_iter()
            .map(QueueRetentionRow::retention)
            .collect()
    }

    fn leased_in_queue(&self, namespace: &Namespace, queue: &QueueName) -> Result<u32> {
        let leased = claim::leased_in_queue(self, namespace.as_str(), queue.as_str())?;
        Ok(u32::try_from(leased).unwrap_or(u32::MAX))
    }

    fn leased_in_partition(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        key: &PartitionKey,
    ) -> Result<u32> {
        let leased =
            claim::leased_in_partition(self, namespace.as_str(), queue.as_str(), key.as_str())?;
        Ok(u32::try_from(leased).unwrap_or(u32::MAX))
    }

    fn claim_candidates(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>> {
        rows::claim_candidates(limit, |priority, limit| {
            Ok(claim::candidates(
                self,
                namespace.as_str(),
                queue.as_str(),
                priority,
                millis(now),
                count(limit),
            )?)
        })
    }

    fn task_by_handle(&self, handle: TaskHandle) -> Result<Option<LoadedTask>> {
        tasks::task_by_id(self, handle.0, true)?
            .map(|row| load(self, row))
            .transpose()
    }

    fn open_parents(&self, child: TaskHandle) -> Result<u64> {
        Ok(u64::try_from(edges::open_parents(self, child.0)?).unwrap_or(0))
    }

    fn parents_of_waiting(&self, parents: &[TaskHandle]) -> Result<Vec<TaskHandle>> {
        let mut kept = Vec::new();
        for parent in parents {
            if edges::parent_of_waiting(self, parent.0)? {
                kept.push(*parent);
            }
        }
        Ok(kept)
    }

    fn parents_of(&self, child: TaskHandle) -> Result<Vec<TaskRef>> {
        edges::parents_of(self, child.0)?
            .into_iter()
            .map(|(namespace, id, version)| rows::stored_task_ref(&namespace, &id, version))
            .collect()
    }
}

/// A write transaction reads through its own connection, seeing its own
/// writes.
macro_rules! reads_through_writer {
    ($($name:ident($($arg:ident: $type:ty),*) -> $out:ty;)*) => {
        impl ReadTransaction for Writer<'_> {
            $(fn $name(&self, $($arg: $type),*) -> $out {
                let reader: &Reader<'_> = self;
                reader.$name($($arg),*)
            })*
        }
    };
}

reads_through_writer! {
    key(key_id: &KeyId) -> Result<Option<StoredKey>>;
    keys(principal: Option<PrincipalId>, after: Option<&KeyId>, limit: usize) -> Result<Vec<KeyInfo>>;
    principal(principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>>;
    events(principal: Option<&str>, since: DateTime<Utc>, before: Option<AuditCursor>, limit: usize) -> Result<Vec<(AuditCursor, AuditEvent)>>;
    counters(principal: Option<&str>, since: DateTime<Utc>, limit: usize) -> Result<Vec<Counter>>;
    namespace_exists(namespace: &Namespace) -> Result<bool>;
    task(task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>>;
    find_task(task: &TaskRef) -> Result<Option<TaskHandle>>;
    next_claimable(namespace: &Namespace, queue: &QueueName, now: DateTime<Utc>) -> Result<Option<LoadedTask>>;
    has_claimable(namespace: &Namespace, queue: &QueueName, now: DateTime<Utc>) -> Result<bool>;
    receipt(task: &TaskRef, handle: TaskHandle, principal: &Principal, key: &IdempotencyKey) -> Result<Option<StoredReceipt>>;
    receipts_of_attempt(task: &TaskRef, handle: TaskHandle, attempt: AttemptNumber) -> Result<Vec<StoredReceipt>>;
    receipts_of_task(task: &TaskRef, handle: TaskHandle, limit: usize) -> Result<Vec<StoredReceipt>>;
    health(namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)>;
    attempts_matching(namespace: &Namespace, filter: &BulkFilter, after: BulkPosition, upto: DateTime<Utc>, limit: usize) -> Result<Vec<(BulkPosition, TaskRef)>>;
    progress_of_task(handle: TaskHandle) -> Result<Vec<(AttemptNumber, String)>>;
    tasks_by_state(namespace: &Namespace, state: StateName, order: ListOrder, after: Option<TaskCursor>, limit: usize) -> Result<Vec<(TaskCursor, TaskListing)>>;
    meta(key: &str) -> Result<Option<String>>;
    limit_count(subject: &str, start: DateTime<Utc>) -> Result<u64>;
    queue_settings(namespace: &Namespace, queue: &QueueName) -> Result<Option<QueueSettings>>;
    queue_depths(namespace: &Namespace, now: DateTime<Utc>) -> Result<Vec<QueueDepth>>;
    namespace_queue_settings(namespace: &Namespace) -> Result<Vec<QueueSettings>>;
    queue_retention(namespace: &Namespace, queue: &QueueName) -> Result<Option<tessera_lease::Retention>>;
    namespace_retention(namespace: &Namespace) -> Result<Vec<(QueueName, tessera_lease::Retention)>>;
    leased_in_queue(namespace: &Namespace, queue: &QueueName) -> Result<u32>;
    leased_in_partition(namespace: &Namespace, queue: &QueueName, key: &PartitionKey) -> Result<u32>;
    claim_candidates(namespace: &Namespace, queue: &QueueName, now: DateTime<Utc>, limit: usize) -> Result<Vec<TaskHandle>>;
    namespace_names(after: Option<&Namespace>, limit: usize) -> Result<Vec<Namespace>>;
    finished_attempts(namespace: &Namespace, state: StateName, cutoff: DateTime<Utc>, after: FinishedPosition, limit: usize) -> Result<Vec<FinishedPosition>>;
    task_by_handle(handle: TaskHandle) -> Result<Option<LoadedTask>>;
    open_parents(child: TaskHandle) -> Result<u64>;
    parents_of(child: TaskHandle) -> Result<Vec<TaskRef>>;
    parents_of_waiting(parents: &[TaskHandle]) -> Result<Vec<TaskHandle>>;
    schedule(namespace: &Namespace, name: &ScheduleName) -> Result<Option<ScheduleRow>>;
    schedules_of(namespace: &Namespace, after: Option<&ScheduleName>, limit: usize) -> Result<Vec<ScheduleRow>>;
    active_schedules(after: Option<(&Namespace, &ScheduleName)>, limit: usize) -> Result<Vec<ScheduleRow>>;
}
