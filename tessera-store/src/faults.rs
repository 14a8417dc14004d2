//! Faults a test can switch on, so that the checks built to catch a broken
//! store can be shown to catch one. Behind the `fault-injection` feature,
//! which no service enables.

use serde::{Deserialize, Serialize};

/// A deliberate bug, switched on with
/// [`StoreConfig::with_injected_fault`](crate::StoreConfig::with_injected_fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum InjectedFault {
    /// A submission under a lease that ended (stale, expired, lapsed or
    /// another holder's) is answered as accepted, with a receipt for the
    /// attempt it names, and nothing is stored: the fencing check skipped
    /// on the answer. A history checker must report the acceptance as
    /// work that was acknowledged and lost.
    AcceptStaleSubmits,
}

impl InjectedFault {
    /// The fault named `name` (its serde name, e.g.
    /// `accept_stale_submits`), for a test that passes it to a process.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "accept_stale_submits" => Some(Self::AcceptStaleSubmits),
            _ => None,
        }
    }
}
