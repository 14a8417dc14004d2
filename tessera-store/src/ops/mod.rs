//! The operations, each an `impl Store` block over the backend seam: the
//! lease wing in `lease/`, then one family per file.

mod access;
mod audit;
mod bulk;
pub(crate) mod dependency;
mod enqueue;
mod health;
pub(crate) mod lease;
mod queue;
mod retention;
#[cfg(feature = "schedule")]
pub(crate) mod schedule;
mod session;
mod task;
mod wait;
