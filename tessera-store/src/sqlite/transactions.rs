//! The seam's read and write transactions on SQLite: each operation of
//! [`ReadTransaction`] and [`WriteTransaction`] as statements, and the rows
//! they read turned back into domain records.

use chrono::{DateTime, Utc};
use rusqlite::params;
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, PartitionKey, Principal, QueueName, Receipt,
    ScheduleName, StateName, TaskRecord, UniqueKey, UniqueSlot,
};

use super::access as keys;
use super::audit as events;
use super::readers::Reader;
use super::schedules;
use super::session as meta;
use super::tasks::{self as sql, NewReceipt};
use super::writer::Writer;
use crate::backend::rows::{
    self, AttemptRow, AttemptWrite, CounterRow, EventRow, KeyRow, QueueRetentionRow,
    QueueSettingsRow, TaskRow, TaskWrites, claimable_column, corrupt, count, duration_millis,
    millis, minute_number, state_counts, to_json,
};
use crate::backend::{
    FinishedPosition, FinishedTask, KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewFire,
    NewKey, NewTask, Purge, ReadTransaction, Result, ScheduleRow, StoredKey, TaskHandle,
    WriteTransaction,
};
use crate::key::KeyId;
use crate::model::access::{KeyInfo, PrincipalId, PrincipalKind};
use crate::model::audit::AuditCursor;
use crate::model::bulk::{BulkFilter, BulkPosition};
use crate::model::health::{QueueDepth, StateCounts};
use crate::model::queue::QueueSettings;
use crate::model::task::{ListOrder, StoredReceipt, TaskCursor, TaskListing, TaskRef};

/// A task row with its attempts.
fn load(reader: &Reader<'_>, row: TaskRow) -> Result<LoadedTask> {
    let attempts = sql::attempts_of_task(reader, row.id)?;
    row.loaded(attempts)
}

impl ReadTransaction for Reader<'_> {
    fn namespace_names(&self, after: Option<&Namespace>, limit: usize) -> Result<Vec<Namespace>> {
        let after = after.map_or("", Namespace::as_str);
        sql::namespace_names(self, after, count(limit))?
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
        Ok(sql::finished_attempts(
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
        events::events(self, principal, millis(since), before, count(limit))?
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
        events::counters(self, principal, minute_number(since), count(limit))?
            .iter()
            .map(CounterRow::counter)
            .collect()
    }

    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool> {
        Ok(sql::namespace_exists(self, namespace.as_str())?)
    }

    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>> {
        let row = sql::task_by_ref(
            self,
            task.namespace.as_str(),
            task.id.as_str(),
            i64::from(task.version.as_u32()),
            with_brief,
        )?;
        row.map(|row| load(self, row)).transpose()
    }

    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>> {
        let row = sql::task_by_ref(
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
            sql::oldest_claimable(self, namespace, queue, now)?,
            |floor| Ok(sql::oldest_lapsed(self, namespace, queue, now, floor)?),
            |task| Ok(sql::task_by_id(self, task, true)?),
        )?;
        row.map(|row| load(self, row)).transpose()
    }

    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(sql::has_claimable(
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
        sql::receipt_by_key(self, principal.as_str(), handle.0, key.as_str())?
            .map(|row| row.stored(task))
            .transpose()
    }

    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>> {
        sql::receipts_of_attempt(self, handle.0, i64::from(attempt.as_u16()))?
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
        sql::receipts_of_task(self, handle.0, count(limit))?
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
            ListOrder::Oldest => (sql::TASKS_BY_STATE_OLDEST, 0),
            ListOrder::Newest => (sql::TASKS_BY_STATE_NEWEST, i64::MAX),
        };
        let after = after.map_or(start, |cursor| cursor.row);
        sql::tasks_by_state(
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
        let found = sql::attempts_matching(
            self,
            namespace.as_str(),
            (start.changed_at, start.task, start.number),
            end,
            filter.queue.as_ref().map(QueueName::as_str),
            filter.state.map(StateName::as_str),
            filter.partition_key.as_ref().map(PartitionKey::as_str),
            count(limit),
        )?;
        rows::matching(namespace, found)
    }

    fn progress_of_task(&self, handle: TaskHandle) -> Result<Vec<(AttemptNumber, String)>> {
        rows::progress_list(sql::progress_of_task(self, handle.0)?)
    }

    /// Attempts per state from the `attempts_state` index and the expired
    /// leases from the namespace's `attempts_leased` entries.
    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)> {
        let attempts = state_counts(sql::count_by_state(self, namespace.as_str())?)?;
        let expired = sql::count_lapsed_leases(self, namespace.as_str(), millis(now))?;
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
        let stored = meta::limit_count(self, subject, millis(start))?;
        Ok(u64::try_from(stored).unwrap_or(0))
    }

    fn queue_settings(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<QueueSettings>> {
        meta::queue_settings(self, namespace.as_str(), queue.as_str())?
            .map(QueueSettingsRow::settings)
            .transpose()
    }

    fn queue_depths(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<Vec<QueueDepth>> {
        let claimable = sql::queue_claimable(self, namespace.as_str(), millis(now))?;
        let leased = sql::queue_leased(self, namespace.as_str())?;
        rows::queue_depths(claimable, leased)
    }

    fn namespace_queue_settings(&self, namespace: &Namespace) -> Result<Vec<QueueSettings>> {
        meta::namespace_queue_settings(self, namespace.as_str())?
            .into_iter()
            .map(QueueSettingsRow::settings)
            .collect()
    }

    fn queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<tessera_lease::Retention>> {
        meta::queue_retention(self, namespace.as_str(), queue.as_str())?
            .map(|row| Ok(row.retention()?.1))
            .transpose()
    }

    fn namespace_retention(
        &self,
        namespace: &Namespace,
    ) -> Result<Vec<(QueueName, tessera_lease::Retention)>> {
        meta::namespace_retention(self, namespace.as_str())?
            .into_iter()
            .map(QueueRetentionRow::retention)
            .collect()
    }

    fn leased_in_queue(&self, namespace: &Namespace, queue: &QueueName) -> Result<u32> {
        let leased = meta::leased_in_queue(self, namespace.as_str(), queue.as_str())?;
        Ok(u32::try_from(leased).unwrap_or(u32::MAX))
    }

    fn leased_in_partition(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        key: &PartitionKey,
    ) -> Result<u32> {
        let leased =
            meta::leased_in_partition(self, namespace.as_str(), queue.as_str(), key.as_str())?;
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
            Ok(meta::candidates(
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
        sql::task_by_id(self, handle.0, true)?
            .map(|row| load(self, row))
            .transpose()
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
    schedule(namespace: &Namespace, name: &ScheduleName) -> Result<Option<ScheduleRow>>;
    schedules_of(namespace: &Namespace, after: Option<&ScheduleName>, limit: usize) -> Result<Vec<ScheduleRow>>;
    active_schedules(after: Option<(&Namespace, &ScheduleName)>, limit: usize) -> Result<Vec<ScheduleRow>>;
}

/// Runs `writes` on task row `handle`, each with its narrowest statement.
fn write_task(writer: &Writer<'_>, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
    let id = handle.0;
    let mut progress = writes.progress.as_ref();
    for write in &writes.attempts {
        match write {
            AttemptWrite::State(row) => {
                sql::update_attempt_state(writer, id, row, writes.changed_at)?
            }
            AttemptWrite::Expiry(row) => match progress {
                Some((number, value)) if *number == row.number => {
                    sql::save_progress(writer, id, *number, Some(row), value)?;
                    progress = None;
                }
                _ => sql::extend_attempt(writer, id, row)?,
            },
            AttemptWrite::Whole(row) => sql::update_attempt(writer, id, row, writes.changed_at)?,
        }
    }
    if let Some((number, value)) = progress {
        sql::save_progress(writer, id, *number, None, value)?;
    }
    match (writes.last_token, writes.claimable_at) {
        (Some(token), Some(claimable)) => sql::update_task(writer, id, token, claimable)?,
        (Some(token), None) => sql::update_token(writer, id, token)?,
        (None, Some(claimable)) => sql::update_claimable(writer, id, claimable)?,
        (None, None) => {}
    }
    if let Some(max_tries) = writes.max_tries {
        sql::update_max_tries(writer, id, max_tries)?;
    }
    Ok(())
}

impl WriteTransaction for Writer<'_> {
    fn reads(&self) -> &dyn ReadTransaction {
        self
    }

    fn insert_principal(
        &self,
        kind: PrincipalKind,
        account: &str,
        created_at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<PrincipalId> {
        let id = keys::insert_principal(
            self,
            kind.as_str(),
            account,
            millis(created_at),
            purge_at.map(millis),
        )?;
        Ok(PrincipalId(id))
    }

    fn insert_key(&self, key: &NewKey<'_>) -> Result<bool> {
        let inserted = keys::insert_key(
            self,
            &keys::NewKey {
                key_id: key.key_id.as_str(),
                principal_id: key.principal.0,
                secret_hash: key.secret_hash,
                label: key.label,
                scopes: &to_json(&key.scopes),
                grants: &to_json(&key.grants),
                created_at: millis(key.created_at),
                expires_at: key.expires_at.map(millis),
                purge_at: key.purge_at.map(millis),
            },
        )?;
        Ok(inserted.is_some())
    }

    fn change_key(&self, key_id: &KeyId, change: KeyChange) -> Result<()> {
        match change {
            KeyChange::Revoke(at) => keys::revoke_key(self, key_id.as_str(), millis(at))?,
            KeyChange::Expire(at) => keys::expire_key(self, key_id.as_str(), millis(at))?,
        }
        Ok(())
    }

    fn touch_principal(&self, principal: PrincipalId, at: DateTime<Utc>) -> Result<()> {
        Ok(keys::touch_principal(self, principal.0, millis(at))?)
    }

    fn insert_event(&self, event: &AuditEvent) -> Result<()> {
        Ok(events::insert_event(self, &EventRow::from_event(event))?)
    }

    fn add_counter(&self, counter: &Counter) -> Result<()> {
        Ok(events::add_to_counter(
            self,
            &CounterRow::from_counter(counter),
        )?)
    }

    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize> {
        let (at, limit) = (millis(threshold), count(limit));
        let batch = |statement| events::purge(self, statement, at, limit);
        Ok(match what {
            Purge::Keys => batch(events::PURGE_KEYS),
            Purge::Principals => batch(events::PURGE_PRINCIPALS),
            Purge::Limits => batch(events::PURGE_LIMITS),
            Purge::Namespaces => batch(sql::PURGE_NAMESPACES),
            Purge::Events => events::purge_events(self, at, limit),
            Purge::Counters => events::purge_counters(self, minute_number(threshold), limit),
            Purge::SessionTasks => sql::purge_session_tasks(self, at, limit),
        }?)
    }

    fn lock_finished(&self, handles: &[TaskHandle]) -> Result<Vec<FinishedTask>> {
        // The writer holds the database: nothing else can change them.
        let mut tasks = Vec::with_capacity(handles.len());
        for handle in handles {
            let Some((namespace, queue)) = sql::task_place(self, handle.0)? else {
                continue;
            };
            let mut task = rows::finished_task(handle.0, &namespace, &queue)?;
            for (state, at) in sql::attempt_ends(self, handle.0)? {
                task.attempts.push(rows::attempt_end(&state, at)?);
            }
            tasks.push(task);
        }
        Ok(tasks)
    }

    fn delete_tasks(&self, handles: &[TaskHandle]) -> Result<usize> {
        let mut deleted = 0;
        for handle in handles {
            deleted += sql::delete_task(self, handle.0)?;
        }
        Ok(deleted)
    }

    fn insert_namespace(
        &self,
        namespace: &Namespace,
        kind: NamespaceKind,
        at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        Ok(sql::insert_namespace(
            self,
            namespace.as_str(),
            kind.as_str(),
            millis(at),
            purge_at.map(millis),
        )?)
    }

    fn insert_task(&self, task: &NewTask<'_>) -> Result<bool> {
        let (reference, record) = (task.task, task.record);
        let priority = i64::from(record.priority);
        let inserted = sql::insert_task(
            self,
            &sql::NewTask {
                namespace: reference.namespace.as_str(),
                queue: task.queue.as_str(),
                task_id: reference.id.as_str(),
                version: i64::from(reference.version.as_u32()),
                brief: task.brief,
                brief_format: task.brief_format,
                alternatives: record.attempts.len() as i64,
                lapse_backoff_ms: duration_millis(record.lapse_backoff),
                max_tries: i64::from(record.max_tries),
                created_at: millis(task.created_at),
                enqueued_by: task.enqueued_by,
                claimable_at: claimable_column(record),
                priority,
                partition_key: task.partition_key.map(PartitionKey::as_str),
                unique_key: task.unique_key.map(UniqueKey::as_str),
                unique_slot: task.unique.map(|unique| unique.slot.as_str()),
                unique_states: task.unique.map(|unique| i64::from(unique.states.bits())),
                lease_ms: rows::timing_columns(record).0,
                deadline_at: rows::timing_columns(record).1,
            },
        )?;
        let Some(id) = inserted else {
            return Ok(false);
        };
        for attempt in &record.attempts {
            sql::insert_attempt(
                self,
                id,
                reference.namespace.as_str(),
                task.queue.as_str(),
                priority,
                &AttemptRow::from_record(attempt, record.lapse_backoff),
                millis(task.created_at),
            )?;
        }
        Ok(true)
    }

    fn take_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
        ends_at: Option<DateTime<Utc>>,
        task: &TaskRef,
    ) -> Result<Option<TaskRef>> {
        let (ns, queue, slot) = (namespace.as_str(), queue.as_str(), slot.as_str());
        let version = i64::from(task.version.as_u32());
        let taken = self.execute(
            sql::TAKE_UNIQUE_SLOT,
            params![
                ns,
                queue,
                slot,
                task.id.as_str(),
                version,
                ends_at.map(millis)
            ],
        )?;
        if taken == 1 {
            return Ok(None);
        }
        let reader: &Reader<'_> = self;
        let holder = reader.optional(sql::UNIQUE_SLOT_HOLDER, params![ns, queue, slot], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })?;
        let (id, version) = holder.ok_or_else(|| corrupt("unique slot"))?;
        Ok(Some(rows::task_ref(namespace, &id, version)?))
    }

    fn purge_ended_slots(&self, cutoff: DateTime<Utc>, limit: usize) -> Result<usize> {
        Ok(self.execute(
            sql::PURGE_ENDED_SLOTS,
            params![millis(cutoff), limit as i64],
        )?)
    }

    fn free_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
    ) -> Result<()> {
        self.execute(
            sql::FREE_UNIQUE_SLOT,
            params![namespace.as_str(), queue.as_str(), slot.as_str()],
        )?;
        Ok(())
    }

    fn release_unique_slot(&self, handle: TaskHandle) -> Result<()> {
        for statement in sql::RELEASE_UNIQUE_SLOT {
            self.execute(statement, [handle.0])?;
        }
        Ok(())
    }

    fn replace_brief(&self, handle: TaskHandle, brief: &[u8], format: &str) -> Result<()> {
        self.execute(sql::REPLACE_BRIEF, params![handle.0, brief, format])?;
        Ok(())
    }

    fn save_task(
        &self,
        handle: TaskHandle,
        before: &TaskRecord,
        after: &TaskRecord,
        at: DateTime<Utc>,
    ) -> Result<()> {
        write_task(self, handle, TaskWrites::between(before, after, at))
    }

    fn save_heartbeat(
        &self,
        handle: TaskHandle,
        before: &TaskRecord,
        after: &TaskRecord,
        at: DateTime<Utc>,
        attempt: AttemptNumber,
        progress: &str,
    ) -> Result<()> {
        let mut writes = TaskWrites::between(before, after, at);
        writes.progress = Some((i64::from(attempt.as_u16()), progress.to_owned()));
        write_task(self, handle, writes)
    }

    fn resync_task(&self, handle: TaskHandle, record: &TaskRecord) -> Result<()> {
        write_task(self, handle, TaskWrites::resync(record))
    }

    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        queue: Option<&QueueName>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>> {
        let listed = sql::lapsed_leases(
            self,
            namespace.as_str(),
            queue.map(QueueName::as_str),
            millis(now),
            count(limit),
        )?;
        // A task with several lapsed attempts is listed once per attempt.
        let mut ids: Vec<i64> = Vec::with_capacity(listed.len());
        for id in listed {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(row) = sql::task_by_id(self, id, false)? {
                tasks.push(load(self, row)?);
            }
        }
        Ok(tasks)
    }

    fn insert_receipt(
        &self,
        handle: TaskHandle,
        receipt: &Receipt,
        output: Option<&[u8]>,
    ) -> Result<()> {
        Ok(sql::insert_receipt(
            self,
            &NewReceipt {
                task: handle.0,
                attempt: i64::from(receipt.attempt.as_u16()),
                token: receipt.token.as_i64(),
                principal: receipt.principal.as_str(),
                idempotency_key: receipt.idempotency_key.as_str(),
                artifact: receipt.artifact.as_str(),
                digest: &receipt.digest.to_string(),
                accepted_at: millis(receipt.accepted_at),
                output,
            },
        )?)
    }

    fn insert_meta(&self, key: &str, value: &str) -> Result<()> {
        Ok(meta::insert_meta(self, key, value)?)
    }

    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()> {
        Ok(meta::bump_limit(
            self,
            window.subject,
            millis(window.start),
            millis(window.end),
        )?)
    }

    fn put_queue_settings(
        &self,
        namespace: &Namespace,
        settings: &QueueSettings,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let row = (!settings.is_unset()).then(|| QueueSettingsRow::of(settings));
        Ok(meta::put_queue_settings(
            self,
            namespace.as_str(),
            settings.queue.as_str(),
            row.as_ref(),
            millis(now),
        )?)
    }

    fn put_queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        retention: Option<&tessera_lease::Retention>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        Ok(meta::put_queue_retention(
            self,
            namespace.as_str(),
            queue.as_str(),
            retention.map(QueueRetentionRow::columns),
            millis(now),
        )?)
    }

    fn put_schedule(&self, schedule: &ScheduleRow) -> Result<()> {
        schedules::put_schedule(self, schedule)
    }

    fn delete_schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<bool> {
        schedules::delete_schedule(self, namespace.as_str(), name.as_str())
    }

    fn insert_fire(&self, fire: &NewFire<'_>) -> Result<bool> {
        schedules::insert_fire(self, fire)
    }

    fn trim_fires(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
        limit: usize,
    ) -> Result<usize> {
        schedules::trim_fires(self, namespace.as_str(), name.as_str(), count(limit))
    }

    fn optional(&self, work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<()>) -> bool {
        self.run_optional(|writer| work(writer))
    }
}
