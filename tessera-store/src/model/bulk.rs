//! Bulk actions by filter, and the progress a heartbeat carries.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::Resource;
use tessera_lease::{AttemptNumber, PartitionKey, QueueName, StateName};

/// How many tasks one transaction of a bulk action changes at most: a
/// [`cancel_tasks`](crate::Store::cancel_tasks) or
/// [`retry_tasks`](crate::Store::retry_tasks) over more is paged in
/// transactions of this many, so no call holds the writer for long.
pub const BULK_BATCH: usize = 200;

/// Which tasks a bulk action takes: those with an attempt that matches
/// every condition set. An empty filter takes every task of the
/// namespace.
///
/// ```
/// use tessera_store::{BulkFilter, QueueName, StateName};
///
/// // "All discarded tasks of this queue since noon."
/// let filter = BulkFilter::default()
///     .with_queue(QueueName::parse("render")?)
///     .with_state(StateName::Discarded)
///     .changed_since("2026-12-03T12:00:00Z".parse().unwrap());
/// # Ok::<(), tessera_store::LeaseError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    /// The task's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueName>,
    /// The attempt's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateName>,
    /// The task's partition key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<PartitionKey>,
    /// The attempt's state last changed at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_since: Option<DateTime<Utc>>,
    /// The attempt's state last changed before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_before: Option<DateTime<Utc>>,
}

impl BulkFilter {
    /// Only tasks of `queue`.
    pub fn with_queue(mut self, queue: QueueName) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Only tasks with an attempt in `state`.
    pub fn with_state(mut self, state: StateName) -> Self {
        self.state = Some(state);
        self
    }

    /// Only tasks enqueued with partition key `key`.
    pub fn with_partition_key(mut self, key: PartitionKey) -> Self {
        self.partition_key = Some(key);
        self
    }

    /// Only attempts whose state last changed at or after `at`.
    pub fn changed_since(mut self, at: DateTime<Utc>) -> Self {
        self.changed_since = Some(at);
        self
    }

    /// Only attempts whose state last changed before `at`.
    pub fn changed_before(mut self, at: DateTime<Utc>) -> Self {
        self.changed_before = Some(at);
        self
    }

    /// The audit resource of one batch: the filter, then how many tasks
    /// the batch changed (`filter:queue=render,state=discarded,since=…/n200`).
    pub(crate) fn resource(&self, changed: usize) -> Option<Resource> {
        let mut text = String::from("filter:");
        let mut parts = Vec::new();
        if let Some(queue) = &self.queue {
            parts.push(format!("queue={queue}"));
        }
        if let Some(state) = self.state {
            parts.push(format!("state={}", state.as_str()));
        }
        if let Some(key) = &self.partition_key {
            parts.push(format!("partition={key}"));
        }
        let time = |at: &DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
        if let Some(at) = &self.changed_since {
            parts.push(format!("since={}", time(at)));
        }
        if let Some(at) = &self.changed_before {
            parts.push(format!("before={}", time(at)));
        }
        if parts.is_empty() {
            parts.push("all".to_owned());
        }
        text.push_str(&parts.join(","));
        let _ = write!(text, "/n{changed}");
        Resource::new(&text).ok()
    }
}

/// Where a bulk action's scan goes on: after the attempt whose state
/// changed at `changed_at` (Unix milliseconds), of task row `task`,
/// numbered `number`, among the attempts at rest (not leased) first,
/// then among the leased ones (`leased`), which an index of their own
/// holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BulkPosition {
    pub(crate) leased: bool,
    pub(crate) changed_at: i64,
    pub(crate) task: i64,
    pub(crate) number: i64,
}

impl BulkPosition {
    /// Before every attempt.
    pub(crate) const START: Self = Self {
        leased: false,
        changed_at: i64::MIN,
        task: i64::MIN,
        number: i64::MIN,
    };

    /// Before every leased attempt, after every one at rest.
    pub(crate) const LEASED: Self = Self {
        leased: true,
        ..Self::START
    };

    /// Where a scan for `filter` starts: among the leased attempts when
    /// it asks for those alone.
    pub(crate) fn start(filter: &BulkFilter) -> Self {
        if filter.state == Some(StateName::Leased) {
            Self::LEASED
        } else {
            Self::START
        }
    }

    /// Where the scan goes on once the attempts at rest are done: the
    /// leased ones, unless the filter names a state other than leased.
    pub(crate) fn after_at_rest(self, filter: &BulkFilter) -> Option<Self> {
        (!self.leased && filter.state.is_none_or(|state| state == StateName::Leased))
            .then_some(Self::LEASED)
    }
}

/// The last progress value a heartbeat carried for one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptProgress {
    /// The attempt.
    pub attempt: AttemptNumber,
    /// The value, as the heartbeat sent it.
    pub progress: serde_json::Value,
}
