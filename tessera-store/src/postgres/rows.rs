//! PostgreSQL rows decoded into the seam's row types.

use postgres::Row;

use crate::backend::Result;
use crate::backend::rows::{AttemptRow, CounterRow, EventRow, KeyRow, ReceiptRow, TaskRow};
use crate::model::task::TaskRef;

/// The names a task row's columns have in an answer: each column's own
/// name after a prefix, `task_` in the one-statement answers (beside an
/// attempt's columns twice over), none in a plain read.
#[derive(Debug)]
pub(super) struct TaskColumns {
    id: &'static str,
    queue: &'static str,
    task_id: &'static str,
    version: &'static str,
    brief: &'static str,
    brief_format: &'static str,
    lapse_backoff_ms: &'static str,
    last_token: &'static str,
    claimable_at: &'static str,
    created_at: &'static str,
    max_tries: &'static str,
    priority: &'static str,
    partition_key: &'static str,
    unique_key: &'static str,
    unique_states: &'static str,
    lease_ms: &'static str,
    deadline_at: &'static str,
}

/// [`TaskColumns`] whose names start with `$prefix`.
macro_rules! task_columns {
    ($prefix:literal) => {
        TaskColumns {
            id: concat!($prefix, "id"),
            queue: concat!($prefix, "queue"),
            task_id: concat!($prefix, "task_id"),
            version: concat!($prefix, "version"),
            brief: concat!($prefix, "brief"),
            brief_format: concat!($prefix, "brief_format"),
            lapse_backoff_ms: concat!($prefix, "lapse_backoff_ms"),
            last_token: concat!($prefix, "last_token"),
            claimable_at: concat!($prefix, "claimable_at"),
            created_at: concat!($prefix, "created_at"),
            max_tries: concat!($prefix, "max_tries"),
            priority: concat!($prefix, "priority"),
            partition_key: concat!($prefix, "partition_key"),
            unique_key: concat!($prefix, "unique_key"),
            unique_states: concat!($prefix, "unique_states"),
            lease_ms: concat!($prefix, "lease_ms"),
            deadline_at: concat!($prefix, "deadline_at"),
        }
    };
}

impl TaskColumns {
    /// The table's own names.
    pub(super) const PLAIN: Self = task_columns!("");
    /// The task of a one-statement answer.
    pub(super) const TASK: Self = task_columns!("task_");

    /// Decodes the task row these columns hold.
    pub(super) fn read(&self, row: &Row) -> Result<TaskRow> {
        Ok(TaskRow {
            id: row.try_get(self.id)?,
            queue: row.try_get(self.queue)?,
            task_id: row.try_get(self.task_id)?,
            version: row.try_get(self.version)?,
            brief: row.try_get(self.brief)?,
            brief_format: row.try_get(self.brief_format)?,
            lapse_backoff_ms: row.try_get(self.lapse_backoff_ms)?,
            last_token: row.try_get(self.last_token)?,
            claimable_at: row.try_get(self.claimable_at)?,
            created_at: row.try_get(self.created_at)?,
            max_tries: row.try_get(self.max_tries)?,
            priority: row.try_get(self.priority)?,
            partition_key: row.try_get(self.partition_key)?,
            unique_key: row.try_get(self.unique_key)?,
            unique_states: row.try_get(self.unique_states)?,
            lease_ms: row.try_get(self.lease_ms)?,
            deadline_at: row.try_get(self.deadline_at)?,
        })
    }

    /// Every name [`read`](Self::read) reads.
    #[cfg(test)]
    pub(super) fn names(&self) -> Vec<&'static str> {
        let Self {
            id,
            queue,
            task_id,
            version,
            brief,
            brief_format,
            lapse_backoff_ms,
            last_token,
            claimable_at,
            created_at,
            max_tries,
            priority,
            partition_key,
            unique_key,
            unique_states,
            lease_ms,
            deadline_at,
        } = *self;
        vec![
            id,
            queue,
            task_id,
            version,
            brief,
            brief_format,
            lapse_backoff_ms,
            last_token,
            claimable_at,
            created_at,
            max_tries,
            priority,
            partition_key,
            unique_key,
            unique_states,
            lease_ms,
            deadline_at,
        ]
    }
}

/// The names an attempt row's columns have in an answer, as
/// [`TaskColumns`]: `before_` and `after_` in the one-statement answers
/// (the attempt as it was and as written), none in a plain read.
#[derive(Debug)]
pub(super) struct AttemptColumns {
    number: &'static str,
    state: &'static str,
    until_at: &'static str,
    tries: &'static str,
    holder: &'static str,
    token: &'static str,
    granted_at: &'static str,
    expires_at: &'static str,
    lapses_at: &'static str,
    discarded: &'static str,
    last_error: &'static str,
}

/// [`AttemptColumns`] whose names start with `$prefix`.
macro_rules! attempt_columns {
    ($prefix:literal) => {
        AttemptColumns {
            number: concat!($prefix, "number"),
            state: concat!($prefix, "state"),
            until_at: concat!($prefix, "until_at"),
            tries: concat!($prefix, "tries"),
            holder: concat!($prefix, "holder"),
            token: concat!($prefix, "token"),
            granted_at: concat!($prefix, "granted_at"),
            expires_at: concat!($prefix, "expires_at"),
            lapses_at: concat!($prefix, "lapses_at"),
            discarded: concat!($prefix, "discarded"),
            last_error: concat!($prefix, "last_error"),
        }
    };
}

impl AttemptColumns {
    /// The table's own names.
    pub(super) const PLAIN: Self = attempt_columns!("");
    /// An attempt as a one-statement answer found it.
    pub(super) const BEFORE: Self = attempt_columns!("before_");
    /// An attempt as a one-statement answer wrote it.
    pub(super) const AFTER: Self = attempt_columns!("after_");

    /// Decodes the attempt row these columns hold.
    pub(super) fn read(&self, row: &Row) -> Result<AttemptRow> {
        Ok(AttemptRow {
            number: row.try_get(self.number)?,
            state: row.try_get(self.state)?,
            until_at: row.try_get(self.until_at)?,
            tries: row.try_get(self.tries)?,
            holder: row.try_get(self.holder)?,
            token: row.try_get(self.token)?,
            granted_at: row.try_get(self.granted_at)?,
            expires_at: row.try_get(self.expires_at)?,
            lapses_at: row.try_get(self.lapses_at)?,
            discarded: row.try_get(self.discarded)?,
            last_error: row.try_get(self.last_error)?,
        })
    }

    /// Every name [`read`](Self::read) reads.
    #[cfg(test)]
    pub(super) fn names(&self) -> Vec<&'static str> {
        let Self {
            number,
            state,
            until_at,
            tries,
            holder,
            token,
            granted_at,
            expires_at,
            lapses_at,
            discarded,
            last_error,
        } = *self;
        vec![
            number, state, until_at, tries, holder, token, granted_at, expires_at, lapses_at,
            discarded, last_error,
        ]
    }
}

/// A task row in its table's own column names.
pub(super) fn task_row(row: &Row) -> Result<TaskRow> {
    TaskColumns::PLAIN.read(row)
}

/// An attempt row in its table's own column names.
pub(super) fn attempt_row(row: &Row) -> Result<AttemptRow> {
    AttemptColumns::PLAIN.read(row)
}

/// The columns [`receipt_row`] reads.
#[cfg(test)]
pub(super) fn receipt_columns() -> [&'static str; 7] {
    [
        "attempt",
        "token",
        "principal",
        "idempotency_key",
        "digest",
        "accepted_at",
        "output",
    ]
}

/// A receipt, read from its attempt's row under the names
/// [`receipt_columns`] lists.
pub(super) fn receipt_row(row: &Row) -> Result<ReceiptRow> {
    Ok(ReceiptRow {
        attempt: row.try_get("attempt")?,
        token: row.try_get("token")?,
        principal: row.try_get("principal")?,
        idempotency_key: row.try_get("idempotency_key")?,
        digest: row.try_get("digest")?,
        accepted_at: row.try_get("accepted_at")?,
        output: row.try_get("output")?,
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
