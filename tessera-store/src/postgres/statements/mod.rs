//! PostgreSQL's statements, one module per table or concern, one constant
//! a statement, the SQL text of the transactions in `transactions/`.
//!
//! A statement lives with the table it reads or writes; one that spans
//! tables lives with the rows it answers with or removes, and the
//! searches across both claim indexes in [`claim`]. The one-statement
//! claims and the set-based batches are files of `../sql/`, beside
//! `claim.rs`, `coalesce.rs` and `batch.rs`, which bind and decode them.
//!
//! Every time is a parameter (Unix milliseconds from the store's clock),
//! never the server's `now()`. Retention's batches delete rows no other
//! process is deleting (`FOR UPDATE SKIP LOCKED`).

/// A task row's columns, each under its table's own name, as
/// [`task_row`](crate::postgres::rows::task_row) reads them.
macro_rules! task_columns {
    () => {
        "id, queue, task_id, version, brief, brief_format, lapse_backoff_ms, last_token, \
         claimable_at, created_at, max_tries, priority, partition_key, unique_key, unique_states, \
         lease_ms, deadline_at"
    };
}

mod attempts;
mod audit;
mod claim;
mod edges;
mod health;
mod keys;
mod limits;
mod meta;
mod namespaces;
mod queues;
mod receipts;
mod tasks;
mod unique_slots;

pub(super) use attempts::*;
pub(super) use audit::*;
pub(super) use claim::*;
pub(super) use edges::*;
pub(super) use health::*;
pub(super) use keys::*;
pub(super) use limits::*;
pub(super) use meta::*;
pub(super) use namespaces::*;
pub(super) use queues::*;
pub(super) use receipts::*;
pub(super) use tasks::*;
pub(super) use unique_slots::*;

#[cfg(test)]
mod tests;
