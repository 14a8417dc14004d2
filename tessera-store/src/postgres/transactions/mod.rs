//! The seam's read and write transactions on PostgreSQL.
//!
//! A write transaction locks what it changes: a task row `FOR UPDATE`
//! before its rules run (heartbeat, submit, fail), and a claim takes the
//! first claimable task with `FOR UPDATE SKIP LOCKED` in a CTE, so two
//! processes never take the same one and the planner cannot lock more
//! than it takes. Statements are prepared once per connection.
//!
//! [`reads`] maps the seam's reads onto the statements, [`writes`] its
//! writes; the set-based ones are in `batch.rs`.

mod reads;
mod writes;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Row, Statement};

use crate::backend::rows::{self, QueueRetentionRow, QueueSettingsRow, TaskRow};
use crate::backend::{LoadedTask, Result};
use crate::model::task::{StoredReceipt, TaskRef};

use super::listener::Announcer;
use super::rows::{attempt_row, receipt_row, task_row};
use super::statements::*;

/// A `queue_retention` row's columns.
fn retention_row(row: &Row) -> Result<QueueRetentionRow> {
    Ok(QueueRetentionRow {
        queue: row.try_get(0)?,
        done_ms: row.try_get(1)?,
        discarded_ms: row.try_get(2)?,
        cancelled_ms: row.try_get(3)?,
    })
}

/// A `queue_settings` row's columns.
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
