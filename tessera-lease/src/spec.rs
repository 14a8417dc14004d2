//! What a task is made of as input: how a new one is set up, what a
//! failure report asks for, and the stored record a task is restored from.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::attempt::AttemptRecord;
use crate::name::{BriefVersion, TaskId};
use crate::token::FencingToken;
use crate::tries::DEFAULT_MAX_TRIES;

/// The most competing attempts one task may have.
pub const MAX_ALTERNATIVES: u16 = 32;

/// The highest task priority; priorities run from 0 (the default) to this,
/// and a higher one is claimed first.
pub const MAX_PRIORITY: u8 = 3;

/// How a new task is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskSpec {
    /// How many competing attempts the brief gets, 1 to [`MAX_ALTERNATIVES`].
    pub alternatives: u16,
    /// How long an attempt waits after its lease lapses before it can be
    /// claimed again; zero (the default) makes it ready at once.
    pub lapse_backoff: Duration,
    /// How many tries each attempt gets, 1 to [`MAX_TRIES`](crate::MAX_TRIES): a try is a
    /// grant, and one whose lease lapses counts as much as one that fails.
    /// An attempt whose last try lapses, or fails asking for a retry, is
    /// [`TaskState::Discarded`](crate::TaskState::Discarded). [`DEFAULT_MAX_TRIES`] unless set.
    pub max_tries: u32,
    /// 0 (the default) to [`MAX_PRIORITY`]: a claim takes a claimable task
    /// of a higher priority first, and within one priority the claim order
    /// of [`claim_order`](crate::ClaimKey).
    #[serde(default)]
    pub priority: u8,
    /// Not claimable before this time: the attempts start
    /// [`TaskState::Scheduled`](crate::TaskState::Scheduled) and are ordered by it once it passes, as an
    /// ended backoff is. `None` (the default): ready at once.
    #[serde(default)]
    pub not_before: Option<DateTime<Utc>>,
    /// How long a grant of this task lasts, and how far a heartbeat
    /// extends it: 1 ms to [`MAX_LEASE_DURATION`](crate::MAX_LEASE_DURATION).
    /// `None` (the default): the length the store passes to
    /// [`Task::claim`](crate::Task::claim) and
    /// [`Task::heartbeat`](crate::Task::heartbeat).
    #[serde(default, with = "optional_millis")]
    pub lease_duration: Option<Duration>,
    /// The time by which the task must be finished: no grant at or after
    /// it, no lease runs past it, and at it every attempt not yet final
    /// is [`Discarded`](crate::TaskState::Discarded) with
    /// [`DiscardReason::DeadlineExceeded`](crate::DiscardReason::DeadlineExceeded).
    /// `None` (the default): no deadline.
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    /// Starts [`Waiting`](crate::TaskState::Waiting) for parents to end:
    /// no claim grants it until [`Task::unblock`](crate::Task::unblock),
    /// which makes it ready (or scheduled for `not_before`). `false` (the
    /// default): it starts ready or scheduled.
    #[serde(default)]
    pub waits: bool,
}

/// An optional duration as whole milliseconds (`null` for none).
mod optional_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => {
                serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
            }
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_millis))
    }
}

impl TaskSpec {
    /// Whether a task made at `now` to this spec can run before its
    /// deadline: none, or one after both `now` and the not-before time. A
    /// store refuses a new task that cannot.
    pub fn can_meet_deadline(&self, now: DateTime<Utc>) -> bool {
        self.deadline
            .is_none_or(|deadline| deadline > now && self.not_before.is_none_or(|at| at < deadline))
    }
}

impl Default for TaskSpec {
    fn default() -> Self {
        Self {
            alternatives: 1,
            lapse_backoff: Duration::ZERO,
            max_tries: DEFAULT_MAX_TRIES,
            priority: 0,
            not_before: None,
            lease_duration: None,
            deadline: None,
            waits: false,
        }
    }
}

/// What a failure report asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retry {
    /// Give the attempt up: it becomes [`TaskState::Failed`](crate::TaskState::Failed).
    Never,
    /// Retry after this backoff (zero: ready at once), at most
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF).
    After(Duration),
    /// Retry after the default backoff: exponential in the attempt's tries,
    /// with jitter ([`retry_backoff`](crate::retry_backoff)).
    Backoff,
    /// Step back without spending the try: the lease ends and the attempt
    /// is claimable again after this delay (zero: at once), at most
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF), with the tries it had before
    /// this lease. For a worker that will not run the task now: a task
    /// handed back unstarted, or one waiting on something outside.
    Snooze(Duration),
}

/// A failure report: what the worker asks for, and what went wrong.
///
/// A [`Retry`] converts into a report without an error text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    /// Whether and when to try again. Past the task's last try, a retry
    /// discards the attempt instead.
    pub retry: Retry,
    /// What went wrong, kept on the attempt as its last error; at most
    /// [`MAX_ERROR_BYTES`](crate::MAX_ERROR_BYTES) bytes.
    #[serde(default)]
    pub error: Option<String>,
}

impl Failure {
    /// A report asking for `retry`, with an error text.
    pub fn with_error(retry: Retry, error: impl Into<String>) -> Self {
        Self {
            retry,
            error: Some(error.into()),
        }
    }
}

impl From<Retry> for Failure {
    fn from(retry: Retry) -> Self {
        Self { retry, error: None }
    }
}

/// A task as stored: the columns of a `tasks` row plus its `attempts` rows.
///
/// Plain data for the store to read and write; [`Task::restore`](crate::Task::restore) checks it
/// before any rule runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task (the brief's id).
    pub id: TaskId,
    /// The brief version its attempts solve.
    pub version: BriefVersion,
    /// Wait after a lapsed lease before the attempt is claimable again.
    pub lapse_backoff: Duration,
    /// How many tries each attempt gets ([`TaskSpec::max_tries`]).
    #[serde(default = "default_max_tries")]
    pub max_tries: u32,
    /// The task's priority ([`TaskSpec::priority`]).
    #[serde(default)]
    pub priority: u8,
    /// The task's own lease length ([`TaskSpec::lease_duration`]).
    #[serde(default, with = "optional_millis")]
    pub lease_duration: Option<Duration>,
    /// The task's deadline ([`TaskSpec::deadline`]).
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    /// The highest fencing token ever granted for this task; `None` (stored
    /// as 0) before the first claim. The next grant gets the one after it.
    pub last_token: Option<FencingToken>,
    /// The competing attempts, numbered 1, 2, … in order.
    pub attempts: Vec<AttemptRecord>,
}

fn default_max_tries() -> u32 {
    DEFAULT_MAX_TRIES
}
