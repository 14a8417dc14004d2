//! The store for Tessera: the work-queue operations (enqueue, claims through
//! adaptive admission, heartbeat, idempotent submission, competing
//! attempts, health, long-polls, anonymous sessions) with access control,
//! audit persistence, storage-quota handling and metering, composing the
//! sans-IO crates `tessera-admission`, `tessera-lease` and `tessera-audit`
//! over one backend seam, with SQLite behind it.
//!
//! This is the crate that does I/O. Every time a rule reads (lease expiry,
//! minutes, days, retention, admission's deadlines) comes from the
//! [`Clock`] in its [`StoreConfig`] ([`SystemClock`] by default,
//! [`ManualClock`] in tests and simulations), so nothing in a test sleeps
//! to make time pass. The operating system's clocks are read directly in
//! four places, none of them a rule: the completer's short wait for more
//! acknowledgements to commit together, the seed of the retry jitter when
//! none is configured, opening a PostgreSQL store (its listener's connect
//! timeout, and the mark its notifications carry), and the
//! `tracing`/`metrics` features' timings.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tessera_store::{
//!     Brief, ClaimOutcome, EnqueueOptions, Grant, IdempotencyKey, KeySpec, ManualClock,
//!     Namespace, Output, QueueName, Scope, Store, StoreConfig, Submitted,
//! };
//!
//! let clock = ManualClock::new("2026-10-29T12:00:00Z".parse()?);
//! let store = Store::open_in_memory(StoreConfig::default().with_clock(Arc::new(clock.clone())))?;
//!
//! // Setting up: the first admin key, shown once and stored only as a hash.
//! let admin_key = store.create_admin_key("operators")?;
//! let admin = store.authenticate(Some(admin_key.secret.expose()))?;
//! let renders = Namespace::parse("renders")?;
//! let worker_key = store.create_key(
//!     &admin,
//!     &KeySpec::keyed("acme")
//!         .with_scopes([Scope::Enqueue, Scope::Claim, Scope::Read])
//!         .with_grant(Grant::Namespace(renders.clone())),
//! )?;
//!
//! // A request: 401 before anything else, 403 before any namespace data.
//! assert_eq!(store.authenticate(Some("tsk_not_a_key")).unwrap_err().status(), 401);
//! let worker = store.authenticate(Some(worker_key.secret.expose()))?;
//! let billing = Namespace::parse("billing")?;
//! let jobs = QueueName::parse("jobs")?;
//! assert_eq!(store.claim(&worker, &billing, &jobs).unwrap_err().status(), 403);
//!
//! // Enqueue, claim (through admission; the lease is one transaction),
//! // heartbeat and submit under an idempotency key.
//! let brief = Brief::Json(serde_json::json!({ "frame": 1 }));
//! let task = store.enqueue(&worker, &renders, &jobs, &brief, &EnqueueOptions::default())?;
//! let ClaimOutcome::Granted(claimed) = store.claim(&worker, &renders, &jobs)? else {
//!     unreachable!("one task is ready");
//! };
//! assert_eq!((claimed.task.clone(), claimed.brief.clone()), (task.clone(), brief));
//! println!("X-Claim-Wait-Ms: {}", claimed.waited.as_millis());
//! let token = claimed.lease.token();
//! store.heartbeat(&worker, &task, token)?;
//! let key = IdempotencyKey::parse("upload-1")?;
//! let first = store.submit(&worker, &task, token, &key, &Output::bytes("done"))?;
//! // A retry with the same key and output replays the receipt, writing nothing.
//! let retry = store.submit(&worker, &task, token, &key, &Output::bytes("done"))?;
//! assert_eq!(retry, Submitted::Replayed(first.receipt().clone()));
//!
//! // An empty queue: no lease, nothing written, and a pacing hint.
//! let empty = store.claim(&worker, &renders, &jobs)?;
//! assert_eq!(empty.retry_after().map(|wait| wait.as_secs()), Some(5));
//!
//! // The provider's allowance is spent: reads answer, writes are a 503 that
//! // resets at the next UTC midnight.
//! store.refuse_writes(true);
//! assert_eq!(store.health(&worker, &renders)?.attempts.done, 1);
//! let refused = store.enqueue(&worker, &renders, &jobs, &Brief::Bytes(vec![]), &EnqueueOptions::default()).unwrap_err();
//! assert_eq!((refused.status(), refused.code()), (503, "storage_quota_exhausted"));
//! assert_eq!(refused.reset_at(), Some("2026-10-30T00:00:00Z".parse()?));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Shape
//!
//! ```text
//!   hosts ── Store: the operations ─────────────────────────── ops/
//!              │  lease/: admission, grant, the one-statement
//!              │  fast path, acknowledgements and their completer,
//!              │  heartbeats, the worker loop; then one family per
//!              │  file: enqueue, tasks, access, health, queues,
//!              │  schedules, bulk, retention, sessions, audit reads
//!              ├─ audit composition, open, read/write ───────── store/
//!              ├─ claim gate, health snapshots, signals ─────── state/
//!              │    (tessera-admission, tessera-audit rules)
//!              ▼
//!   the seam: Backend, ReadTransaction, WriteTransaction ───── backend/
//!              │  domain types in and out (TaskRecord, Receipt,
//!              │  AuditEvent, Counter), errors by kind
//!              ▼
//!   SQLite (feature `sqlite`, default) ─────────────────────── sqlite/
//!      one writer shared by group commit + WAL readers, schema,
//!      cold start, meter hooks, refusal, max_page_count, claim indexes
//!   PostgreSQL (feature `postgres`) ───────────────────────── postgres/
//!      a pool, claims under FOR UPDATE SKIP LOCKED, row locks,
//!      LISTEN/NOTIFY, migrations under an advisory lock
//!
//!   model/: the data every layer shares (Caller, TaskRef, Brief, ...)
//! ```
//!
//! Each layer imports only from its own layer or below. The core never
//! names a database type: a backend turns the seam's calls into its own
//! statements and its faults into a [`StorageError`] of a
//! [`StorageErrorKind`]. The rules are the sans-IO crates' own, re-exported
//! as [`lease`], [`admission`] and [`audit`]; the store calls them
//! (claim order, the daily allowance, the mint window, retention timing,
//! Retry-After rounding) and never restates them.
//!
//! The root shows what a host needs: [`Store`], [`StoreConfig`], [`Error`]
//! and the operations' inputs and outputs. Backend settings are in their
//! module (`sqlite::SqliteOptions`, `postgres::PostgresOptions`), the wire
//! forms of errors in [`error`], the fixed limits in [`limits`]. The
//! backend is chosen when the store is opened ([`Store::open`] for a SQLite
//! file, `Store::open_postgres` for a shared PostgreSQL database); the
//! operations, their errors and their tests are the same on both.
//!
//! What each operation family does underneath (tasks and the claim order,
//! claims and admission, reads, anonymous sessions, opening, access, audit
//! and retention, the storage quota, errors, metering) is described in
//! `docs/store.md`.

#![forbid(unsafe_code)]
// Without a backend the core compiles but nothing can open a store.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(dead_code, unused_imports)
)]

// The layers, bottom up; a module imports only from its own layer or
// below. Model: the data operations take and return.
mod clock;
mod config;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod key;
mod meter;
mod model;
mod observe;
// The seam, and the backends behind it.
mod backend;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
// Runtime state shared by the operations.
mod state;
// The store and its composition, then the operations.
pub(crate) mod ops;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{AckBatching, StoreConfig};
pub use error::{ConflictKind, Error, StorageError, StorageErrorKind};
pub use key::{KeyId, KeySecret};
pub use meter::MeterSnapshot;
pub use model::access::{
    Caller, Grant, IssuedKey, KeyFilter, KeyInfo, KeySpec, PrincipalId, PrincipalKind, Scope,
};
pub use model::audit::{AuditCursor, AuditPage, AuditQuery, Maintenance, RetentionSummary};
pub use model::bulk::{AttemptProgress, BulkFilter};
pub use model::claim::{ClaimOutcome, Claimed, ClaimedBatch, EmptyReason};
pub use model::health::{HealthSnapshot, QueueDepth, StateCounts};
pub use model::queue::{QueueRetention, QueueSettings};
#[cfg(feature = "schedule")]
pub use model::schedule::{Fired, SchedulePage, ScheduleSpec, ScheduleView};
pub use model::session::Session;
pub use model::task::{
    Brief, EnqueueOptions, Enqueued, ListOrder, Output, ParentAlternatives, StoredReceipt,
    SubmitRequest, TaskCursor, TaskListing, TaskPage, TaskQuery, TaskRef, TaskView,
};
pub use model::wait::WaitOutcome;
pub use ops::lease::claim_async::PermitFuture;
pub use ops::lease::worker::{PendingAck, Worker, WorkerNext, WorkerOptions, WorkerStats};
#[cfg(feature = "schedule")]
pub use ops::schedule::Scheduler;
pub use state::gate::{CancelToken, ClaimEvent, ClaimPermit, ClaimStart, ClaimWaker};
pub use store::Store;

pub use tessera_admission::{AdmissionConfig, IdleConfig, MintConfig, Stats, Ticket};
pub use tessera_audit::{Action, AuditEvent, Counter, IpHash, Outcome, Secret};
pub use tessera_lease::{
    AttemptNumber, BriefVersion, ConcurrencyLimit, DiscardReason, Failure, FencingToken,
    IdempotencyKey, Lease, LeaseError, Namespace, PartitionKey, QueueName, Receipt, Retention,
    Retry, RunAfter, ScheduleName, StateName, Submitted, TaskId, TaskSpec, TaskState, UniqueKey,
    UniqueMode, UniqueStates, Uniqueness,
};
#[cfg(feature = "schedule")]
pub use tessera_lease::{CronSchedule, ScheduleText};

/// The limits and fixed names the store applies.
pub mod limits {
    pub use crate::model::access::{MAX_ACCOUNT_LEN, MAX_KEYS_LISTED, MAX_LABEL_LEN};
    pub use crate::model::audit::{MAX_AUDIT_ROWS, STORE_NAMESPACE};
    pub use crate::model::bulk::BULK_BATCH;
    pub use crate::model::claim::MAX_CLAIM_BATCH;
    pub use crate::model::health::HEALTH_SNAPSHOT_TTL;
    #[cfg(feature = "schedule")]
    pub use crate::model::schedule::MAX_SCHEDULES_LISTED;
    pub use crate::model::session::ANONYMOUS_ACCOUNT;
    pub use crate::model::task::{
        MAX_ENQUEUE_BATCH, MAX_SUBMIT_BATCH, MAX_TASKS_LISTED, PRACTICE_QUEUE,
    };
    pub use crate::model::wait::MAX_LONG_POLL;
    pub use crate::ops::lease::LIMITED_RETRY_AFTER;
    pub use tessera_lease::{
        DEFAULT_MAX_TRIES, MAX_ALTERNATIVES, MAX_BRIEF_BYTES, MAX_ERROR_BYTES, MAX_LEASE_DURATION,
        MAX_PARENTS, MAX_PRIORITY, MAX_PROGRESS_BYTES, MAX_TRIES,
    };
}

/// The policies the store composes, through their own crates: the bare
/// admission controller, idle pacing and the mint allowance.
pub use tessera_admission as admission;
/// Audit events, counters, retention and redaction rules.
pub use tessera_audit as audit;
/// The lease rules and records: tasks, attempts, tokens, receipts.
pub use tessera_lease as lease;
