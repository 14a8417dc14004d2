//! A pure checker of Tessera histories: reads what every process of a run
//! asked the store and was told, with the store's state at the end, and
//! names every lost, doubled or overlapping piece of work.
//!
//! The checker never reads a clock, sleeps, spawns or does I/O: a history
//! is data ([`Record`]s, one JSON line each, as processes append them), and
//! [`check`] is a function of that data and the [`FinalState`]. Recording
//! and reading the store are the run's business.
//!
//! # Model
//!
//! ```text
//!  process 1: invoke ─────── complete ok/fail/unknown      Record per half,
//!  process 2:      invoke ──────────── (killed)            monotonic + wall time
//!            └──────── History::from_records ────────┘     paired into Steps
//!                                │
//!            check(&history, &final_state) ──> Report { anomalies, … }
//! ```
//!
//! An operation completes `ok` (acknowledged, with its result), `fail` (an
//! error that says nothing changed) or `unknown` (a timeout, a lost
//! connection, a process killed before it recorded the answer). Unknown
//! operations may have happened or not; acknowledged ones must show in the
//! end. Two operations are ordered only when one completed before the
//! other was invoked (the machine's monotonic clock, shared by its
//! processes); leases are compared by the store's own times.
//!
//! The checks, each an [`AnomalyKind`]:
//! - no two acknowledged leases of one attempt are valid at once, given
//!   each grant's expiry and every acknowledged heartbeat (beyond the
//!   clock skew between processes [`CheckOptions`] allows);
//! - fencing tokens rise per task in the order grants were acknowledged,
//!   and the final token counter is never behind an acknowledged grant;
//! - an acknowledged submission is stored with its payload's digest, a
//!   replay returns the stored receipt, no attempt holds two receipts,
//!   and a superseded token's submission is never accepted;
//! - an acknowledged enqueue's task ends done, discarded, cancelled or
//!   still claimable, and nothing runs after an acknowledged cancel;
//! - a task is missing at the end only where the store's retention may
//!   have purged it ([`FinalRetention`]): every attempt may have ended
//!   early enough for its state's keep time to have passed before the end
//!   was read, and no more tasks of a queue are missing so than the
//!   store's audit counts purged (a purged task's receipts and token
//!   counter went with it);
//! - every effect at the end (a task, a receipt, a grant counted by the
//!   token counter) was made by some operation that was acknowledged or
//!   whose outcome is unknown, or by a schedule's fire;
//! - no attempt holds two receipt rows, and no more attempts of a task
//!   hold one than it allows alternatives;
//! - two tasks never hold one unique key of a queue at once;
//! - no grant exceeds its queue's or its partition's concurrency limit,
//!   counting only leases certainly held;
//! - no grant is made on a queue certainly paused, or after its task's
//!   deadline;
//! - each run-at of a schedule fires once, every fire's task is kept, and
//!   a run-at due while no pause of its schedule could hold is fired;
//! - no task enqueued to run after its parents are done is granted before
//!   a submission of each parent was asked for.
//!
//! An operation whose outcome is unknown may have taken effect once, at
//! any moment after its invocation, or never: it excuses only what it
//! could have caused from there (a cancel, one moment's overlaps).
//!
//! # Example
//!
//! ```
//! use chrono::{DateTime, TimeDelta, Utc};
//! use tessera_check::{
//!     AnomalyKind, AttemptState, Completion, Event, FinalAttempt, FinalState, FinalTask,
//!     History, Operation, OperationId, Outcome, Record, check,
//! };
//!
//! let noon: DateTime<Utc> = "2026-10-29T12:00:00Z".parse()?;
//! let record = |process, sequence, monotonic, event| Record {
//!     id: OperationId { process, sequence },
//!     wall: noon,
//!     monotonic,
//!     event,
//! };
//! let invoke = |operation| Event::Invoke { operation };
//! let ok = |outcome| Event::Complete { completion: Completion::Ok { outcome } };
//! let task = || "render-7".to_owned();
//! let records = vec![
//!     record(0, 0, 1, invoke(Operation::enqueue(task()))),
//!     record(0, 0, 2, ok(Outcome::Enqueued)),
//!     record(1, 0, 3, invoke(Operation::Claim { queue: "frames".to_owned() })),
//!     record(1, 0, 4, ok(Outcome::Granted {
//!         task: task(),
//!         attempt: 1,
//!         token: 1,
//!         granted_at: noon,
//!         expires_at: noon + TimeDelta::seconds(60),
//!     })),
//!     // A second process is granted the same attempt while the first
//!     // lease is live.
//!     record(2, 0, 5, invoke(Operation::Claim { queue: "frames".to_owned() })),
//!     record(2, 0, 6, ok(Outcome::Granted {
//!         task: task(),
//!         attempt: 1,
//!         token: 2,
//!         granted_at: noon + TimeDelta::seconds(5),
//!         expires_at: noon + TimeDelta::seconds(65),
//!     })),
//! ];
//! let history = History::from_records(records)?;
//! let mut end = FinalState::default();
//! end.tasks.insert(task(), FinalTask {
//!     last_token: Some(2),
//!     attempts: vec![FinalAttempt::new(1, AttemptState::Leased)],
//! });
//!
//! let report = check(&history, &end);
//! assert_eq!(report.anomalies.len(), 1);
//! let anomaly = &report.anomalies[0];
//! assert_eq!(anomaly.kind, AnomalyKind::OverlappingLeases);
//! assert_eq!(
//!     anomaly.operations,
//!     [OperationId { process: 1, sequence: 0 }, OperationId { process: 2, sequence: 0 }],
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod check;
mod dependency;
mod grant;
mod history;
mod index;
mod lease;
mod limit;
mod purge;
mod receipt;
mod schedule;
mod state;
mod unique;

pub use check::{Anomaly, AnomalyKind, CheckOptions, Report, check, check_with};
pub use history::{
    Completion, Event, Fire, History, HistoryError, Operation, OperationId, Outcome, Receipt,
    Record, Step,
};
pub use state::{
    AttemptState, FinalAttempt, FinalFire, FinalReceipt, FinalRetention, FinalSchedule, FinalState,
    FinalTask,
};
