//! The seam's writes on PostgreSQL: each write transaction's statements,
//! a task's writes only the difference the lease rules made.

use chrono::{DateTime, Utc};
use postgres::types::ToSql;
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, Namespace, ParentEnd, PartitionKey, QueueName, ScheduleName, TaskRecord,
    UniqueKey, UniqueSlot,
};

use crate::backend::rows::{
    self, AttemptRow, AttemptWrite, CounterRow, EventRow, QueueRetentionRow, QueueSettingsRow,
    TaskWrites, claimable_column, count, duration_millis, millis, minute_number, to_json,
};
use crate::backend::{
    EndedEdge, FinishedTask, KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewEdge, NewFire,
    NewKey, NewReceipt, NewTask, Purge, ReadTransaction, ReceiptKey, Result, RowLock, ScheduleRow,
    TaskChange, TaskHandle, WriteTransaction,
};
use crate::error::{StorageError, StorageErrorKind};
use crate::key::KeyId;
use crate::model::access::{PrincipalId, PrincipalKind};
use crate::model::queue::QueueSettings;
use crate::model::task::{StoredReceipt, TaskRef};
use crate::postgres::rows::version;
use crate::postgres::statements::*;

use super::PgTransaction;

impl WriteTransaction for PgTransaction<'_> {
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
        let statement = self.statement(INSERT_PRINCIPAL)?;
        let row = self.transaction.borrow_mut().query_one(
            &statement,
            &[
                &kind.as_str(),
                &account,
                &millis(created_at),
                &purge_at.map(millis),
            ],
        )?;
        self.rows.set(self.rows.get() + 1);
        Ok(PrincipalId(row.try_get(0)?))
    }

    fn insert_key(&self, key: &NewKey<'_>) -> Result<bool> {
        let changed = self.execute(
            INSERT_KEY,
            &[
                &key.key_id.as_str(),
                &key.principal.0,
                &key.secret_hash,
                &key.label,
                &to_json(&key.scopes),
                &to_json(&key.grants),
                &millis(key.created_at),
                &key.expires_at.map(millis),
                &key.purge_at.map(millis),
            ],
        )?;
        Ok(changed == 1)
    }

    fn change_key(&self, key_id: &KeyId, change: KeyChange) -> Result<()> {
        let (sql, at) = match change {
            KeyChange::Revoke(at) => (REVOKE_KEY, at),
            KeyChange::Expire(at) => (EXPIRE_KEY, at),
        };
        self.execute(sql, &[&key_id.as_str(), &millis(at)])?;
        Ok(())
    }

    fn touch_principal(&self, principal: PrincipalId, at: DateTime<Utc>) -> Result<()> {
        self.execute(TOUCH_PRINCIPAL, &[&principal.0, &millis(at)])?;
        Ok(())
    }

    fn insert_event(&self, event: &AuditEvent) -> Result<()> {
        let row = EventRow::from_event(event);
        self.execute(
            INSERT_EVENT,
            &[
                &row.at,
                &row.principal,
                &row.namespace,
                &row.action,
                &row.outcome,
                &row.resource,
                &row.ip_hash,
            ],
        )?;
        Ok(())
    }

    fn add_counter(&self, counter: &Counter) -> Result<()> {
        let row = CounterRow::from_counter(counter);
        self.execute(
            ADD_TO_COUNTER,
            &[
                &row.minute,
                &row.principal,
                &row.namespace,
                &row.action,
                &row.outcome,
                &row.count,
            ],
        )?;
        Ok(())
    }

    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize> {
        let (sql, threshold) = match what {
            Purge::Keys => (PURGE_KEYS, millis(threshold)),
            Purge::Principals => (PURGE_PRINCIPALS, millis(threshold)),
            Purge::Limits => (PURGE_LIMITS, millis(threshold)),
            Purge::Events => (PURGE_EVENTS, millis(threshold)),
            Purge::Counters => (PURGE_COUNTERS, minute_number(threshold)),
            Purge::SessionTasks => (PURGE_SESSION_TASKS, millis(threshold)),
            Purge::Namespaces => {
                // Locked in one statement and counted in the next, so the
                // count sees every enqueue that held a namespace before.
                let locked: Vec<i64> = self
                    .query(LOCK_PURGED_NAMESPACES, &[&millis(threshold), &count(limit)])?
                    .iter()
                    .map(|row| row.try_get(0))
                    .collect::<std::result::Result<_, _>>()?;
                if locked.is_empty() {
                    return Ok(0);
                }
                let deleted = self.execute(PURGE_EMPTY_NAMESPACES, &[&locked])?;
                return Ok(usize::try_from(deleted).unwrap_or(usize::MAX));
            }
        };
        let deleted = if matches!(what, Purge::Events) {
            let below = self.first_event_at_or_after(threshold)?;
            self.execute(sql, &[&below, &threshold, &count(limit)])?
        } else {
            self.execute(sql, &[&threshold, &count(limit)])?
        };
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn insert_namespace(
        &self,
        namespace: &Namespace,
        kind: NamespaceKind,
        at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let insert = || {
            self.execute(
                INSERT_NAMESPACE,
                &[
                    &namespace.as_str(),
                    &kind.as_str(),
                    &millis(at),
                    &purge_at.map(millis),
                ],
            )
        };
        if kind != NamespaceKind::Session {
            // Only a session's namespace is ever purged.
            return Ok(insert()? == 1);
        }
        // Held until the enqueue commits, so a purge never deletes the
        // namespace of a task it cannot see yet. One purged meanwhile is
        // made again, to be purged with its tasks.
        for _ in 0..2 {
            let created = insert()? == 1;
            if !self
                .query(LOCK_NAMESPACE, &[&namespace.as_str()])?
                .is_empty()
            {
                return Ok(created);
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Retryable,
            None,
            "a session's namespace was purged twice while it was written".to_owned(),
        ))
    }

    fn insert_task(&self, task: &NewTask<'_>) -> Result<bool> {
        let (reference, record) = (task.task, task.record);
        let priority = i64::from(record.priority);
        let (lease, deadline) = rows::timing_columns(record);
        let statement = self.statement(INSERT_TASK)?;
        let row = self.transaction.borrow_mut().query_opt(
            &statement,
            &[
                &reference.namespace.as_str(),
                &task.queue.as_str(),
                &reference.id.as_str(),
                &version(reference),
                &task.brief,
                &task.brief_format,
                &(record.attempts.len() as i64),
                &duration_millis(record.lapse_backoff),
                &millis(task.created_at),
                &task.enqueued_by,
                &i64::from(record.max_tries),
                &claimable_column(record),
                &priority,
                &task.partition_key.map(PartitionKey::as_str),
                &task.unique_key.map(UniqueKey::as_str),
                &task.unique.map(|unique| unique.slot.as_str()),
                &task.unique.map(|unique| i64::from(unique.states.bits())),
                &lease,
                &deadline,
            ],
        )?;
        let Some(row) = row else {
            return Ok(false);
        };
        self.rows.set(self.rows.get() + 1);
        let id: i64 = row.try_get(0)?;
        for attempt in &record.attempts {
            let row = AttemptRow::from_record(attempt, record.lapse_backoff);
            self.execute(
                INSERT_ATTEMPT,
                &[
                    &id,
                    &row.number,
                    &reference.namespace.as_str(),
                    &task.queue.as_str(),
                    &row.state,
                    &row.until_at,
                    &priority,
                    &millis(task.created_at),
                ],
            )?;
        }
        Ok(true)
    }

    fn lock_tasks(&self, tasks: &[&TaskRef]) -> Result<Vec<Option<LoadedTask>>> {
        self.lock_tasks_at_once(tasks)
    }

    fn lock_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
        count: usize,
    ) -> Result<Option<Vec<LoadedTask>>> {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        self.lock_claimable_at_once(namespace.as_str(), queue.as_str(), millis(now), count)
    }

    fn receipts_by_key(&self, keys: &[ReceiptKey<'_>]) -> Result<Vec<Option<StoredReceipt>>> {
        self.receipts_at_once(keys)
    }

    fn write_acknowledged(
        &self,
        changes: &[TaskChange<'_>],
        receipts: &[NewReceipt<'_>],
        events: &[AuditEvent],
    ) -> Result<()> {
        self.write_acknowledged_at_once(changes, receipts, events)
    }

    fn insert_tasks(&self, tasks: &[NewTask<'_>]) -> Result<Vec<bool>> {
        self.insert_tasks_at_once(tasks)
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
        let ends_at = ends_at.map(millis);
        // A holder may release the slot between the insert that met it and
        // the read of who holds it: then the insert is tried again.
        for _ in 0..8 {
            let taken = self.execute(
                TAKE_UNIQUE_SLOT,
                &[
                    &ns,
                    &queue,
                    &slot,
                    &task.id.as_str(),
                    &version(task),
                    &ends_at,
                ],
            )?;
            if taken == 1 {
                return Ok(None);
            }
            if let Some(row) = self.query_opt(UNIQUE_SLOT_HOLDER, &[&ns, &queue, &slot])? {
                let id: String = row.try_get(0)?;
                return Ok(Some(rows::task_ref(namespace, &id, row.try_get(1)?)?));
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Retryable,
            None,
            "a unique slot changed hands too often".to_owned(),
        ))
    }

    fn purge_ended_slots(&self, cutoff: DateTime<Utc>, limit: usize) -> Result<usize> {
        let deleted = self.execute(PURGE_ENDED_SLOTS, &[&millis(cutoff), &(limit as i64)])?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn free_unique_slot(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        slot: &UniqueSlot,
    ) -> Result<()> {
        self.execute(
            FREE_UNIQUE_SLOT,
            &[&namespace.as_str(), &queue.as_str(), &slot.as_str()],
        )?;
        Ok(())
    }

    fn release_unique_slot(&self, handle: TaskHandle) -> Result<()> {
        self.execute(RELEASE_UNIQUE_SLOT, &[&handle.0])?;
        Ok(())
    }

    fn replace_brief(&self, handle: TaskHandle, brief: &[u8], format: &str) -> Result<()> {
        self.execute(REPLACE_BRIEF, &[&handle.0, &brief, &format])?;
        Ok(())
    }

    fn save_task(
        &self,
        handle: TaskHandle,
        before: &TaskRecord,
        after: &TaskRecord,
        at: DateTime<Utc>,
    ) -> Result<()> {
        self.write_task(handle, TaskWrites::between(before, after, at))
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
        self.write_task(handle, writes)
    }

    fn save_writes(&self, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
        self.write_task(handle, writes)
    }

    fn resync_task(&self, handle: TaskHandle, record: &TaskRecord) -> Result<()> {
        self.write_task(handle, TaskWrites::resync(record))
    }

    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        queue: Option<&QueueName>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>> {
        let (namespace, now, limit) = (namespace.as_str(), millis(now), count(limit));
        let rows = match queue {
            Some(queue) => self.query(
                LAPSED_IN_QUEUE,
                &[&namespace, &now, &limit, &queue.as_str()],
            )?,
            None => self.query(LAPSED_TASKS, &[&namespace, &now, &limit])?,
        };
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.try_get(0)?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            // Locked, or skipped when another process holds it.
            if let Some(row) = self.task_by_id(id)? {
                tasks.push(self.load(row)?);
            }
        }
        Ok(tasks)
    }

    fn insert_meta(&self, key: &str, value: &str) -> Result<()> {
        self.execute(INSERT_META, &[&key, &value])?;
        Ok(())
    }

    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()> {
        self.execute(
            BUMP_LIMIT,
            &[&window.subject, &millis(window.start), &millis(window.end)],
        )?;
        Ok(())
    }

    fn lock_finished(&self, handles: &[TaskHandle]) -> Result<Vec<FinishedTask>> {
        let ids: Vec<i64> = handles.iter().map(|handle| handle.0).collect();
        let mut tasks = Vec::with_capacity(ids.len());
        for row in self.query(LOCK_FINISHED, &[&ids])? {
            let (namespace, queue): (String, String) = (row.try_get(1)?, row.try_get(2)?);
            tasks.push(rows::finished_task(row.try_get(0)?, &namespace, &queue)?);
        }
        let locked: Vec<i64> = tasks.iter().map(|task| task.handle.0).collect();
        for row in self.query(ATTEMPT_ENDS, &[&locked])? {
            let (task, state, at): (i64, String, i64) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            if let Some(finished) = tasks.iter_mut().find(|t| t.handle.0 == task) {
                finished.attempts.push(rows::attempt_end(&state, at)?);
            }
        }
        Ok(tasks)
    }

    fn insert_edges(&self, edges: &[NewEdge]) -> Result<()> {
        if edges.is_empty() {
            return Ok(());
        }
        let parents: Vec<i64> = edges.iter().map(|edge| edge.parent.0).collect();
        let children: Vec<i64> = edges.iter().map(|edge| edge.child.0).collect();
        let rules: Vec<&str> = edges.iter().map(|edge| edge.run_after.as_str()).collect();
        let ended: Vec<Option<&str>> = edges
            .iter()
            .map(|edge| edge.ended.map(ParentEnd::as_str))
            .collect();
        let places: Vec<i64> = edges.iter().map(|edge| count(edge.place)).collect();
        self.execute(
            INSERT_EDGES,
            &[&parents, &children, &rules, &ended, &places],
        )?;
        Ok(())
    }

    fn end_edges(&self, parents: &[(TaskHandle, ParentEnd)]) -> Result<Vec<EndedEdge>> {
        if parents.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = parents.iter().map(|(handle, _)| handle.0).collect();
        let ends: Vec<&str> = parents.iter().map(|(_, end)| end.as_str()).collect();
        self.query(END_EDGES, &[&ids, &ends])?
            .iter()
            .map(|row| {
                let end: String = row.try_get("ended")?;
                rows::ended_edge(
                    row.try_get("namespace")?,
                    row.try_get("task_id")?,
                    row.try_get("version")?,
                    row.try_get("run_after")?,
                    ParentEnd::parse(&end).ok_or_else(|| rows::corrupt("an edge's end"))?,
                )
            })
            .collect()
    }

    fn delete_tasks(&self, handles: &[TaskHandle]) -> Result<usize> {
        let ids: Vec<i64> = handles.iter().map(|handle| handle.0).collect();
        let deleted: i64 = match self.query_opt(DELETE_TASKS, &[&ids])? {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        Ok(usize::try_from(deleted).unwrap_or(0))
    }

    fn put_queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        retention: Option<&tessera_lease::Retention>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (namespace, queue) = (namespace.as_str(), queue.as_str());
        match retention.map(QueueRetentionRow::columns) {
            Some([done, discarded, cancelled]) => self.execute(
                PUT_QUEUE_RETENTION,
                &[
                    &namespace,
                    &queue,
                    &done,
                    &discarded,
                    &cancelled,
                    &millis(now),
                ],
            )?,
            None => self.execute(DELETE_QUEUE_RETENTION, &[&namespace, &queue])?,
        };
        Ok(())
    }

    fn lock_row(&self, row: RowLock<'_>) -> Result<()> {
        self.query(LOCK_ROW, &[&row.name()])?;
        Ok(())
    }

    fn put_queue_settings(
        &self,
        namespace: &Namespace,
        settings: &QueueSettings,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (namespace, queue) = (namespace.as_str(), settings.queue.as_str());
        if settings.is_unset() {
            self.execute(DELETE_QUEUE_SETTINGS, &[&namespace, &queue])?;
        } else {
            let row = QueueSettingsRow::of(settings);
            self.execute(
                PUT_QUEUE_SETTINGS,
                &[
                    &namespace,
                    &queue,
                    &row.paused_at,
                    &row.queue_limit,
                    &row.partition_limit,
                    &millis(now),
                ],
            )?;
        }
        Ok(())
    }

    fn signal_enqueued(&self, namespace: &Namespace, queue: &QueueName) -> Result<()> {
        let payload = self.announcer.payload(namespace, queue);
        self.query_opt(NOTIFY, &[&self.announcer.channel(), &payload])?;
        Ok(())
    }

    fn put_schedule(&self, schedule: &ScheduleRow) -> Result<()> {
        self.write_schedule(schedule)
    }

    fn delete_schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<bool> {
        self.remove_schedule(namespace, name)
    }

    fn lock_schedule(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<Option<ScheduleRow>> {
        self.lock_and_read_schedule(namespace, name)
    }

    fn insert_fire(&self, fire: &NewFire<'_>) -> Result<bool> {
        self.record_fire(fire)
    }

    fn trim_fires(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
        limit: usize,
    ) -> Result<usize> {
        self.remove_old_fires(namespace, name, limit)
    }

    fn optional(&self, work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<()>) -> bool {
        debug_assert!(self.tail.get().is_none(), "one optional tail");
        if self.batch("SAVEPOINT optional_tail").is_err() {
            return false;
        }
        let before = self.rows.get();
        match work(self) {
            Ok(()) => {
                self.tail.set(Some(self.rows.get().saturating_sub(before)));
                true
            }
            Err(_) => {
                let _ = self.batch("ROLLBACK TO SAVEPOINT optional_tail");
                self.rows.set(before);
                false
            }
        }
    }
}

impl PgTransaction<'_> {
    pub(in crate::postgres) fn write_task(
        &self,
        handle: TaskHandle,
        writes: TaskWrites,
    ) -> Result<()> {
        let id = handle.0;
        let mut progress = writes.progress.as_ref();
        for write in &writes.attempts {
            match write {
                AttemptWrite::State(row) => {
                    let state: [&(dyn ToSql + Sync); 8] = [
                        &id,
                        &row.number,
                        &row.state,
                        &row.until_at,
                        &row.lapses_at,
                        &row.discarded,
                        &row.last_error,
                        &writes.changed_at,
                    ];
                    match writes.receipt(row.number) {
                        None => self.execute(UPDATE_ATTEMPT_STATE, &state)?,
                        Some(receipt) => {
                            let mut all = state.to_vec();
                            all.extend([
                                &receipt.idempotency_key as &(dyn ToSql + Sync),
                                &receipt.digest,
                                &receipt.accepted_at,
                                &receipt.output,
                            ]);
                            self.execute(UPDATE_ATTEMPT_RECEIPT, &all)?
                        }
                    }
                }
                AttemptWrite::Expiry(row) => match progress {
                    Some((number, value)) if *number == row.number => {
                        progress = None;
                        self.execute(
                            EXTEND_ATTEMPT_PROGRESS,
                            &[&id, &row.number, &row.expires_at, &row.lapses_at, value],
                        )?
                    }
                    _ => self.execute(
                        EXTEND_ATTEMPT,
                        &[&id, &row.number, &row.expires_at, &row.lapses_at],
                    )?,
                },
                AttemptWrite::Whole(row) => self.execute(
                    UPDATE_ATTEMPT,
                    &[
                        &id,
                        &row.number,
                        &row.state,
                        &row.until_at,
                        &row.tries,
                        &row.holder,
                        &row.token,
                        &row.granted_at,
                        &row.expires_at,
                        &row.lapses_at,
                        &row.discarded,
                        &row.last_error,
                        &writes.changed_at,
                    ],
                )?,
            };
        }
        if let Some((number, value)) = progress {
            self.execute(UPDATE_PROGRESS, &[&id, number, value])?;
        }
        match (writes.last_token, writes.claimable_at) {
            (Some(token), Some(claimable)) => {
                self.execute(UPDATE_TASK, &[&id, &token, &claimable])?
            }
            (Some(token), None) => self.execute(UPDATE_TOKEN, &[&id, &token])?,
            (None, Some(claimable)) => self.execute(UPDATE_CLAIMABLE, &[&id, &claimable])?,
            (None, None) => 0,
        };
        if let Some(max_tries) = writes.max_tries {
            self.execute(UPDATE_MAX_TRIES, &[&id, &max_tries])?;
        }
        Ok(())
    }
}
