//! The seam's reads on PostgreSQL.

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, PartitionKey, Principal, QueueName, ScheduleName,
    StateName,
};

use crate::backend::rows::{self, ListingRow, corrupt, count, millis, minute_number, state_counts};
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
use crate::postgres::rows::{counter_row, event_row, key_row, receipt_row, task_row, version};
use crate::postgres::statements::*;

use super::{Params, PgTransaction, retention_row, settings_row};

impl ReadTransaction for PgTransaction<'_> {
    fn namespace_names(&self, after: Option<&Namespace>, limit: usize) -> Result<Vec<Namespace>> {
        let after = after.map_or("", Namespace::as_str);
        self.query(NAMESPACE_NAMES, &[&after, &count(limit)])?
            .iter()
            .map(|row| {
                let name: String = row.try_get(0)?;
                Namespace::parse(&name).map_err(|_| corrupt("a namespace's name"))
            })
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
        self.query(
            FINISHED_ATTEMPTS,
            &[
                &state.as_str(),
                &millis(cutoff),
                &after.0,
                &after.1,
                &count(limit),
                &namespace.as_str(),
            ],
        )?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
    }

    fn key(&self, key_id: &KeyId) -> Result<Option<StoredKey>> {
        self.query_opt(KEY_BY_KEY_ID, &[&key_id.as_str()])?
            .map(|row| key_row(&row)?.stored())
            .transpose()
    }

    fn keys(
        &self,
        principal: Option<PrincipalId>,
        after: Option<&KeyId>,
        limit: usize,
    ) -> Result<Vec<KeyInfo>> {
        let after = after.map_or("", KeyId::as_str);
        let limit = count(limit);
        let rows = match principal {
            Some(principal) => self.query(KEYS_OF_PRINCIPAL, &[&principal.0, &after, &limit])?,
            None => self.query(KEYS_ALL, &[&after, &limit])?,
        };
        rows.iter().map(|row| key_row(row)?.info()).collect()
    }

    fn principal(&self, principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>> {
        self.query_opt(PRINCIPAL_BY_ID, &[&principal.0])?
            .map(|row| {
                let kind: String = row.try_get(0)?;
                let kind = PrincipalKind::parse(&kind).ok_or_else(|| corrupt("principal kind"))?;
                Ok((kind, row.try_get(1)?))
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
        let (since, limit) = (millis(since), count(limit));
        let (at, id) = before.map_or((i64::MAX, i64::MAX), |cursor| (cursor.at, cursor.id));
        let rows = match principal {
            Some(principal) => {
                self.query(EVENTS_OF_PRINCIPAL, &[&principal, &since, &limit, &at, &id])?
            }
            None => self.query(EVENTS_ALL, &[&since, &limit, &id])?,
        };
        rows.iter()
            .map(|row| {
                let row = event_row(row)?;
                Ok((row.cursor(), row.event()?))
            })
            .collect()
    }

    fn counters(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Counter>> {
        let (since, limit) = (minute_number(since), count(limit));
        let rows = match principal {
            Some(principal) => self.query(COUNTERS_OF_PRINCIPAL, &[&principal, &since, &limit])?,
            None => self.query(COUNTERS_ALL, &[&since, &limit])?,
        };
        rows.iter().map(|row| counter_row(row)?.counter()).collect()
    }

    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool> {
        Ok(self
            .query_opt(NAMESPACE_EXISTS, &[&namespace.as_str()])?
            .is_some())
    }

    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>> {
        let sql = if self.locking {
            TASK_BY_REF_LOCKED
        } else {
            TASK_BY_REF
        };
        let row = self.query_opt(
            sql,
            &[&task.namespace.as_str(), &task.id.as_str(), &version(task)],
        )?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut row = task_row(&row)?;
        if !with_brief {
            row.brief = None;
        }
        self.load(row).map(Some)
    }

    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>> {
        let row = self.query_opt(
            FIND_TASK,
            &[&task.namespace.as_str(), &task.id.as_str(), &version(task)],
        )?;
        row.map(|row| Ok(TaskHandle(row.try_get(0)?))).transpose()
    }

    /// The first entries of the claim index and the lapsed leases, each
    /// locked or skipped; the lease rules' claim order picks between them.
    fn next_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<Option<LoadedTask>> {
        let (namespace, queue, now) = (namespace.as_str(), queue.as_str(), millis(now));
        let (claimable_sql, lapsed_sql) = if self.locking {
            (NEXT_CLAIMABLE, NEXT_LAPSED)
        } else {
            (PEEK_CLAIMABLE, PEEK_LAPSED)
        };
        let indexed = self
            .query_opt(claimable_sql, &[&namespace, &queue, &now, &0_i64])?
            .as_ref()
            .map(task_row)
            .transpose()?;
        let row = rows::next_claimable(
            indexed,
            |floor| {
                let floor = i64::from(floor);
                self.query_opt(lapsed_sql, &[&namespace, &queue, &now, &floor])?
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                    .transpose()
            },
            |task| self.task_by_id(task),
        )?;
        row.map(|row| self.load(row)).transpose()
    }

    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let row = self.query_opt(
            HAS_CLAIMABLE,
            &[&namespace.as_str(), &queue.as_str(), &millis(now)],
        )?;
        Ok(match row {
            Some(row) => row.try_get(0)?,
            None => false,
        })
    }

    fn receipt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredReceipt>> {
        let row = self.query_opt(
            RECEIPT_BY_KEY,
            &[&principal.as_str(), &handle.0, &key.as_str()],
        )?;
        row.map(|row| receipt_row(&row)?.stored(task)).transpose()
    }

    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>> {
        let rows = self.query(
            RECEIPTS_OF_ATTEMPT,
            &[&handle.0, &i64::from(attempt.as_u16())],
        )?;
        self.receipts(task, rows)
    }

    fn receipts_of_task(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        limit: usize,
    ) -> Result<Vec<StoredReceipt>> {
        let rows = self.query(RECEIPTS_OF_TASK, &[&handle.0, &count(limit)])?;
        self.receipts(task, rows)
    }

    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)> {
        let by_state = self
            .query(COUNT_BY_STATE, &[&namespace.as_str()])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<(String, i64)>>>()?;
        let expired: i64 =
            match self.query_opt(COUNT_LAPSED, &[&namespace.as_str(), &millis(now)])? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
        Ok((state_counts(by_state)?, u64::try_from(expired).unwrap_or(0)))
    }

    fn tasks_by_state(
        &self,
        namespace: &Namespace,
        state: StateName,
        order: ListOrder,
        after: Option<TaskCursor>,
        limit: usize,
    ) -> Result<Vec<(TaskCursor, TaskListing)>> {
        let leased = state == StateName::Leased;
        let (sql, start) = match order {
            ListOrder::Oldest if leased => (LEASED_OLDEST, (0, 0)),
            ListOrder::Oldest => (TASKS_BY_STATE_OLDEST, (0, 0)),
            ListOrder::Newest if leased => (LEASED_NEWEST, (i64::MAX, 0)),
            ListOrder::Newest => (TASKS_BY_STATE_NEWEST, (i64::MAX, 0)),
        };
        // The cursor's row is the attempt's task row here.
        let (task, number) = after.map_or(start, |c| (c.row, i64::from(c.attempt)));
        self.query(
            sql,
            &[
                &namespace.as_str(),
                &state.as_str(),
                &task,
                &number,
                &count(limit),
            ],
        )?
        .iter()
        .map(|row| {
            ListingRow {
                position: row.try_get(0)?,
                number: row.try_get(1)?,
                state: row.try_get(2)?,
                until_at: row.try_get(3)?,
                discarded: row.try_get(4)?,
                tries: row.try_get(5)?,
                queue: row.try_get(6)?,
                task_id: row.try_get(7)?,
                version: row.try_get(8)?,
                partition_key: row.try_get(9)?,
                progress: row.try_get(10)?,
                changed_at: row.try_get(11)?,
            }
            .listing(namespace)
        })
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
        let queue = filter.queue.as_ref().map(QueueName::as_str);
        let state = filter.state.map(StateName::as_str);
        let partition = filter.partition_key.as_ref().map(PartitionKey::as_str);
        let statement = if start.leased {
            LEASED_MATCHING
        } else {
            ATTEMPTS_MATCHING
        };
        let found = self
            .query(
                statement,
                &[
                    &namespace.as_str(),
                    &start.changed_at,
                    &start.task,
                    &start.number,
                    &end,
                    &queue,
                    &state,
                    &count(limit),
                    &partition,
                ],
            )?
            .iter()
            .map(|row| {
                Ok((
                    (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?),
                    row.try_get(3)?,
                    row.try_get(4)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        rows::matching(namespace, start.leased, found)
    }

    fn progress_of_task(&self, handle: TaskHandle) -> Result<Vec<(AttemptNumber, String)>> {
        let found = self
            .query(PROGRESS_OF_TASK, &[&handle.0])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<_>>>()?;
        rows::progress_list(found)
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        self.query_opt(META_VALUE, &[&key])?
            .map(|row| Ok(row.try_get(0)?))
            .transpose()
    }

    fn schedule(&self, namespace: &Namespace, name: &ScheduleName) -> Result<Option<ScheduleRow>> {
        self.read_schedule(namespace, name)
    }

    fn schedules_of(
        &self,
        namespace: &Namespace,
        after: Option<&ScheduleName>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        self.read_schedules_of(namespace, after, limit)
    }

    fn active_schedules(
        &self,
        after: Option<(&Namespace, &ScheduleName)>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        self.read_active_schedules(after, limit)
    }

    fn limit_count(&self, subject: &str, start: DateTime<Utc>) -> Result<u64> {
        let stored: i64 = match self.query_opt(LIMIT_COUNT, &[&subject, &millis(start)])? {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        Ok(u64::try_from(stored).unwrap_or(0))
    }

    fn queue_settings(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<QueueSettings>> {
        let sql = if self.locking {
            QUEUE_SETTINGS_LOCKED
        } else {
            QUEUE_SETTINGS
        };
        self.query_opt(sql, &[&namespace.as_str(), &queue.as_str()])?
            .map(|row| settings_row(&row)?.settings())
            .transpose()
    }

    fn queue_retention(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<tessera_lease::Retention>> {
        self.query_opt(QUEUE_RETENTION, &[&namespace.as_str(), &queue.as_str()])?
            .map(|row| Ok(retention_row(&row)?.retention()?.1))
            .transpose()
    }

    fn namespace_retention(
        &self,
        namespace: &Namespace,
    ) -> Result<Vec<(QueueName, tessera_lease::Retention)>> {
        self.query(NAMESPACE_RETENTION, &[&namespace.as_str()])?
            .iter()
            .map(|row| retention_row(row)?.retention())
            .collect()
    }

    fn queue_depths(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<Vec<QueueDepth>> {
        let claimable = self
            .query(QUEUE_CLAIMABLE, &[&namespace.as_str(), &millis(now)])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<Vec<(String, i64, i64)>>>()?;
        let leased = self
            .query(QUEUE_LEASED, &[&namespace.as_str()])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<(String, i64)>>>()?;
        let oldest = self
            .query(QUEUE_OLDEST_READY, &[&namespace.as_str(), &millis(now)])?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<Vec<(String, i64)>>>()?;
        rows::queue_depths(claimable, leased, oldest)
    }

    fn namespace_queue_settings(&self, namespace: &Namespace) -> Result<Vec<QueueSettings>> {
        self.query(NAMESPACE_QUEUE_SETTINGS, &[&namespace.as_str()])?
            .iter()
            .map(|row| settings_row(row)?.settings())
            .collect()
    }

    fn leased_in_queue(&self, namespace: &Namespace, queue: &QueueName) -> Result<u32> {
        let leased: i64 =
            match self.query_opt(LEASED_IN_QUEUE, &[&namespace.as_str(), &queue.as_str()])? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
        Ok(u32::try_from(leased).unwrap_or(u32::MAX))
    }

    fn leased_in_partition(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        key: &PartitionKey,
    ) -> Result<u32> {
        let leased: i64 = match self.query_opt(
            LEASED_IN_PARTITION,
            &[&namespace.as_str(), &queue.as_str(), &key.as_str()],
        )? {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        Ok(u32::try_from(leased).unwrap_or(u32::MAX))
    }

    fn claim_candidates(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>> {
        let (namespace, queue, now) = (namespace.as_str(), queue.as_str(), millis(now));
        rows::claim_candidates(limit, |priority, limit| {
            let args: Params<'_> = &[
                &namespace,
                &queue,
                &i64::from(priority),
                &now,
                &count(limit),
            ];
            let indexed = self
                .query(CANDIDATE_TASKS, args)?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<Vec<_>>>()?;
            let lapsed = self
                .query(CANDIDATE_LAPSED, args)?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<Vec<_>>>()?;
            Ok((indexed, lapsed))
        })
    }

    fn task_by_handle(&self, handle: TaskHandle) -> Result<Option<LoadedTask>> {
        self.task_by_id(handle.0)?
            .map(|row| self.load(row))
            .transpose()
    }

    fn parents_of_waiting(&self, parents: &[TaskHandle]) -> Result<Vec<TaskHandle>> {
        let ids: Vec<i64> = parents.iter().map(|parent| parent.0).collect();
        self.query(PARENTS_OF_WAITING, &[&ids])?
            .iter()
            .map(|row| Ok(TaskHandle(row.try_get(0)?)))
            .collect()
    }

    fn parents_of(&self, child: TaskHandle) -> Result<Vec<TaskRef>> {
        self.query(PARENTS_OF, &[&child.0])?
            .iter()
            .map(|row| {
                rows::stored_task_ref(
                    row.try_get("namespace")?,
                    row.try_get("task_id")?,
                    row.try_get("version")?,
                )
            })
            .collect()
    }

    fn open_parents(&self, child: TaskHandle) -> Result<u64> {
        let open: i64 = match self.query_opt(OPEN_PARENTS, &[&child.0])? {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        Ok(u64::try_from(open).unwrap_or(0))
    }
}
