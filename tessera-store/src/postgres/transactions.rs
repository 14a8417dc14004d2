//! The seam's read and write transactions on PostgreSQL.
//!
//! A write transaction locks what it changes: a task row `FOR UPDATE`
//! before its rules run (heartbeat, submit, fail), and a claim takes the
//! first claimable task with `FOR UPDATE SKIP LOCKED` in a CTE, so two
//! processes never take the same one and the planner cannot lock more
//! than it takes. Statements are prepared once per connection.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use postgres::types::ToSql;
use postgres::{Row, Statement};
use tessera_audit::{AuditEvent, Counter};
use tessera_lease::{
    AttemptNumber, IdempotencyKey, Namespace, PartitionKey, Principal, QueueName, Receipt,
    ScheduleName, StateName, TaskRecord, UniqueKey, UniqueSlot,
};

use crate::backend::rows::{
    self, AttemptRow, AttemptWrite, CounterRow, EventRow, ListingRow, QueueRetentionRow,
    QueueSettingsRow, TaskRow, TaskWrites, claimable_column, corrupt, count, duration_millis,
    millis, minute_number, state_counts, to_json,
};
use crate::backend::{
    FinishedPosition, FinishedTask, KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewFire,
    NewKey, NewReceipt, NewTask, Purge, ReadTransaction, ReceiptKey, Result, RowLock, ScheduleRow,
    StoredKey, TaskChange, TaskHandle, WriteTransaction,
};
use crate::error::{StorageError, StorageErrorKind};
use crate::key::KeyId;
use crate::model::access::{KeyInfo, PrincipalId, PrincipalKind};
use crate::model::audit::AuditCursor;
use crate::model::bulk::{BulkFilter, BulkPosition};
use crate::model::health::{QueueDepth, StateCounts};
use crate::model::queue::QueueSettings;
use crate::model::task::{ListOrder, StoredReceipt, TaskCursor, TaskListing, TaskRef};

use super::listener::Announcer;
use super::rows::{attempt_row, counter_row, event_row, key_row, receipt_row, task_row, version};
use super::statements::*;

/// A `queue_settings` row's columns.
fn retention_row(row: &Row) -> Result<QueueRetentionRow> {
    Ok(QueueRetentionRow {
        queue: row.try_get(0)?,
        done_ms: row.try_get(1)?,
        discarded_ms: row.try_get(2)?,
        cancelled_ms: row.try_get(3)?,
    })
}

fn settings_row(row: &Row) -> Result<QueueSettingsRow> {
    Ok(QueueSettingsRow {
        queue: row.try_get(0)?,
        paused_at: row.try_get(1)?,
        queue_limit: row.try_get(2)?,
        partition_limit: row.try_get(3)?,
    })
}

/// Statements prepared on one connection, by their text.
pub(crate) type Prepared = HashMap<&'static str, Statement>;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// One transaction on one pooled connection.
pub(crate) struct PgTransaction<'a> {
    transaction: RefCell<postgres::Transaction<'a>>,
    prepared: RefCell<&'a mut Prepared>,
    /// How enqueues are announced.
    announcer: &'a Announcer,
    /// Whether reads lock what they return (a write transaction).
    locking: bool,
    /// Table rows changed so far, for the daily allowance.
    rows: Cell<u64>,
    /// The rows of the optional tail, once one ran.
    tail: Cell<Option<u64>>,
}

impl<'a> PgTransaction<'a> {
    pub(crate) fn new(
        transaction: postgres::Transaction<'a>,
        prepared: &'a mut Prepared,
        announcer: &'a Announcer,
        locking: bool,
    ) -> Self {
        Self {
            transaction: RefCell::new(transaction),
            prepared: RefCell::new(prepared),
            announcer,
            locking,
            rows: Cell::new(0),
            tail: Cell::new(None),
        }
    }

    /// Table rows changed, and those of the optional tail.
    pub(crate) fn rows(&self) -> (u64, Option<u64>) {
        (self.rows.get(), self.tail.get())
    }

    /// Ends it: committed, or (with `commit` false) rolled back.
    pub(crate) fn finish(self, commit: bool) -> std::result::Result<(), postgres::Error> {
        let transaction = self.transaction.into_inner();
        if commit {
            transaction.commit()
        } else {
            transaction.rollback()
        }
    }

    pub(crate) fn rollback_tail(&self) -> Result<()> {
        self.batch("ROLLBACK TO SAVEPOINT optional_tail")?;
        if let Some(tail) = self.tail.take() {
            self.rows.set(self.rows.get().saturating_sub(tail));
        }
        Ok(())
    }

    pub(super) fn statement(&self, sql: &'static str) -> Result<Statement> {
        if let Some(statement) = self.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.transaction.borrow_mut().prepare(sql)?;
        self.prepared.borrow_mut().insert(sql, statement.clone());
        Ok(statement)
    }

    pub(super) fn query(&self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>> {
        let statement = self.statement(sql)?;
        Ok(self.transaction.borrow_mut().query(&statement, params)?)
    }

    fn query_opt(&self, sql: &'static str, params: Params<'_>) -> Result<Option<Row>> {
        let statement = self.statement(sql)?;
        Ok(self
            .transaction
            .borrow_mut()
            .query_opt(&statement, params)?)
    }

    pub(super) fn execute(&self, sql: &'static str, params: Params<'_>) -> Result<u64> {
        let statement = self.statement(sql)?;
        let changed = self.transaction.borrow_mut().execute(&statement, params)?;
        self.rows.set(self.rows.get().saturating_add(changed));
        Ok(changed)
    }

    /// Counts `rows` more table rows changed, by a statement that returns
    /// rows rather than a count.
    pub(super) fn add_rows(&self, rows: u64) {
        self.rows.set(self.rows.get().saturating_add(rows));
    }

    /// The row id from which every event is at or after `at` (see
    /// [`first_event_at_or_after`](crate::backend::rows::first_event_at_or_after)).
    fn first_event_at_or_after(&self, at: i64) -> Result<i64> {
        let span = self.query_opt(EVENT_SPAN, &[])?;
        let span = match span {
            Some(row) => {
                let low: Option<i64> = row.try_get(0)?;
                let high: Option<i64> = row.try_get(1)?;
                low.zip(high)
            }
            None => None,
        };
        rows::first_event_at_or_after(span, at, |id| {
            self.query_opt(EVENT_FROM, &[&id])?
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .transpose()
        })
    }

    fn batch(&self, sql: &str) -> Result<()> {
        Ok(self.transaction.borrow_mut().batch_execute(sql)?)
    }

    /// A task row with its attempts.
    fn load(&self, row: TaskRow) -> Result<LoadedTask> {
        let attempts = self
            .query(ATTEMPTS_OF_TASK, &[&row.id])?
            .iter()
            .map(attempt_row)
            .collect::<Result<Vec<_>>>()?;
        row.loaded(attempts)
    }

    fn task_by_id(&self, id: i64) -> Result<Option<TaskRow>> {
        let sql = if self.locking {
            TASK_BY_ID_LOCKED
        } else {
            TASK_BY_ID
        };
        self.query_opt(sql, &[&id])?
            .as_ref()
            .map(task_row)
            .transpose()
    }

    fn receipts(&self, task: &TaskRef, rows: Vec<Row>) -> Result<Vec<StoredReceipt>> {
        rows.iter()
            .map(|row| receipt_row(row)?.stored(task))
            .collect()
    }
}

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
        let found = self
            .query(
                ATTEMPTS_MATCHING,
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
        rows::matching(namespace, found)
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
        rows::queue_depths(claimable, leased)
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
}

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

    fn insert_receipt(
        &self,
        handle: TaskHandle,
        receipt: &Receipt,
        output: Option<&[u8]>,
    ) -> Result<()> {
        self.execute(
            INSERT_RECEIPT,
            &[
                &handle.0,
                &i64::from(receipt.attempt.as_u16()),
                &receipt.token.as_i64(),
                &receipt.principal.as_str(),
                &receipt.idempotency_key.as_str(),
                &receipt.artifact.as_str(),
                &receipt.digest.to_string(),
                &millis(receipt.accepted_at),
                &output,
            ],
        )?;
        Ok(())
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
    pub(super) fn write_task(&self, handle: TaskHandle, writes: TaskWrites) -> Result<()> {
        let id = handle.0;
        let mut progress = writes.progress.as_ref();
        for write in &writes.attempts {
            match write {
                AttemptWrite::State(row) => self.execute(
                    UPDATE_ATTEMPT_STATE,
                    &[
                        &id,
                        &row.number,
                        &row.state,
                        &row.until_at,
                        &row.lapses_at,
                        &row.discarded,
                        &row.last_error,
                        &writes.changed_at,
                    ],
                )?,
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
