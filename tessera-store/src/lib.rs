//! The store for Tessera: the work-queue operations (enqueue, claims through
//! adaptive admission, heartbeat, idempotent submission, competing
//! attempts, health, long-polls, anonymous sessions) with access control,
//! audit persistence, storage-quota handling and metering, composing the
//! sans-IO crates `tessera-admission`, `tessera-lease` and `tessera-audit`
//! over one backend seam, with SQLite behind it.
//!
//! This is the crate that does I/O. It still never reads the operating
//! system's clock directly: all time comes from the [`Clock`] in its
//! [`StoreConfig`] ([`SystemClock`] by default, [`ManualClock`] in tests and
//! simulations), so nothing in a test sleeps to make time pass.
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
//!              │  one family per file: access, tasks, claims,
//!              │  health, long-polls, sessions, audit reads
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
//! - **Tasks** ([`Store::enqueue`]): a versioned [`Brief`] with 1 to 32
//!   competing attempts; `tasks`, `attempts` and `receipts` rows carry
//!   `tessera-lease`'s records, and every rule ([`Store::heartbeat`],
//!   [`Store::submit`], [`Store::fail`], [`Store::expire_leases`]) runs on
//!   them inside one write transaction, with its audit row. On SQLite the
//!   writes of concurrent callers share one `BEGIN IMMEDIATE` transaction
//!   and one commit (group commit), each under its own savepoint: a
//!   failing write rolls back alone, a failed commit fails every write it
//!   carried, and no caller is answered before its commit. The claim order is
//!   the highest priority first, then oldest ready first, then lapsed
//!   leases, ended backoffs and passed schedules by when each became
//!   claimable (the older task first when two became claimable at the
//!   same time), from index searches however many tasks wait (one per
//!   priority of each index, at most four): a task's `claimable_at` (0
//!   while an attempt is ready, else its earliest backoff end or not-before
//!   time) in the partial `tasks_claim_order` index, and each leased
//!   attempt's lapse time in the partial `attempts_lapse_order` index. A leased
//!   task is in the first only while it also has an attempt ready, in
//!   backoff or scheduled, so a heartbeat rewrites just its attempt's lease
//!   entry. The
//!   store reads its clock at whole milliseconds, the
//!   precision times are stored at, so a lease or receipt read back (or
//!   replayed) equals the one first handed out.
//! - **Claims**: only new claims enter admission, one [`Admission`](admission::Admission)
//!   controller per store behind a `parking_lot` mutex. Thread-per-request
//!   hosts call the blocking [`Store::claim`]; async hosts await
//!   [`Store::claim_async`] (or [`Store::claim_permit`], then
//!   [`Store::finish_claim`] on a blocking pool), on any executor, or drive
//!   [`Store::begin_claim`], [`Store::poll_claim_event`],
//!   [`Store::poll_claim_timeout`] and [`Store::cancel_claim`] themselves
//!   (see `begin_claim` for the driver loop). A
//!   [`ClaimPermit`] hands its capacity back when dropped, so no error or
//!   panic leaks it. A [`Claimed`] lease serializes with the artifact key
//!   its output goes under. Empty claims get the idle-pacing `Retry-After`.
//! - **Reads**: [`Store::read_task`], [`Store::read_receipt`] (the audit
//!   row names the run), [`Store::alternatives`], [`Store::health`] (a
//!   15-second snapshot dropped by any change in the namespace;
//!   [`Store::public_health`] for configured public namespaces, without a
//!   key) and the long-poll [`Store::wait_for_work`].
//! - **Anonymous sessions** ([`Store::mint_session`]): the mint allowance
//!   and per-address-group limits, a durable quota row; the session's
//!   namespace and practice tasks are made on its first use.
//! - **Opening** ([`Store::open`], [`Store::open_in_memory`]): a new file
//!   gets the whole schema in one transaction; an existing one is inspected
//!   (`sqlite_master`, columns, the `tessera_meta` `schema_version` marker)
//!   and only missing tables, indexes and columns are created, so opening an
//!   up-to-date database writes nothing. A newer [`SCHEMA_VERSION`](sqlite::SCHEMA_VERSION) is
//!   refused before anything could write (`journal_mode` included); a damaged
//!   or foreign file is [`Error::CorruptDatabase`]. Dropping a store folds
//!   its write-ahead log into the file.
//! - **Access**: keys are `tsk_<key id>_<secret>` with 256 random bits,
//!   stored as the SHA-256 of the whole key beside the public [`KeyId`].
//!   [`Store::authenticate`] is one indexed read and a constant-time compare;
//!   [`Caller`] decides grants and scopes; [`Store::recheck`] re-reads a key
//!   after a wait. Keys are created, listed, revoked and expired through the
//!   store, each an audited action. `last_used_at` reflects the last
//!   audited action, at most 60 s behind: it rides in that action's
//!   transaction at most once a minute, so a request that writes nothing
//!   pays nothing for it; a changed account or kind is written at once.
//! - **Audit**: every successful action writes one row (a write in the
//!   action's own transaction, a read in a short transaction after it
//!   answers), except a health read ([`Store::health`]): that is an
//!   aggregate status served from a 15-second snapshot, not a read of a
//!   resource, so it writes nothing, as the hosted service's does. Denied,
//!   failed and no-op requests are counted in memory, so such a request
//!   never pays for a write; a minute's counters are written once it has
//!   passed by [`Store::maintain`] (which the host runs at
//!   [`Store::next_maintenance`], and the store after each successful
//!   write), before an audit read ([`Store::audit`]), or at once when
//!   1,024 distinct counters wait. Retention deletes rows older than 24 hours, and
//!   anonymous principals, their keys and limit rows past their purge time
//!   (with a session's namespace, its practice tasks, their attempts and
//!   receipts), and finished tasks past their keep time
//!   ([`StoreConfig::with_retention`]: done a day, discarded, failed and
//!   cancelled a week, by default) with their attempts, receipts and
//!   unique slot, at most every five minutes in batches of 500, through
//!   indexes.
//! - **Storage quota**: `SQLITE_FULL`, a configured daily rows-written
//!   allowance, a host [`QuotaClassifier`](sqlite::QuotaClassifier) and [`Store::refuse_writes`] are
//!   all `503 storage_quota_exhausted` with the next 00:00 UTC as
//!   `reset_at`. Nothing is retried, reset or deleted to get around one;
//!   a refused write is rolled back whole, its audit row with it.
//! - **Errors**: one [`Error`] with `status`, `code`, `retry_after`,
//!   `reset_at`, a JSON [`body`](Error::body) and a
//!   [`tool_error`](Error::tool_error) form.
//! - **Metering**: [`Store::meter`] and [`Store::measure`] count rows
//!   written (index entries included) and rows read; see [`MeterSnapshot`].

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
    Brief, EnqueueOptions, Enqueued, ListOrder, Output, StoredReceipt, SubmitRequest, TaskCursor,
    TaskListing, TaskPage, TaskQuery, TaskRef, TaskView,
};
pub use model::wait::WaitOutcome;
pub use ops::claim_async::PermitFuture;
#[cfg(feature = "schedule")]
pub use ops::schedule::Scheduler;
pub use ops::worker::{PendingAck, Worker, WorkerNext, WorkerOptions, WorkerStats};
pub use state::gate::{CancelToken, ClaimEvent, ClaimPermit, ClaimStart, ClaimWaker};
pub use store::Store;

pub use tessera_admission::{AdmissionConfig, IdleConfig, MintConfig, Stats, Ticket};
pub use tessera_audit::{Action, AuditEvent, Counter, IpHash, Outcome, Secret};
pub use tessera_lease::{
    AttemptNumber, BriefVersion, ConcurrencyLimit, DiscardReason, Failure, FencingToken,
    IdempotencyKey, Lease, LeaseError, Namespace, PartitionKey, QueueName, Receipt, Retention,
    Retry, ScheduleName, StateName, Submitted, TaskId, TaskSpec, TaskState, UniqueKey, UniqueMode,
    UniqueStates, Uniqueness,
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
        MAX_PRIORITY, MAX_PROGRESS_BYTES, MAX_TRIES,
    };
}

/// The policies the store composes, through their own crates: the bare
/// admission controller, idle pacing and the mint allowance.
pub use tessera_admission as admission;
/// Audit events, counters, retention and redaction rules.
pub use tessera_audit as audit;
/// The lease rules and records: tasks, attempts, tokens, receipts.
pub use tessera_lease as lease;
