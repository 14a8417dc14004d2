//! Hand-written histories: a script of operations, each invoked and
//! completed at the next ticks of a shared monotonic clock.

#![allow(dead_code)]

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_check::{Completion, Event, History, Operation, OperationId, Outcome, Receipt, Record};

/// Noon, plus `seconds`.
pub(crate) fn at(seconds: i64) -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::seconds(seconds)
}

#[derive(Debug, Default)]
pub(crate) struct Script {
    records: Vec<Record>,
    tick: u64,
    next: HashMap<u32, u64>,
    open: HashMap<OperationId, ()>,
}

impl Script {
    /// Invokes `operation` on `process`, its wall clock reading `wall`
    /// seconds past noon, and leaves it open.
    pub(crate) fn begin(&mut self, process: u32, wall: i64, operation: Operation) -> OperationId {
        let sequence = self.next.entry(process).or_default();
        let id = OperationId {
            process,
            sequence: *sequence,
        };
        *sequence += 1;
        self.tick += 1;
        self.records.push(Record {
            id,
            wall: at(wall),
            monotonic: self.tick,
            event: Event::Invoke { operation },
        });
        self.open.insert(id, ());
        id
    }

    /// Completes the open operation `id`.
    pub(crate) fn end(&mut self, id: OperationId, wall: i64, completion: Completion) {
        assert!(self.open.remove(&id).is_some());
        self.tick += 1;
        self.records.push(Record {
            id,
            wall: at(wall),
            monotonic: self.tick,
            event: Event::Complete { completion },
        });
    }

    /// Invokes and at once completes an operation.
    pub(crate) fn run(
        &mut self,
        process: u32,
        wall: i64,
        operation: Operation,
        completion: Completion,
    ) -> OperationId {
        let id = self.begin(process, wall, operation);
        self.end(id, wall, completion);
        id
    }

    /// An acknowledged operation.
    pub(crate) fn ok(
        &mut self,
        process: u32,
        wall: i64,
        operation: Operation,
        outcome: Outcome,
    ) -> OperationId {
        self.run(process, wall, operation, Completion::Ok { outcome })
    }

    pub(crate) fn enqueue(&mut self, task: &str) -> OperationId {
        self.ok(0, 0, enqueue(task), Outcome::Enqueued)
    }

    /// A claim of `process` granted at `wall`, lasting `seconds`.
    pub(crate) fn grant(
        &mut self,
        process: u32,
        wall: i64,
        task: &str,
        attempt: u32,
        token: i64,
        seconds: i64,
    ) -> OperationId {
        self.ok(
            process,
            wall,
            claim(),
            Outcome::Granted {
                task: task.to_owned(),
                attempt,
                token,
                granted_at: at(wall),
                expires_at: at(wall + seconds),
            },
        )
    }

    /// An accepted submission for attempt 1, returning its receipt.
    pub(crate) fn accept(
        &mut self,
        process: u32,
        wall: i64,
        task: &str,
        token: i64,
        key: &str,
        digest: &str,
    ) -> (OperationId, Receipt) {
        let attempt = 1;
        let receipt = receipt(attempt, token, key, digest, wall);
        let id = self.ok(
            process,
            wall,
            submit(task, attempt, token, key, digest),
            Outcome::Accepted {
                receipt: receipt.clone(),
            },
        );
        (id, receipt)
    }

    pub(crate) fn history(&self) -> History {
        History::from_records(self.records.clone()).unwrap()
    }
}

pub(crate) fn enqueue(task: &str) -> Operation {
    Operation::enqueue(task)
}

pub(crate) fn claim() -> Operation {
    Operation::Claim {
        queue: "frames".to_owned(),
    }
}

pub(crate) fn heartbeat(task: &str, attempt: u32, token: i64) -> Operation {
    Operation::Heartbeat {
        task: task.to_owned(),
        attempt,
        token,
    }
}

pub(crate) fn submit(task: &str, attempt: u32, token: i64, key: &str, digest: &str) -> Operation {
    Operation::Submit {
        task: task.to_owned(),
        attempt,
        token,
        key: key.to_owned(),
        digest: digest.to_owned(),
    }
}

pub(crate) fn fail(task: &str, attempt: u32, token: i64, retry: bool) -> Operation {
    Operation::Fail {
        task: task.to_owned(),
        attempt,
        token,
        retry,
    }
}

pub(crate) fn cancel(task: &str) -> Operation {
    Operation::Cancel {
        task: task.to_owned(),
    }
}

pub(crate) fn receipt(attempt: u32, token: i64, key: &str, digest: &str, wall: i64) -> Receipt {
    Receipt {
        attempt,
        token,
        key: key.to_owned(),
        digest: digest.to_owned(),
        accepted_at: at(wall),
    }
}

pub(crate) fn unknown() -> Completion {
    Completion::Unknown {
        reason: "connection lost".to_owned(),
    }
}

pub(crate) fn refused(code: &str) -> Completion {
    Completion::Fail {
        error: code.to_owned(),
    }
}

/// What an enqueue of a queue feature records beside the task.
#[derive(Debug, Clone, Default)]
pub(crate) struct Enqueued {
    pub(crate) queue: Option<&'static str>,
    pub(crate) partition: Option<&'static str>,
    pub(crate) unique_key: Option<&'static str>,
    pub(crate) deadline: Option<DateTime<Utc>>,
    pub(crate) alternatives: Option<u16>,
    pub(crate) max_tries: Option<u32>,
    pub(crate) after: Vec<&'static str>,
    pub(crate) any_outcome: bool,
}

pub(crate) fn enqueue_with(task: &str, with: Enqueued) -> Operation {
    Operation::Enqueue {
        task: task.to_owned(),
        queue: with.queue.map(str::to_owned),
        partition: with.partition.map(str::to_owned),
        unique_key: with.unique_key.map(str::to_owned),
        deadline: with.deadline,
        alternatives: with.alternatives,
        max_tries: with.max_tries,
        after: with
            .after
            .iter()
            .map(|parent| (*parent).to_owned())
            .collect(),
        any_outcome: with.any_outcome,
    }
}

pub(crate) fn pause_queue() -> Operation {
    Operation::PauseQueue {
        queue: "frames".to_owned(),
    }
}

pub(crate) fn resume_queue() -> Operation {
    Operation::ResumeQueue {
        queue: "frames".to_owned(),
    }
}

pub(crate) fn set_limits(queue_limit: Option<u32>, partition_limit: Option<u32>) -> Operation {
    Operation::SetLimits {
        queue: "frames".to_owned(),
        queue_limit,
        partition_limit,
    }
}

pub(crate) fn snooze(task: &str, attempt: u32, token: i64) -> Operation {
    Operation::Snooze {
        task: task.to_owned(),
        attempt,
        token,
    }
}

pub(crate) fn pause_schedule(schedule: &str) -> Operation {
    Operation::PauseSchedule {
        schedule: schedule.to_owned(),
    }
}

pub(crate) fn resume_schedule(schedule: &str) -> Operation {
    Operation::ResumeSchedule {
        schedule: schedule.to_owned(),
    }
}

/// The id a schedule's fire gives its task.
pub(crate) fn fire_task(schedule: &str, run_at: DateTime<Utc>) -> String {
    format!("sched-{schedule}-{:013}", run_at.timestamp_millis())
}

/// A scheduler pass's outcome: these fires.
pub(crate) fn fired(fires: &[(&str, DateTime<Utc>)]) -> Outcome {
    Outcome::Fired {
        fires: fires
            .iter()
            .map(|(schedule, run_at)| tessera_check::Fire {
                schedule: (*schedule).to_owned(),
                run_at: *run_at,
                task: fire_task(schedule, *run_at),
            })
            .collect(),
    }
}
