//! [`WriteTransaction`] on the write connection: each write as the
//! narrowest statements that make it.

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, Namespace, ParentEnd, PartitionKey, QueueName, ScheduleName, TaskRecord,
    UniqueKey, UniqueSlot,
};

use super::load;
use crate::backend::rows::{
    self, AttemptRow, AttemptWrite, CounterRow, EventRow, QueueRetentionRow, QueueSettingsRow,
    TaskWrites, claimable_column, corrupt, count, duration_millis, millis, minute_number, to_json,
};
use crate::backend::{
    EndedEdge, FinishedTask, KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewEdge, NewFire,
    NewKey, NewTask, Purge, ReadTransaction, Result, ScheduleRow, TaskHandle, WriteTransaction,
};
use crate::key::KeyId;
use crate::model::access::{PrincipalId, PrincipalKind};
use crate::model::queue::QueueSettings;
use crate::model::task::TaskRef;
use crate::sqlite::statements::unique_slots::{self, Take};
use crate::sqlite::statements::{
    attempts, audit, edges, keys, limits, meta, namespaces, queues, schedules, tasks,
};
use crate::sqlite::writer::Writer;

/// Runs `writes` on task row `handle`, each with its narrowest statement.
fn write_task(writer: &Writer<'_>, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
    let id = handle.0;
    let mut progress = writes.progress.as_ref();
    for write in &writes.attempts {
        match write {
            AttemptWrite::State(row) => attempts::update_attempt_state(
                writer,
                id,
                row,
                writes.changed_at,
                writes.receipt(row.number),
            )?,
            AttemptWrite::Expiry(row) => match progress {
                Some((number, value)) if *number == row.number => {
                    attempts::save_progress(writer, id, *number, Some(row), value)?;
                    progress = None;
                }
                _ => attempts::extend_attempt(writer, id, row)?,
            },
            AttemptWrite::Whole(row) => {
                attempts::update_attempt(writer, id, row, writes.changed_at)?
            }
        }
    }
    if let Some((number, value)) = progress {
        attempts::save_progress(writer, id, *number, None, value)?;
    }
    match (writes.last_token, writes.claimable_at) {
        (Some(token), Some(claimable)) => tasks::update_task(writer, id, token, claimable)?,
        (Some(token), None) => tasks::update_token(writer, id, token)?,
        (None, Some(claimable)) => tasks::update_claimable(writer, id, claimable)?,
        (None, None) => {}
    }
    if let Some(max_tries) = writes.max_tries {
        tasks::update_max_tries(writer, id, max_tries)?;
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
        Ok(audit::insert_event(self, &EventRow::from_event(event))?)
    }

    fn add_counter(&self, counter: &Counter) -> Result<()> {
        Ok(audit::add_to_counter(
            self,
            &CounterRow::from_counter(counter),
        )?)
    }

    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize> {
        let (at, limit) = (millis(threshold), count(limit));
        Ok(match what {
            Purge::Keys => keys::purge_keys(self, at, limit),
            Purge::Principals => keys::purge_principals(self, at, limit),
            Purge::Limits => limits::purge_limits(self, at, limit),
            Purge::Namespaces => namespaces::purge_namespaces(self, at, limit),
            Purge::Events => audit::purge_events(self, at, limit),
            Purge::Counters => audit::purge_counters(self, minute_number(threshold), limit),
            Purge::SessionTasks => tasks::purge_session_tasks(self, at, limit),
        }?)
    }

    fn lock_finished(&self, handles: &[TaskHandle]) -> Result<Vec<FinishedTask>> {
        // The writer holds the database: nothing else can change them.
        let mut tasks = Vec::with_capacity(handles.len());
        for handle in handles {
            let Some((namespace, queue)) = tasks::task_place(self, handle.0)? else {
                continue;
            };
            let mut task = rows::finished_task(handle.0, &namespace, &queue)?;
            for (state, at) in attempts::attempt_ends(self, handle.0)? {
                task.attempts.push(rows::attempt_end(&state, at)?);
            }
            tasks.push(task);
        }
        Ok(tasks)
    }

    fn insert_edges(&self, new: &[NewEdge]) -> Result<()> {
        for edge in new {
            edges::insert_edge(
                self,
                (edge.parent.0, edge.child.0),
                edge.run_after.as_str(),
                edge.ended.map(ParentEnd::as_str),
                count(edge.place),
            )?;
        }
        Ok(())
    }

    fn end_edges(&self, parents: &[(TaskHandle, ParentEnd)]) -> Result<Vec<EndedEdge>> {
        let mut ended = Vec::new();
        for (parent, end) in parents {
            for (_, run_after, namespace, task_id, version) in
                edges::end_edges(self, parent.0, end.as_str())?
            {
                ended.push(rows::ended_edge(
                    &namespace, &task_id, version, &run_after, *end,
                )?);
            }
        }
        Ok(ended)
    }

    fn delete_tasks(&self, handles: &[TaskHandle]) -> Result<usize> {
        let mut deleted = 0;
        for handle in handles {
            deleted += tasks::delete_task(self, handle.0)?;
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
        Ok(namespaces::insert_namespace(
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
        let inserted = tasks::insert_task(
            self,
            &tasks::NewTask {
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
            attempts::insert_attempt(
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
        let version = i64::from(task.version.as_u32());
        let taken = unique_slots::take_unique_slot(
            self,
            namespace.as_str(),
            queue.as_str(),
            slot.as_str(),
            (task.id.as_str(), version),
            ends_at.map(millis),
        )?;
        match taken {
            Take::Taken => Ok(None),
            Take::Held(id, version) => Ok(Some(rows::task_ref(namespace, &id, version)?)),
            Take::HolderMissing => Err(corrupt("unique slot")),
        }
    }

    fn purge_ended_slots(&self, cutoff: DateTime<Utc>, limit: usize) -> Result<usize> {
        Ok(unique_slots::purge_ended_slots(
            self,
            millis(cutoff),
            limit as i64,
        )?)
    }

    fn free_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
    ) -> Result<()> {
        Ok(unique_slots::free_unique_slot(
            self,
            namespace.as_str(),
            queue.as_str(),
            slot.as_str(),
        )?)
    }

    fn release_unique_slot(&self, handle: TaskHandle) -> Result<()> {
        Ok(unique_slots::release_unique_slot(self, handle.0)?)
    }

    fn replace_brief(&self, handle: TaskHandle, brief: &[u8], format: &str) -> Result<()> {
        Ok(tasks::replace_brief(self, handle.0, brief, format)?)
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

    fn save_writes(&self, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
        write_task(self, handle, writes)
    }

    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        queue: Option<&QueueName>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>> {
        let listed = attempts::lapsed_leases(
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
            if let Some(row) = tasks::task_by_id(self, id, false)? {
                tasks.push(load(self, row)?);
            }
        }
        Ok(tasks)
    }

    fn insert_meta(&self, key: &str, value: &str) -> Result<()> {
        Ok(meta::insert_meta(self, key, value)?)
    }

    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()> {
        Ok(limits::bump_limit(
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
        Ok(queues::put_queue_settings(
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
        Ok(queues::put_queue_retention(
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
