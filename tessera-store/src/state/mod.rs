//! Runtime state the operations share: the claim gate, health snapshots
//! and long-poll signals. Nothing here touches the backend.

pub(crate) mod completer;
pub(crate) mod gate;
pub(crate) mod health;
pub(crate) mod signals;
pub(crate) mod waiting;
