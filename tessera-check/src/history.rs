//! The history of a run: every operation's invocation and completion, as
//! each process recorded them, and the pairing of the two.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Names one operation of a run: the process that made it and its place
/// in that process's own sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperationId {
    /// The process, as the run numbered it.
    pub process: u32,
    /// The operation's number within its process, from 0.
    pub sequence: u64,
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}#{}", self.process, self.sequence)
    }
}

/// What an operation asked the store to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Operation {
    /// Put a task into a queue. The optional fields are what the checks
    /// of unique keys, limits and deadlines read; a history that leaves
    /// them out is checked without those rules.
    Enqueue {
        /// The task's id.
        task: String,
        /// The queue it goes to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
        /// Its partition key, which a queue's per-partition limit counts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<String>,
        /// Its unique slot: the unique key (with the window's period when
        /// the key has a window), held in the default counted states
        /// (waiting or leased) until the task is finished.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unique_key: Option<String>,
        /// The time after which no lease of it may be granted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<DateTime<Utc>>,
        /// How many attempts it has (its spec's alternatives); left out,
        /// one (the store's default) or as many as the history shows.
        /// Read by the check of purges: a task is purged only once every
        /// attempt has ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alternatives: Option<u16>,
        /// How many tries each attempt gets. Read by the check of purges:
        /// an attempt may have been discarded (out of tries) only once it
        /// may have been granted this many times; left out, the history
        /// shows no discard of the task.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_tries: Option<u32>,
        /// The tasks it runs after (its parents), each named by its id.
        /// Read by the check of dependencies: no grant of it may be
        /// acknowledged before a submission of every parent was asked for.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        after: Vec<String>,
        /// Whether it runs once its parents have ended however they ended,
        /// not only once each is done; such a task is not checked against
        /// its parents' submissions.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        any_outcome: bool,
    },
    /// Take the next claimable task of a queue under a lease.
    Claim {
        /// The queue.
        queue: String,
    },
    /// Extend the lease `token` on an attempt.
    Heartbeat {
        /// The task.
        task: String,
        /// The attempt, from 1.
        attempt: u32,
        /// The lease's fencing token.
        token: i64,
    },
    /// Submit an output under the lease `token` with an idempotency key.
    Submit {
        /// The task.
        task: String,
        /// The attempt, from 1.
        attempt: u32,
        /// The lease's fencing token.
        token: i64,
        /// The idempotency key.
        key: String,
        /// The digest of the output submitted.
        digest: String,
    },
    /// End the lease `token` with a failure report.
    Fail {
        /// The task.
        task: String,
        /// The attempt, from 1.
        attempt: u32,
        /// The lease's fencing token.
        token: i64,
        /// Whether the attempt was asked to be claimable again (`true`) or
        /// failed for good (`false`).
        retry: bool,
    },
    /// An operator's cancel of every unfinished attempt of a task.
    Cancel {
        /// The task.
        task: String,
    },
    /// End the lease `token` and put the attempt back to wait, without
    /// spending a try.
    Snooze {
        /// The task.
        task: String,
        /// The attempt, from 1.
        attempt: u32,
        /// The lease's fencing token.
        token: i64,
    },
    /// Stop a queue's claims from granting until it is resumed.
    PauseQueue {
        /// The queue.
        queue: String,
    },
    /// Let a paused queue's claims grant again.
    ResumeQueue {
        /// The queue.
        queue: String,
    },
    /// Set a queue's concurrency limits; `None` removes one.
    SetLimits {
        /// The queue.
        queue: String,
        /// At most this many of the queue's attempts leased at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue_limit: Option<u32>,
        /// At most this many leased at once among the queue's tasks of one
        /// partition key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition_limit: Option<u32>,
    },
    /// One scheduler pass: fire every unpaused schedule with a run-at due.
    FireSchedules,
    /// Stop a schedule from firing until it is resumed.
    PauseSchedule {
        /// The schedule's name.
        schedule: String,
    },
    /// Let a paused schedule fire again, its run-ats counted from now.
    ResumeSchedule {
        /// The schedule's name.
        schedule: String,
    },
    /// An operator's cancel of every task of `queue` with an attempt in
    /// `state`. Recorded, not followed: a run uses it only where no check
    /// reads what it changes (waiting attempts, of tasks with no unique
    /// key, that a later [`RetryTasks`](Self::RetryTasks) makes claimable
    /// again), since which tasks it met is not in its answer.
    CancelTasks {
        /// The queue.
        queue: String,
        /// The attempt state it matched.
        state: String,
    },
    /// An operator's retry of every task of `queue` with an attempt in
    /// `state`: finished attempts claimable again. Recorded, not followed,
    /// as [`CancelTasks`](Self::CancelTasks) is.
    RetryTasks {
        /// The queue.
        queue: String,
        /// The attempt state it matched.
        state: String,
    },
}

impl Operation {
    /// An enqueue of `task` that records nothing but its id.
    pub fn enqueue(task: impl Into<String>) -> Self {
        Self::Enqueue {
            task: task.into(),
            queue: None,
            partition: None,
            unique_key: None,
            deadline: None,
            alternatives: None,
            max_tries: None,
            after: Vec::new(),
            any_outcome: false,
        }
    }

    /// The task the operation names before it runs (a claim, a queue's
    /// or a schedule's setting and a scheduler pass name none).
    pub fn task(&self) -> Option<&str> {
        match self {
            Self::Enqueue { task, .. }
            | Self::Heartbeat { task, .. }
            | Self::Submit { task, .. }
            | Self::Fail { task, .. }
            | Self::Cancel { task }
            | Self::Snooze { task, .. } => Some(task),
            Self::Claim { .. }
            | Self::PauseQueue { .. }
            | Self::ResumeQueue { .. }
            | Self::SetLimits { .. }
            | Self::FireSchedules
            | Self::PauseSchedule { .. }
            | Self::ResumeSchedule { .. }
            | Self::CancelTasks { .. }
            | Self::RetryTasks { .. } => None,
        }
    }
}

/// A receipt as the store returned or holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The attempt it finished, from 1.
    pub attempt: u32,
    /// The fencing token it was accepted under.
    pub token: i64,
    /// The idempotency key it was submitted with.
    pub key: String,
    /// The digest of the accepted payload.
    pub digest: String,
    /// When the store accepted it.
    pub accepted_at: DateTime<Utc>,
}

/// What an acknowledged operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// The enqueue was stored.
    Enqueued,
    /// A claim granted a lease.
    Granted {
        /// The task.
        task: String,
        /// The attempt leased, from 1.
        attempt: u32,
        /// The lease's fencing token.
        token: i64,
        /// When the lease was granted, by the store's clock.
        granted_at: DateTime<Utc>,
        /// When it lapses unless extended, by the store's clock.
        expires_at: DateTime<Utc>,
    },
    /// A claim found nothing claimable.
    Empty,
    /// A heartbeat extended the lease.
    Extended {
        /// The lease's new expiry, by the store's clock.
        expires_at: DateTime<Utc>,
    },
    /// A submission was accepted and stored under this receipt.
    Accepted {
        /// The receipt.
        receipt: Receipt,
    },
    /// A submission replayed this stored receipt.
    Replayed {
        /// The receipt.
        receipt: Receipt,
    },
    /// A failure report ended the lease.
    Failed,
    /// A cancel was applied.
    Cancelled,
    /// An enqueue created nothing: the task `of` holds its unique slot.
    Duplicate {
        /// The task that holds the slot.
        of: String,
    },
    /// A snooze ended the lease; the attempt waits until `until`.
    Snoozed {
        /// When the attempt is claimable again, by the store's clock.
        until: DateTime<Utc>,
    },
    /// A queue's or a schedule's setting (pause, resume, limits) was
    /// stored.
    Applied,
    /// A bulk action changed this many tasks.
    Changed {
        /// How many.
        count: u64,
    },
    /// A scheduler pass made these fires, each recorded with its task in
    /// one transaction.
    Fired {
        /// The fires, in any order.
        fires: Vec<Fire>,
    },
}

/// One run-at a scheduler pass fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fire {
    /// The schedule's name.
    pub schedule: String,
    /// The run-at fired, by the store's clock.
    pub run_at: DateTime<Utc>,
    /// The task the fire enqueued.
    pub task: String,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Completion {
    /// Acknowledged, with its result.
    Ok {
        /// What it returned.
        outcome: Outcome,
    },
    /// Refused with an error that says nothing changed (a stale token, a
    /// conflict, refused writes).
    Fail {
        /// The error's code.
        error: String,
    },
    /// Nobody knows whether it took effect: a timeout, a lost connection,
    /// or a process killed before it could record the completion.
    Unknown {
        /// Why it is not known.
        reason: String,
    },
}

impl Completion {
    /// The result, if the operation was acknowledged.
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Self::Ok { outcome } => Some(outcome),
            _ => None,
        }
    }

    /// Whether the operation may have taken effect: acknowledged or
    /// unknown.
    pub fn may_have_happened(&self) -> bool {
        !matches!(self, Self::Fail { .. })
    }
}

/// One line of a process's history file: an invocation or a completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The process and its operation.
    pub id: OperationId,
    /// The process's wall clock (the one its store reads) at the record.
    pub wall: DateTime<Utc>,
    /// The machine's monotonic clock in nanoseconds (shared by every
    /// process of one machine), which orders records in real time.
    pub monotonic: u64,
    /// Which half of the operation this is.
    pub event: Event,
}

/// The two halves of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Event {
    /// The operation was invoked.
    Invoke {
        /// What was asked.
        operation: Operation,
    },
    /// The operation completed.
    Complete {
        /// How it ended.
        completion: Completion,
    },
}

/// One operation with both halves paired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Its name.
    pub id: OperationId,
    /// What was asked.
    pub operation: Operation,
    /// The monotonic time of the invocation.
    pub invoked: u64,
    /// The invoking process's wall clock at the invocation.
    pub invoked_wall: DateTime<Utc>,
    /// The monotonic time of the completion; `None` if none was recorded
    /// (the process was killed first), which counts as never.
    pub completed: Option<u64>,
    /// The completing process's wall clock at the completion, if one was
    /// recorded.
    #[serde(default)]
    pub completed_wall: Option<DateTime<Utc>>,
    /// How it ended; [`Completion::Unknown`] when no completion was
    /// recorded.
    pub completion: Completion,
}

impl Step {
    /// Whether this step completed before `other` was invoked, in real
    /// time: the only order two processes' steps are known to have.
    pub fn precedes(&self, other: &Step) -> bool {
        self.completed.is_some_and(|done| done < other.invoked)
    }
}

/// A whole run's operations, each invocation paired with its completion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    steps: Vec<Step>,
}

/// Why records do not make a history.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Two invocations under one operation id.
    #[error("operation {0} is invoked twice")]
    InvokedTwice(OperationId),
    /// A completion with no invocation before it.
    #[error("operation {0} completes without an invocation")]
    CompletedWithoutInvocation(OperationId),
    /// Two completions of one operation.
    #[error("operation {0} completes twice")]
    CompletedTwice(OperationId),
    /// A completion timed before its invocation.
    #[error("operation {0} completes before it is invoked")]
    CompletedBeforeInvoked(OperationId),
}

impl History {
    /// Pairs the records of every process (in any order, merged or not):
    /// an invocation with no completion becomes an unknown outcome.
    pub fn from_records(records: impl IntoIterator<Item = Record>) -> Result<Self, HistoryError> {
        let mut steps: BTreeMap<OperationId, Step> = BTreeMap::new();
        let mut completions = Vec::new();
        for record in records {
            match record.event {
                Event::Invoke { operation } => {
                    let step = Step {
                        id: record.id,
                        operation,
                        invoked: record.monotonic,
                        invoked_wall: record.wall,
                        completed: None,
                        completed_wall: None,
                        completion: Completion::Unknown {
                            reason: "no completion recorded".to_owned(),
                        },
                    };
                    if steps.insert(record.id, step).is_some() {
                        return Err(HistoryError::InvokedTwice(record.id));
                    }
                }
                Event::Complete { completion } => {
                    completions.push((record.id, record.monotonic, record.wall, completion));
                }
            }
        }
        for (id, at, wall, completion) in completions {
            let step = steps
                .get_mut(&id)
                .ok_or(HistoryError::CompletedWithoutInvocation(id))?;
            if step.completed.is_some() {
                return Err(HistoryError::CompletedTwice(id));
            }
            if at < step.invoked {
                return Err(HistoryError::CompletedBeforeInvoked(id));
            }
            step.completed = Some(at);
            step.completed_wall = Some(wall);
            step.completion = completion;
        }
        let mut steps: Vec<Step> = steps.into_values().collect();
        steps.sort_by_key(|step| (step.invoked, step.id));
        Ok(Self { steps })
    }

    /// Every operation, in order of invocation.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// How many operations it holds.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    fn invoke(process: u32, sequence: u64, monotonic: u64) -> Record {
        Record {
            id: OperationId { process, sequence },
            wall: at(0),
            monotonic,
            event: Event::Invoke {
                operation: Operation::Claim {
                    queue: "q".to_owned(),
                },
            },
        }
    }

    fn complete(process: u32, sequence: u64, monotonic: u64) -> Record {
        Record {
            id: OperationId { process, sequence },
            wall: at(0),
            monotonic,
            event: Event::Complete {
                completion: Completion::Ok {
                    outcome: Outcome::Empty,
                },
            },
        }
    }

    #[test]
    fn pairs_halves_in_any_order_and_leaves_the_unfinished_unknown() {
        let history =
            History::from_records([complete(1, 0, 5), invoke(2, 0, 3), invoke(1, 0, 4)]).unwrap();
        let steps = history.steps();
        assert_eq!(steps.len(), 2);
        assert_eq!(
            steps[0].id,
            OperationId {
                process: 2,
                sequence: 0
            }
        );
        assert_eq!(steps[0].completed, None);
        assert!(matches!(steps[0].completion, Completion::Unknown { .. }));
        assert_eq!(steps[1].completed, Some(5));
        assert_eq!(steps[1].completion.outcome(), Some(&Outcome::Empty));
        assert!(!steps[1].precedes(&steps[0]));
    }

    #[test]
    fn malformed_records_are_typed_errors() {
        let id = OperationId {
            process: 1,
            sequence: 0,
        };
        assert_eq!(
            History::from_records([invoke(1, 0, 1), invoke(1, 0, 2)]),
            Err(HistoryError::InvokedTwice(id))
        );
        assert_eq!(
            History::from_records([complete(1, 0, 1)]),
            Err(HistoryError::CompletedWithoutInvocation(id))
        );
        assert_eq!(
            History::from_records([invoke(1, 0, 1), complete(1, 0, 2), complete(1, 0, 3)]),
            Err(HistoryError::CompletedTwice(id))
        );
        assert_eq!(
            History::from_records([invoke(1, 0, 5), complete(1, 0, 2)]),
            Err(HistoryError::CompletedBeforeInvoked(id))
        );
    }

    #[test]
    fn an_enqueue_recorded_before_queues_had_features_reads_as_plain() {
        let old = r#"{"op":"enqueue","task":"render-7"}"#;
        let read: Operation = serde_json::from_str(old).unwrap();
        assert_eq!(read, Operation::enqueue("render-7"));
        assert_eq!(serde_json::to_string(&read).unwrap(), old);

        let unique = r#"{"op":"enqueue","task":"t","queue":"q","unique_key":"k"}"#;
        let read: Operation = serde_json::from_str(unique).unwrap();
        assert_eq!(serde_json::to_string(&read).unwrap(), unique);
        let pass = serde_json::to_string(&Operation::FireSchedules).unwrap();
        assert_eq!(pass, r#"{"op":"fire_schedules"}"#);
    }

    #[test]
    fn a_record_is_one_json_line_and_reads_back() {
        let record = complete(3, 7, 11);
        let line = serde_json::to_string(&record).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), record);
    }
}
