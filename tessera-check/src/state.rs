//! The store's state at the end of a run, read once every process has
//! stopped: what the history's operations must explain.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::history::Receipt;

/// Every task of the run's queue as the store holds it at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// The tasks, by id.
    pub tasks: BTreeMap<String, FinalTask>,
}

/// One task at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalTask {
    /// The highest fencing token the task ever granted; `None` if it was
    /// never claimed. Tokens of one task count 1, 2, 3 … one per grant.
    pub last_token: Option<i64>,
    /// Its attempts, numbered from 1.
    pub attempts: Vec<FinalAttempt>,
}

/// One attempt at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalAttempt {
    /// Its number, from 1.
    pub number: u32,
    /// Its state.
    pub state: AttemptState,
    /// Every receipt stored for it.
    pub receipts: Vec<Receipt>,
}

/// Where an attempt ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Claimable now.
    Ready,
    /// Under a lease, which lapses unless its holder goes on.
    Leased,
    /// Claimable again after a backoff or a schedule.
    Waiting,
    /// A submission was accepted.
    Done,
    /// Failed for good by its holder.
    Failed,
    /// Out of tries.
    Discarded,
    /// Cancelled by an operator.
    Cancelled,
}

impl AttemptState {
    /// Whether the attempt is finished: nothing more happens to it unless
    /// an operator retries it.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Done | Self::Failed | Self::Discarded | Self::Cancelled
        )
    }

    /// Whether it is, or becomes by itself, claimable (a lease lapses).
    pub fn is_claimable(self) -> bool {
        !self.is_final()
    }
}

impl FinalAttempt {
    /// An attempt in `state` with no receipt.
    pub fn new(number: u32, state: AttemptState) -> Self {
        Self {
            number,
            state,
            receipts: Vec::new(),
        }
    }
}
