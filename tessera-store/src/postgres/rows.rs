//! PostgreSQL rows decoded into the seam's row types.

use postgres::Row;

use crate::backend::Result;
use crate::backend::rows::{AttemptRow, CounterRow, EventRow, KeyRow, ReceiptRow, TaskRow};
use crate::model::task::TaskRef;

pub(super) fn task_row(row: &Row) -> Result<TaskRow> {
    task_row_at(row, 0)
}

/// A task row whose columns start at column `first`, in [`task_row`]'s
/// order.
pub(super) fn task_row_at(row: &Row, first: usize) -> Result<TaskRow> {
    Ok(TaskRow {
        id: row.try_get(first)?,
        queue: row.try_get(first + 1)?,
        task_id: row.try_get(first + 2)?,
        version: row.try_get(first + 3)?,
        brief: row.try_get(first + 4)?,
        brief_format: row.try_get(first + 5)?,
        lapse_backoff_ms: row.try_get(first + 6)?,
        last_token: row.try_get(first + 7)?,
        claimable_at: row.try_get(first + 8)?,
        created_at: row.try_get(first + 9)?,
        max_tries: row.try_get(first + 10)?,
        priority: row.try_get(first + 11)?,
        // By name: a statement may put other columns before them.
        partition_key: row.try_get("partition_key")?,
        unique_key: row.try_get("unique_key")?,
        unique_states: row.try_get("unique_states")?,
        lease_ms: row.try_get("lease_ms")?,
        deadline_at: row.try_get("deadline_at")?,
    })
}

pub(super) fn attempt_row(row: &Row) -> Result<AttemptRow> {
    attempt_row_at(row, 0)
}

/// An attempt whose columns start at column `first`, in
/// [`attempt_row`]'s order.
pub(super) fn attempt_row_at(row: &Row, first: usize) -> Result<AttemptRow> {
    Ok(AttemptRow {
        number: row.try_get(first)?,
        state: row.try_get(first + 1)?,
        until_at: row.try_get(first + 2)?,
        tries: row.try_get(first + 3)?,
        holder: row.try_get(first + 4)?,
        token: row.try_get(first + 5)?,
        granted_at: row.try_get(first + 6)?,
        expires_at: row.try_get(first + 7)?,
        lapses_at: row.try_get(first + 8)?,
        discarded: row.try_get(first + 9)?,
        last_error: row.try_get(first + 10)?,
    })
}

pub(super) fn receipt_row(row: &Row) -> Result<ReceiptRow> {
    Ok(ReceiptRow {
        attempt: row.try_get(0)?,
        token: row.try_get(1)?,
        principal: row.try_get(2)?,
        idempotency_key: row.try_get(3)?,
        artifact: row.try_get(4)?,
        digest: row.try_get(5)?,
        accepted_at: row.try_get(6)?,
        output: row.try_get(7)?,
    })
}

pub(super) fn key_row(row: &Row) -> Result<KeyRow> {
    Ok(KeyRow {
        key_id: row.try_get(0)?,
        principal_id: row.try_get(1)?,
        secret_hash: row.try_get(2)?,
        label: row.try_get(3)?,
        scopes: row.try_get(4)?,
        grants: row.try_get(5)?,
        created_at: row.try_get(6)?,
        expires_at: row.try_get(7)?,
        revoked_at: row.try_get(8)?,
        kind: row.try_get(9)?,
        account: row.try_get(10)?,
        last_used_at: row.try_get(11)?,
    })
}

pub(super) fn event_row(row: &Row) -> Result<EventRow> {
    Ok(EventRow {
        at: row.try_get(0)?,
        principal: row.try_get(1)?,
        namespace: row.try_get(2)?,
        action: row.try_get(3)?,
        outcome: row.try_get(4)?,
        resource: row.try_get(5)?,
        ip_hash: row.try_get(6)?,
        id: row.try_get(7)?,
    })
}

pub(super) fn counter_row(row: &Row) -> Result<CounterRow> {
    Ok(CounterRow {
        minute: row.try_get(0)?,
        principal: row.try_get(1)?,
        namespace: row.try_get(2)?,
        action: row.try_get(3)?,
        outcome: row.try_get(4)?,
        count: row.try_get(5)?,
    })
}

pub(super) fn version(task: &TaskRef) -> i64 {
    i64::from(task.version.as_u32())
}
