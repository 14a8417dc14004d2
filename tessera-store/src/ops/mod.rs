//! The operations, one family per file, each an `impl Store` block over
//! the backend seam.

mod access;
pub(crate) mod ack;
mod audit;
mod bulk;
pub(crate) mod claim_async;
mod health;
pub(crate) mod lease;
mod queue;
mod retention;
#[cfg(feature = "schedule")]
pub(crate) mod schedule;
mod session;
mod task;
mod wait;
pub(crate) mod worker;
