//! The store: opening, the connection discipline, and the helpers every
//! operation runs through.
//!
//! # Locks
//!
//! Threads share these mutexes: the write connection, the read pool's idle
//! list, the claim gate (admission, idle pacing, waiting claims) and its
//! waker slot, the health snapshots, the long-poll signals, the counter
//! buffer, retention, the `last_used_at` coalescing and the mint allowance.
//! Each is held for one step and none is taken while another is held, so
//! there is no order between them to get wrong; the only locks taken under
//! one are leaves that take nothing further (a `ManualClock`'s, and the
//! write connection's hook state inside a transaction). In particular:
//!
//! - the write connection is held for one transaction: nothing inside one
//!   counts, touches the gate, the health snapshots or the signals, or
//!   waits for a read connection, and no thread parks holding it;
//! - a claim parks on the gate's condvar and a long-poll on the signals',
//!   each releasing its mutex while it sleeps and holding no other; a
//!   claim waker is called after the gate is released;
//! - a claim permit is never released (finished or dropped) while the gate
//!   is held.

use std::fmt;
#[cfg(feature = "sqlite")]
use std::path::Path;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use tessera_admission::MintAllowance;
use tessera_audit::{AddressHasher, CounterBuffer, ObservationCoalescer, RetentionSchedule};
use tessera_lease::{Jitter, Namespace, QueueName};

use crate::backend::{Backend, OpenPolicy, ReadTransaction, Signal, SignalSink, WriteTransaction};
use crate::clock::{Clock, storable};
use crate::config::StoreConfig;
use crate::error::Error;
use crate::meter::MeterSnapshot;
use crate::model::access::{Identity, PrincipalId};
use crate::model::ack::{Ack, AckAnswer};
#[cfg(feature = "postgres")]
use crate::postgres as pg;
#[cfg(feature = "sqlite")]
use crate::sqlite::{SqliteBackend, SqliteOptions};
use crate::state::completer::Completer;
use crate::state::gate::Gate;
use crate::state::health::HealthCache;
use crate::state::signals::QueueSignals;

pub(crate) mod compose;

thread_local! {
    /// Queues a write transaction on this thread made work claimable in
    /// other than by an enqueue (a task whose last parent ended), to wake
    /// once it commits.
    static WOKEN: std::cell::RefCell<Vec<(Namespace, QueueName)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Wakes `queue` of `namespace` (idle pacing starts again, long-polls
/// wake) once the write transaction running on this thread commits.
pub(crate) fn wake_after_commit(namespace: &Namespace, queue: &QueueName) {
    WOKEN.with(|woken| {
        let mut woken = woken.borrow_mut();
        let key = (namespace.clone(), queue.clone());
        if !woken.contains(&key) {
            woken.push(key);
        }
    });
}

fn take_woken() -> Vec<(Namespace, QueueName)> {
    WOKEN.with(|woken| std::mem::take(&mut *woken.borrow_mut()))
}

/// A Tessera store over one database.
///
/// Every operation runs through the backend chosen when the store is
/// opened (SQLite: [`Store::open`], [`Store::open_sqlite`]); the rules,
/// admission, audit composition and caches are the store's own, the same
/// on every backend. `Store` is `Send + Sync`; share it with an `Arc`.
///
/// Dropping it releases the backend: on SQLite the write-ahead log is
/// folded into the database file, so a closed store leaves no log behind
/// (best effort; unless writes are refused, see
/// [`refuse_writes`](Self::refuse_writes)).
pub struct Store {
    pub(crate) config: StoreConfig,
    backend: Box<dyn Backend>,
    /// Counts of requests that are not audited, waiting to be written.
    pub(crate) counters: Mutex<CounterBuffer>,
    pub(crate) retention: Mutex<RetentionSchedule>,
    /// Until when storage refuses writes, by its latest refusal of one of
    /// this store's writes for a quota (none since a write succeeded).
    pub(crate) quota_refused_until: Mutex<Option<DateTime<Utc>>>,
    /// This store's latest retention run.
    pub(crate) last_retention: Mutex<Option<crate::model::audit::RetentionSummary>>,
    /// When each principal's `last_used_at` is next written. A changed
    /// account or kind ([`Observation::Changed`](tessera_audit::Observation))
    /// is written when the key is resolved, in a transaction of its own; a
    /// write due only because the interval passed rides in the transaction
    /// of the principal's next audited action, so a request that writes
    /// nothing (an empty claim, a denial, a failure, a replay) never pays a
    /// row for it.
    pub(crate) observations: Mutex<ObservationCoalescer<PrincipalId, Identity>>,
    /// Claim admission, idle pacing and the outcomes of waiting claims.
    pub(crate) gate: Gate,
    /// Health snapshots by namespace.
    pub(crate) health: Arc<HealthCache>,
    /// What long-polls wait on.
    pub(crate) signals: Arc<QueueSignals>,
    /// The anonymous session mint allowance.
    pub(crate) mint: Mutex<MintAllowance>,
    /// The address hasher, keyed once the secret is known.
    pub(crate) hasher: OnceLock<AddressHasher>,
    /// The jitter of the default retry backoff.
    pub(crate) jitter: Mutex<Jitter>,
    /// Coalesces submissions and failure reports into shared commits.
    pub(crate) completer: Completer<Ack, AckAnswer>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.backend.close();
    }
}

impl Store {
    #[cfg(feature = "sqlite")]
    /// Opens (or creates) the SQLite database file at `path` with default
    /// [`SqliteOptions`].
    ///
    /// A new file gets the whole schema in one transaction. An existing file
    /// is inspected and only missing tables, indexes and columns are
    /// created; an up-to-date file is not written at all. Fails with
    /// [`Error::SchemaTooNew`] (file untouched) for a newer schema,
    /// [`Error::CorruptDatabase`] for a damaged or non-SQLite file, and
    /// [`Error::StorageQuotaExhausted`] when the storage refuses the schema
    /// writes.
    pub fn open(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, Error> {
        Self::open_sqlite(SqliteOptions::file(path), config)
    }

    #[cfg(feature = "sqlite")]
    /// Opens a new, empty in-memory SQLite database private to this store
    /// (see [`SqliteOptions::in_memory`]).
    pub fn open_in_memory(config: StoreConfig) -> Result<Self, Error> {
        Self::open_sqlite(SqliteOptions::in_memory(), config)
    }

    #[cfg(feature = "sqlite")]
    /// Opens a SQLite database with its own settings (see
    /// [`open`](Self::open) for what opening does).
    pub fn open_sqlite(options: SqliteOptions, config: StoreConfig) -> Result<Self, Error> {
        // Settings are checked before the file is touched.
        config.validate()?;
        options.validate()?;
        let policy = OpenPolicy::of(&config);
        Self::open_with(config, || {
            let backend =
                SqliteBackend::open(options, policy).map_err(|e| e.refusal_dated(policy.now))?;
            Ok(Box::new(backend))
        })
    }

    /// Opens (or creates) the store's tables in a PostgreSQL database, for
    /// service copies on many machines sharing one lease store.
    ///
    /// A new database (or schema) gets the whole schema under an advisory
    /// lock, so processes opening at once create it once; an up-to-date
    /// one runs no DDL. Fails with [`Error::SchemaTooNew`] (nothing
    /// touched) for a newer schema, `400 invalid_input` for bad options,
    /// and a retryable [`Error::Storage`] when the server cannot be
    /// reached within the connect and pool timeouts.
    ///
    /// Like every store call it blocks; on an async runtime, call it (and
    /// drop the store) on a blocking thread (`tokio::task::spawn_blocking`):
    /// the PostgreSQL client runs a runtime of its own and refuses to be
    /// driven from inside another.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(options: pg::PostgresOptions, config: StoreConfig) -> Result<Self, Error> {
        config.validate()?;
        options.validate()?;
        let policy = OpenPolicy::of(&config);
        Self::open_with(config, || {
            let backend = pg::PostgresBackend::open(options, policy)
                .map_err(|e| e.refusal_dated(policy.now))?;
            Ok(Box::new(backend))
        })
    }

    /// Builds the store around the backend `open` makes, once every policy
    /// setting has been checked: nothing is opened for invalid settings.
    fn open_with(
        config: StoreConfig,
        open: impl FnOnce() -> Result<Box<dyn Backend>, Error>,
    ) -> Result<Self, Error> {
        let clock = config.clock();
        let gate = Gate::new(Arc::clone(clock), config.admission(), config.idle())?;
        let mint =
            MintAllowance::new(config.mint().clone()).map_err(|error| Error::InvalidInput {
                reason: format!("mint settings: {error}"),
            })?;
        let observations = ObservationCoalescer::new(config.observation_capacity());
        let health = Arc::new(HealthCache::default());
        let signals = Arc::new(QueueSignals::default());
        let seed = config.retry_jitter_seed().unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64)
        });
        let backend = open()?;
        backend.listen(Self::signal_sink(&gate, &health, &signals));
        let completer = Completer::new(config.ack_batching());
        let retention = RetentionSchedule::with_interval(
            chrono::TimeDelta::from_std(config.retention_interval())
                .expect("checked: a day at most"),
        );
        Ok(Self {
            config,
            backend,
            counters: Mutex::new(CounterBuffer::new()),
            retention: Mutex::new(retention),
            last_retention: Mutex::new(None),
            quota_refused_until: Mutex::new(None),
            observations: Mutex::new(observations),
            gate,
            health,
            signals,
            mint: Mutex::new(mint),
            hasher: OnceLock::new(),
            jitter: Mutex::new(Jitter::seeded(seed)),
            completer,
        })
    }

    /// What the backend calls when another process's store changed the
    /// database: an enqueue restarts the queue's pacing, wakes its
    /// long-polls and drops the namespace's health snapshot, as one here
    /// does.
    fn signal_sink(
        gate: &Gate,
        health: &Arc<HealthCache>,
        signals: &Arc<QueueSignals>,
    ) -> SignalSink {
        let (gate, health, signals) = (gate.clone(), Arc::clone(health), Arc::clone(signals));
        Arc::new(move |signal| match signal {
            Signal::Enqueued { namespace, queue } => {
                let key = (namespace.clone(), queue.clone());
                gate.enqueued(&key);
                health.invalidate(namespace);
                signals.notify(&key);
            }
            Signal::Lost => signals.wake_all(),
        })
    }

    /// The backend, for the operations.
    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// How often long-polls read their queue again themselves, while the
    /// backend's signals may be missed (a PostgreSQL store whose listening
    /// connection is down, or off); `None` while every enqueue wakes them.
    pub fn long_poll_interval(&self) -> Option<std::time::Duration> {
        self.backend.poll_interval()
    }

    /// Rows written and read since the store opened (see [`MeterSnapshot`]).
    /// A backend that does not meter rows ([`meters_rows`](Self::meters_rows)
    /// is `false`: PostgreSQL) counts write transactions, refusals and the
    /// table rows its statements changed, and no rows read.
    pub fn meter(&self) -> MeterSnapshot {
        self.backend.meter()
    }

    /// Whether this store's backend meters rows ([`meter`](Self::meter),
    /// the daily rows-written allowance). SQLite does.
    pub fn meters_rows(&self) -> bool {
        self.backend.capabilities().metered
    }

    /// Runs `operation` and returns its result with the rows it wrote and
    /// read (other threads' work on this store in the meantime included).
    pub fn measure<T>(&self, operation: impl FnOnce(&Self) -> T) -> (T, MeterSnapshot) {
        let before = self.meter();
        let value = operation(self);
        (value, self.meter().since(&before))
    }

    /// Simulates a storage provider whose allowance is spent: while `true`,
    /// the backend refuses every write (on SQLite an authorizer denies
    /// inserts, updates, deletes, DDL and pragma assignments), and each
    /// refusal is a `503 storage_quota_exhausted`. Reads keep working.
    /// Waits for a running write to finish. A SQLite store dropped while
    /// refusing leaves its write-ahead log as it is (the next open reads
    /// it) rather than fold it into the file.
    pub fn refuse_writes(&self, refuse: bool) {
        self.backend.set_refusing(refuse);
    }

    /// Whether writes are being refused: by
    /// [`refuse_writes`](Self::refuse_writes), by the daily rows-written
    /// allowance used up
    /// ([`StoreConfig::with_daily_rows_written_allowance`](crate::StoreConfig::with_daily_rows_written_allowance)),
    /// or because storage refused this store's latest write for a quota (a
    /// SQLite file at its page cap, a provider's limit), none has
    /// succeeded since and the refusal's reset time (the next 00:00 UTC)
    /// has not come.
    pub fn is_refusing_writes(&self) -> bool {
        let allowance = self.config.daily_rows_written_allowance();
        self.backend.is_refusing()
            || self
                .quota_refused_until
                .lock()
                .is_some_and(|until| self.now_utc() < until)
            || (allowance > 0 && self.rows_written_today() >= allowance)
    }

    /// Rows written today (UTC) by this store, as the daily allowance counts
    /// them.
    pub fn rows_written_today(&self) -> u64 {
        self.backend.rows_written_today(self.now_utc())
    }

    /// The clock the store reads, the one its [`StoreConfig`] named.
    ///
    /// Instants the store hands out, such as
    /// [`poll_claim_timeout`](Self::poll_claim_timeout), are on this clock;
    /// a host driving claims asynchronously measures its sleeps with it.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.config.clock()
    }

    /// The wall-clock time from the store's clock, truncated to whole
    /// milliseconds: the precision times are stored at, so every time the
    /// lease rules compute from it is stored as it is handed out, and a
    /// lease or receipt read back equals the one first returned.
    pub(crate) fn now_utc(&self) -> DateTime<Utc> {
        storable(self.clock().now_utc())
    }

    /// Runs `work` as one write transaction at the store's now.
    pub(crate) fn write<T>(
        &self,
        work: impl FnMut(&dyn WriteTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.write_with_tail(work).map(|(value, _)| value)
    }

    /// [`write`](Self::write), also saying whether the transaction
    /// committed its optional tail ([`WriteTransaction::optional`]).
    ///
    /// `work` may run more than once: a backend retries a transaction that
    /// lost a serialization race or a deadlock, from the start, after
    /// rolling it back; only the last run's value is kept.
    pub(crate) fn write_with_tail<T>(
        &self,
        mut work: impl FnMut(&dyn WriteTransaction) -> Result<T, Error>,
    ) -> Result<(T, bool), Error> {
        let mut value = None;
        let now = self.now_utc();
        let committed = self
            .backend
            .write(now, &mut |writer| {
                // A run tried again starts with nothing to wake.
                drop(take_woken());
                value = Some(work(writer)?);
                Ok(())
            })
            .map_err(|error| {
                drop(take_woken());
                error.refusal_dated(now)
            })?;
        for (namespace, queue) in take_woken() {
            self.queue_received_work(&namespace, &queue);
        }
        let value = value.expect("a committed transaction ran its work");
        Ok((value, committed.tail))
    }

    /// Runs `read` on a read-only view. Like a write's work, it may run
    /// again (on a fresh connection, after one broke under it).
    pub(crate) fn read<T>(
        &self,
        mut read: impl FnMut(&dyn ReadTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut value = None;
        let now = self.now_utc();
        self.backend
            .read(&mut |reader| {
                value = Some(read(reader)?);
                Ok(())
            })
            .map_err(|error| error.refusal_dated(now))?;
        Ok(value.expect("a successful read ran"))
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_the_configured_one() {
        let start = "2026-10-29T12:00:00Z".parse().unwrap();
        let clock = crate::ManualClock::new(start);
        let config = StoreConfig::default().with_clock(Arc::new(clock.clone()));
        let store = Store::open_in_memory(config).unwrap();
        let before = store.clock().now();
        clock.advance(std::time::Duration::from_secs(7));
        assert_eq!(
            store.clock().now_utc(),
            start + chrono::TimeDelta::seconds(7)
        );
        assert_eq!(
            store.clock().now() - before,
            std::time::Duration::from_secs(7)
        );
    }
}
