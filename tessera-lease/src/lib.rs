//! Sans-IO lease rules for Tessera: fencing tokens, task states, competing
//! attempts, idempotent submissions and receipts.
//!
//! A store (such as `tessera-store`) loads a task, applies one rule inside
//! its transaction and writes the result back. The rules never read a clock,
//! sleep, spawn or do I/O: time is a `now: DateTime<Utc>` argument (wall
//! clock, since leases are persisted), and every rule either applies whole or
//! returns a [`LeaseError`] and changes nothing.
//!
//! # Model
//!
//! ```text
//!  Task (one versioned brief)           tasks row: id, version, lapse backoff,
//!   ├─ last fencing token                          last token
//!   ├─ Attempt 1: state, tries, lease   attempts rows: (task, number) -> state,
//!   ├─ Attempt 2: …                                backoff end, tries, lease
//!   └─ …  (1 to MAX_ALTERNATIVES)
//!  Receipt per accepted submission      receipts rows keyed by
//!                                                  (principal, task, idempotency key)
//! ```
//!
//! - **Attempts** are the unit that is leased. A task has one by default;
//!   with [`TaskSpec::alternatives`] several workers solve the same brief as
//!   competing attempts, each with its own lease, artifact key and receipt,
//!   and none affects another. [`Task::alternatives`] lists the finished ones
//!   for a comparison step.
//! - **Fencing tokens** come from one counter per task, so they strictly
//!   increase across every grant, lapse and re-claim, and a token names one
//!   grant. Heartbeat, submit and fail need the live lease of their token
//!   held by the caller: a stale token, another holder or a lapsed lease is
//!   refused, so an expired lease is never permission to overwrite another
//!   worker's result. Each grant also owns its [`ArtifactKey`].
//! - **Claim order** ([`TaskRecord::claimable_at`],
//!   [`AttemptRecord::lapses_at`], [`ClaimKey`], [`first_claimable`]): when a
//!   task becomes claimable (ready now, a backoff's end, a lease's lapse plus
//!   the lapse backoff) and which goes first (ready ones oldest first, then
//!   the rest by when each became claimable, ties to the older task). A
//!   backend indexes these values; it does not restate the rule.
//! - **Idempotency**: a submission carries an [`IdempotencyKey`] and a
//!   payload [`Digest`]. The same key and digest replay the stored
//!   [`Receipt`] unchanged; the same key with another digest is a conflict
//!   ([`decide_idempotency`]). Keys are scoped per principal and task.
//! - **Queue features** as rules the backends index: unique tasks
//!   ([`Uniqueness`], [`decide_duplicate`]: a unique index over a
//!   [`UniqueSlot`], never a lock), periodic schedules (`CronSchedule`,
//!   feature `schedule`: fired once per run-at through a unique
//!   `(schedule, run_at)` index, one catch-up fire after downtime) and concurrency limits
//!   ([`ConcurrencyLimit`]: slots are leased attempts as stored, so a late
//!   holder can never free one twice).
//! - **Names** ([`Namespace`], [`QueueName`], [`TaskId`], [`Principal`],
//!   [`IdempotencyKey`], [`ArtifactKey`]) are validated in one place when
//!   parsed or deserialized; briefs are bounded by [`MAX_BRIEF_BYTES`].
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use chrono::{DateTime, TimeDelta, Utc};
//! use tessera_lease::{
//!     BriefVersion, Digest, IdempotencyKey, LeaseError, Principal, Submission, Submitted,
//!     Task, TaskId, TaskSpec,
//! };
//!
//! let now: DateTime<Utc> = "2026-10-29T12:00:00Z".parse()?;
//! let mut task = Task::new(TaskId::parse("render-42")?, BriefVersion::FIRST, TaskSpec::default())?;
//! let alice = Principal::parse("worker-alice")?;
//! let bob = Principal::parse("worker-bob")?;
//!
//! // Alice claims and heartbeats; her lease then lapses.
//! let lease = task.claim(&alice, now, Duration::from_secs(30))?;
//! task.heartbeat(&alice, lease.token(), now + TimeDelta::seconds(20), Duration::from_secs(30))?;
//! let later = now + TimeDelta::seconds(60);
//! assert!(matches!(
//!     task.heartbeat(&alice, lease.token(), later, Duration::from_secs(30)),
//!     Err(LeaseError::LeaseExpired { .. })
//! ));
//!
//! // Bob claims the lapsed task under a higher token and submits.
//! let bobs = task.claim(&bob, later, Duration::from_secs(30))?;
//! assert!(bobs.token() > lease.token());
//! let submission = Submission {
//!     principal: bob.clone(),
//!     token: bobs.token(),
//!     key: IdempotencyKey::parse("bob-upload-1")?,
//!     digest: Digest::from_bytes([7; 32]),
//! };
//! let Submitted::Accepted(receipt) = task.submit(&submission, None, later)? else {
//!     unreachable!("no receipt was stored under this key");
//! };
//! assert_eq!(receipt.artifact.as_str(), "render-42.a1.t2");
//!
//! // Alice's stale token can never overwrite Bob's result.
//! let stale = Submission { principal: alice, token: lease.token(), ..submission.clone() };
//! assert!(matches!(task.submit(&stale, None, later), Err(LeaseError::StaleToken { .. })));
//!
//! // Bob retries (say the response was lost): the store finds his receipt by
//! // key and the rule replays it unchanged.
//! let retry = task.submit(&submission, Some(&receipt), later + TimeDelta::seconds(5))?;
//! assert_eq!(retry, Submitted::Replayed(receipt));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod attempt;
mod claim_order;
mod dependency;
mod digest;
mod error;
mod lease;
mod limit;
mod name;
mod receipt;
mod retention;
#[cfg(feature = "schedule")]
mod schedule;
mod spec;
mod state;
mod task;
mod time;
mod token;
mod tries;
mod unique;

pub use attempt::AttemptRecord;
pub use claim_order::{ClaimKey, ClaimSource, ClaimableAt, first_claimable, priorities};
pub use dependency::{
    Cascade, DependencyError, MAX_PARENTS, ParentEnd, RunAfter, Unblocked, Waiting, check_batch,
};
pub use digest::Digest;
pub use error::{DurationRule, Field, LeaseError, LeaseErrorKind, Rule};
pub use lease::{Lease, LeaseRecord};
pub use limit::{ConcurrencyLimit, Held};
pub use name::{
    ArtifactKey, AttemptNumber, BriefVersion, IdempotencyKey, MAX_BRIEF_BYTES, MAX_PROGRESS_BYTES,
    Namespace, PartitionKey, Principal, QueueName, ScheduleName, TaskId, UniqueKey,
    check_brief_size, check_output_size, check_progress_size,
};
pub use receipt::{Idempotency, Receipt, Submission, Submitted, decide_idempotency};
pub use retention::Retention;
#[cfg(feature = "schedule")]
pub use schedule::{CronSchedule, ScheduleText, fire_task_id};
pub use spec::{Failure, MAX_ALTERNATIVES, MAX_PRIORITY, Retry, TaskRecord, TaskSpec};
pub use state::{DiscardReason, StateName, TaskState};
pub use task::{PARENT_FAILED, Task};
pub use time::{MAX_BACKOFF, MAX_LEASE_DURATION};
pub use token::FencingToken;
pub use tries::{
    DEFAULT_MAX_TRIES, Jitter, MAX_ERROR_BYTES, MAX_TRIES, RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP,
    retry_backoff,
};
pub use unique::{
    Duplicate, Holder, MAX_UNIQUE_WINDOW, UniqueMode, UniqueSlot, UniqueStates, Uniqueness,
    decide_duplicate, holds,
};
