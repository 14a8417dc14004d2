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
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use tessera_admission::MintAllowance;
use tessera_audit::{AddressHasher, CounterBuffer, ObservationCoalescer};

use crate::access::{Identity, PrincipalId};
use crate::audit::Retention;
use crate::claim::Gate;
use crate::clock::Clock;
use crate::config::StoreConfig;
use crate::db::{Location, ReadPool, Reader, WriteConnection, Writer, classify};
use crate::error::Error;
use crate::health::HealthCache;
use crate::meter::{Meter, MeterSnapshot};
use crate::quota::QuotaRules;
use crate::schema;
use crate::wait::QueueSignals;

/// A Tessera store on one SQLite database.
///
/// One write connection behind a mutex runs every write as a
/// `BEGIN IMMEDIATE` transaction; reads run on their own connections (WAL
/// mode), so they never wait behind the writer. `Store` is `Send + Sync`;
/// share it with an `Arc`.
///
/// Dropping it folds the write-ahead log into the database file, so a
/// closed store leaves no log behind (best effort; unless writes are
/// refused, see [`refuse_writes`](Self::refuse_writes)).
pub struct Store {
    pub(crate) config: StoreConfig,
    writer: Mutex<WriteConnection>,
    readers: ReadPool,
    pub(crate) meter: Meter,
    rules: QuotaRules,
    /// Counts of requests that are not audited, waiting to be written.
    pub(crate) counters: Mutex<CounterBuffer>,
    pub(crate) retention: Mutex<Retention>,
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
    pub(crate) health: HealthCache,
    /// What long-polls wait on.
    pub(crate) signals: QueueSignals,
    /// The anonymous session mint allowance.
    pub(crate) mint: Mutex<MintAllowance>,
    /// The address hasher, keyed once the secret is known.
    pub(crate) hasher: OnceLock<AddressHasher>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("location", self.readers.location())
            .field("config", &self.config)
            .field("meter", &self.meter.snapshot())
            .finish_non_exhaustive()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Readers first: the write connection is then the store's last, and
        // SQLite itself folds the log in and deletes it as that closes,
        // when no other connection has the file open.
        self.readers.close_idle();
        self.writer.get_mut().checkpoint_on_close();
    }
}

impl Store {
    /// Opens (or creates) the database file at `path`.
    ///
    /// A new file gets the whole schema in one transaction. An existing file
    /// is inspected and only missing tables, indexes and columns are
    /// created; an up-to-date file is not written at all. Fails with
    /// [`Error::SchemaTooNew`] (file untouched) for a newer schema,
    /// [`Error::CorruptDatabase`] for a damaged or non-SQLite file, and
    /// [`Error::StorageQuotaExhausted`] when the storage refuses the schema
    /// writes.
    pub fn open(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, Error> {
        Self::open_at(Location::File(path.as_ref().to_owned()), config)
    }

    /// Opens a new, empty in-memory database private to this store.
    ///
    /// It is shared between the store's write and read connections through
    /// SQLite's `memdb` VFS under a unique name, and disappears with the
    /// store. It has no WAL (that needs a file), so a read may briefly wait
    /// for a commit; use a file for anything but tests and examples.
    pub fn open_in_memory(config: StoreConfig) -> Result<Self, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut nonce = [0_u8; 8];
        // Uniqueness within the process comes from the counter; the random
        // part keeps two test binaries' names apart in logs.
        getrandom::fill(&mut nonce).map_err(|_| Error::RandomnessUnavailable)?;
        let name = format!(
            "file:/tessera-{}-{}-{}?vfs=memdb",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::key::hex(&nonce)
        );
        Self::open_at(Location::Memory(name), config)
    }

    fn open_at(location: Location, config: StoreConfig) -> Result<Self, Error> {
        let clock = config.clock();
        // Settings are checked before the file is touched.
        config.validate()?;
        let gate = Gate::new(Arc::clone(clock), config.admission(), config.idle())?;
        let mint =
            MintAllowance::new(config.mint().clone()).map_err(|error| Error::InvalidInput {
                reason: format!("mint settings: {error}"),
            })?;
        let now = crate::sql::storable(clock.now_utc());
        let rules = QuotaRules::new(config.quota_classifier().cloned());
        let meter = Meter::default();
        let refusing = config.refuses_writes();
        let mut writer = WriteConnection::open(
            &location,
            config.busy_timeout(),
            config.max_page_count(),
            refusing,
            config.daily_rows_written_allowance(),
        )
        .map_err(|error| classify(error.into(), &rules, refusing, now))?;
        schema::cold_start(&mut writer, &location, &meter, &rules, now)?;
        writer
            .load_indexes(&schema::table_names())
            .map_err(|error| classify(error.into(), &rules, refusing, now))?;
        let readers = ReadPool::new(location, config.busy_timeout(), config.read_connections());
        let observations = ObservationCoalescer::new(config.observation_capacity());
        Ok(Self {
            config,
            writer: Mutex::new(writer),
            readers,
            meter,
            rules,
            counters: Mutex::new(CounterBuffer::new()),
            retention: Mutex::new(Retention::default()),
            observations: Mutex::new(observations),
            gate,
            health: HealthCache::default(),
            signals: QueueSignals::default(),
            mint: Mutex::new(mint),
            hasher: OnceLock::new(),
        })
    }

    /// Rows written and read since the store opened (see [`MeterSnapshot`]).
    pub fn meter(&self) -> MeterSnapshot {
        self.meter.snapshot()
    }

    /// Runs `operation` and returns its result with the rows it wrote and
    /// read (other threads' work on this store in the meantime included).
    pub fn measure<T>(&self, operation: impl FnOnce(&Self) -> T) -> (T, MeterSnapshot) {
        let before = self.meter();
        let value = operation(self);
        (value, self.meter().since(&before))
    }

    /// Simulates a storage provider whose allowance is spent: while `true`,
    /// the write connection refuses every write-capable statement (an
    /// authorizer denies inserts, updates, deletes, DDL and pragma
    /// assignments), and each refusal is a `503 storage_quota_exhausted`.
    /// Reads keep working. Waits for a running write to finish. A store
    /// dropped while refusing leaves its write-ahead log as it is (the next
    /// open reads it) rather than fold it into the file.
    pub fn refuse_writes(&self, refuse: bool) {
        self.writer.lock().set_refusing(refuse);
    }

    /// Whether writes are being refused (see [`refuse_writes`](Self::refuse_writes)).
    pub fn is_refusing_writes(&self) -> bool {
        self.writer.lock().is_refusing()
    }

    /// Rows written today (UTC) by this store, as the daily allowance counts
    /// them.
    pub fn rows_written_today(&self) -> u64 {
        let now = self.now_utc();
        self.writer.lock().allowance_used(now)
    }

    /// The clock the store reads, the one its [`StoreConfig`] named.
    ///
    /// Instants the store hands out, such as
    /// [`poll_claim_timeout`](Self::poll_claim_timeout), are on this clock;
    /// a host driving claims asynchronously measures its sleeps with it.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.config.clock()
    }

    /// The schema version this build writes.
    pub fn schema_version(&self) -> i64 {
        schema::SCHEMA_VERSION
    }

    /// The wall-clock time from the store's clock, truncated to whole
    /// milliseconds: the precision times are stored at, so every time the
    /// lease rules compute from it is stored as it is handed out, and a
    /// lease or receipt read back equals the one first returned.
    pub(crate) fn now_utc(&self) -> DateTime<Utc> {
        crate::sql::storable(self.clock().now_utc())
    }

    /// Runs `work` as one write transaction (see
    /// [`WriteConnection::transaction`]).
    pub(crate) fn write<T>(
        &self,
        work: impl FnOnce(&Writer<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let now = self.now_utc();
        self.writer
            .lock()
            .transaction(now, &self.meter, &self.rules, work)
    }

    /// [`write`](Self::write), also saying whether the transaction
    /// committed its optional tail ([`Writer::optional`]).
    pub(crate) fn write_with_tail<T>(
        &self,
        work: impl FnOnce(&Writer<'_>) -> Result<T, Error>,
    ) -> Result<(T, bool), Error> {
        let now = self.now_utc();
        let mut connection = self.writer.lock();
        let value = connection.transaction(now, &self.meter, &self.rules, work)?;
        Ok((value, connection.tail_committed()))
    }

    /// Runs `read` on a read connection; errors are classified.
    pub(crate) fn read<T>(
        &self,
        read: impl FnOnce(&Reader<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.readers
            .with(|conn| read(&Reader::new(conn, &self.meter)))
            .map_err(|error| classify(error, &self.rules, false, self.now_utc()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn reads_do_not_wait_behind_an_open_write_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("t.db"), StoreConfig::default()).unwrap();
        store.create_admin_key("ops").unwrap();
        let (started, wait_started) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let store = &store;
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || {
                store.write(|writer| {
                    writer.execute(
                        "UPDATE access_principals SET account = 'changed' WHERE id = 1",
                        [],
                    )?;
                    started.send(()).unwrap();
                    wait_release.recv().unwrap();
                    Ok(())
                })
            });
            wait_started.recv().unwrap();
            // The writer holds its lock and an uncommitted change; a read
            // answers at once with the last committed state.
            let account = store
                .read(|reader| {
                    Ok(reader.optional(
                        "SELECT account FROM access_principals WHERE id = 1",
                        [],
                        |row| row.get::<_, String>(0),
                    )?)
                })
                .unwrap();
            assert_eq!(account.as_deref(), Some("ops"));
            release.send(()).unwrap();
            writer.join().unwrap().unwrap();
        });
    }

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
