//! The data operations take and return, shared by every layer above.

pub(crate) mod access;
pub(crate) mod audit;
pub(crate) mod claim;
pub(crate) mod health;
pub(crate) mod session;
pub(crate) mod task;
pub(crate) mod wait;
