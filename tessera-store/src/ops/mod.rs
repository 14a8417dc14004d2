//! The operations, one family per file, each an `impl Store` block over
//! the backend seam.

mod access;
pub(crate) mod ack;
mod audit;
mod claim;
pub(crate) mod claim_async;
mod health;
mod session;
mod task;
mod wait;
