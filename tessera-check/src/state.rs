//! The store's state at the end of a run, read once every process has
//! stopped: what the history's operations must explain.
//!
//! It is read raw, row by row, not through the store's views that pick
//! one receipt per done attempt: a doubled row is what the checker looks
//! for.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::history::Receipt;

/// Every task, receipt row and schedule fire of the run as the store
/// holds it at the end. Every field but `tasks` may be left empty (and
/// out of the JSON), which leaves its checks out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// The tasks, by id.
    pub tasks: BTreeMap<String, FinalTask>,
    /// Receipt rows as read from the store's table, each naming its task
    /// and attempt. The receipts of an attempt are the rows listed here
    /// for it and those in its [`FinalAttempt::receipts`]: a run lists
    /// each row in one place or the other.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receipts: Vec<FinalReceipt>,
    /// How many attempts of a task may finish with a receipt (its spec's
    /// alternatives), by task id; a task not listed is not checked for it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub alternatives: BTreeMap<String, u16>,
    /// The schedules, by name: the fires recorded and the run-ats that
    /// must have fired.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schedules: BTreeMap<String, FinalSchedule>,
    /// The store's retention of finished work, where it was on: the only
    /// thing that lets a task the history made be missing at the end.
    /// Left out, every such task must be there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<FinalRetention>,
}

/// What excuses a task missing at the end: the keep times every store
/// process of the run purged finished tasks by, when the end was read,
/// and how many tasks the store's audit says it purged.
///
/// A task is excused only when its history shows that every attempt may
/// have ended (a submission that may have been accepted, a failure for
/// good, a discard, a cancel) early enough for its keep time to have
/// passed before the end was read; and no more tasks of a queue are
/// excused than the audit counts purged from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRetention {
    /// How long a task whose attempts ended done is kept, in milliseconds
    /// from when its last attempt ended; `None` keeps it for good.
    pub done_ms: Option<u64>,
    /// The same for attempts that failed for good or were discarded.
    pub discarded_ms: Option<u64>,
    /// The same for cancelled attempts.
    pub cancelled_ms: Option<u64>,
    /// When the end was read, by the reading process's clock, taken once
    /// the last row was read: every purge the end shows ran before it.
    pub read_at: DateTime<Utc>,
    /// Tasks purged, by queue: the counts of the store's `purge_tasks`
    /// audit rows of the run, added up.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub purged: BTreeMap<String, u64>,
}

impl FinalRetention {
    /// How long a task whose attempt ended in `state` is kept after it:
    /// `None` for good, or for a state that is not final.
    pub fn keep(&self, state: AttemptState) -> Option<TimeDelta> {
        let millis = match state {
            AttemptState::Done => self.done_ms,
            AttemptState::Failed | AttemptState::Discarded => self.discarded_ms,
            AttemptState::Cancelled => self.cancelled_ms,
            AttemptState::Ready | AttemptState::Leased | AttemptState::Waiting => None,
        }?;
        TimeDelta::try_milliseconds(i64::try_from(millis).ok()?)
    }

    /// Every task the audit counts purged, in all queues.
    pub fn purged_total(&self) -> u64 {
        self.purged.values().sum()
    }
}

/// One receipt row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalReceipt {
    /// The task it belongs to.
    pub task: String,
    /// The row (its attempt, token, key, digest and time).
    #[serde(flatten)]
    pub receipt: Receipt,
}

/// One schedule at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalSchedule {
    /// Every fire row the store holds for the schedule, as read raw.
    #[serde(default)]
    pub fires: Vec<FinalFire>,
    /// Run-ats the run expects fired: each fell due while the run's
    /// schedulers made passes, and a pass ran after it before the next
    /// run-at of the cron. Listed in any order; a run-at is excused when
    /// a pause of the schedule may have held between it and the next one
    /// listed.
    #[serde(default)]
    pub due: Vec<DateTime<Utc>>,
}

/// One fire row: a run-at fired and the task it enqueued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalFire {
    /// The run-at, by the store's clock.
    pub run_at: DateTime<Utc>,
    /// The task the fire enqueued (`sched-<name>-<run-at in ms>`).
    pub task: String,
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
    /// The tries the store counts it has had, where the run read them: a
    /// grant is a try, and a snooze gives its try back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tries: Option<u32>,
    /// Every receipt row stored for it (rows may instead be listed in
    /// [`FinalState::receipts`]).
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
            tries: None,
            receipts: Vec::new(),
        }
    }
}
