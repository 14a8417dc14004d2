//! The SQLite backend (feature `sqlite`, on by default): one embedded
//! database file, for every process of one machine.
//!
//! One write connection runs every write in a `BEGIN IMMEDIATE`
//! transaction, shared by the writes of concurrent callers (group commit,
//! `group.rs`: each operation under its own savepoint, one commit for
//! all); reads run on their own read-only connections (WAL mode), so they
//! never wait behind the writer. The write connection's update hook meters
//! rows written (index entries included),
//! its authorizer refuses writes like a provider with a spent allowance,
//! and `max_page_count` caps the file. Checkpoints run on a thread of
//! their own (`checkpoint.rs`), so no commit waits for the log to be
//! copied into the file but at a backstop. The schema is data
//! (`schema/`): opening a database creates only what is missing.
//! The statements of the store's operations live in `statements/`, one
//! module per table or concern, each beside the Rust that binds and
//! decodes it; `transactions/` maps the seam's operations onto them.
//!
//! Hosts meet this module only through [`SqliteOptions`] and
//! [`QuotaClassifier`]; everything else is the store's.

mod checkpoint;
mod group;
mod hooks;
mod meter;
mod open;
mod quota;
mod readers;
mod schema;
mod statements;
mod transactions;
mod writer;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backend::{
    Backend, Capabilities, Committed, OpenPolicy, ReadTransaction, WriteTransaction,
};
use crate::error::{Error, StorageError};
use crate::meter::MeterSnapshot;

use group::{BATCH_CAP, GroupWriter};
use meter::Meter;
use open::Location;
use quota::{QuotaRules, classify};
use readers::{ReadPool, Reader};
use writer::WriteConnection;

pub use schema::SCHEMA_VERSION;

/// A host-supplied test for "this storage fault is my provider refusing a
/// write because an allowance is spent".
///
/// Returning `true` turns the fault into `503 storage_quota_exhausted`;
/// `false` leaves it to the store's own rules. It sees the fault as the
/// store classified it, with SQLite's result code name
/// ([`StorageError::code`], e.g. `SQLITE_READONLY`).
pub type QuotaClassifier = Arc<dyn Fn(&StorageError) -> bool + Send + Sync>;

/// Where a SQLite store lives and the settings only SQLite has.
///
/// ```
/// use std::time::Duration;
/// use tessera_store::sqlite::SqliteOptions;
///
/// let options = SqliteOptions::file("tessera.db")
///     .with_busy_timeout(Duration::from_secs(2))
///     .with_max_page_count(100_000);
/// assert_eq!(options.max_page_count(), Some(100_000));
/// ```
#[derive(Clone)]
pub struct SqliteOptions {
    location: Location,
    busy_timeout: Duration,
    read_connections: usize,
    max_page_count: Option<u64>,
    quota_classifier: Option<QuotaClassifier>,
}

impl SqliteOptions {
    /// A database file at `path`, created if missing, in WAL mode.
    pub fn file(path: impl AsRef<Path>) -> Self {
        Self::at(Location::File(path.as_ref().to_owned()))
    }

    /// A new, empty in-memory database private to the store.
    ///
    /// It is shared between the store's write and read connections through
    /// SQLite's `memdb` VFS under a unique name, and disappears with the
    /// store. It has no WAL (that needs a file), so a read may briefly wait
    /// for a commit; use a file for anything but tests and examples.
    pub fn in_memory() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut nonce = [0_u8; 8];
        // Uniqueness within the process comes from the counter; the random
        // part keeps two test binaries' names apart in logs.
        let _ = getrandom::fill(&mut nonce);
        let name = format!(
            "file:/tessera-{}-{}-{}?vfs=memdb",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::key::hex(&nonce)
        );
        Self::at(Location::Memory(name))
    }

    fn at(location: Location) -> Self {
        Self {
            location,
            busy_timeout: Duration::from_secs(5),
            read_connections: 4,
            max_page_count: None,
            quota_classifier: None,
        }
    }

    /// How long a statement waits for another connection's lock before
    /// failing (default 5 s); SQLite's `busy_timeout`.
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How many idle read connections are kept for reuse (default 4, at
    /// least 1). More are opened while that many are busy, then closed.
    pub fn with_read_connections(mut self, count: usize) -> Self {
        self.read_connections = count.max(1);
        self
    }

    /// Caps the database at this many pages on the write connection
    /// (`PRAGMA max_page_count`, a connection setting that writes nothing);
    /// writes past it fail with `SQLITE_FULL`, a quota refusal. At least 1
    /// and at most `i64::MAX`: SQLite would read 0 as no cap.
    pub fn with_max_page_count(mut self, pages: u64) -> Self {
        self.max_page_count = Some(pages);
        self
    }

    /// A host test for its provider's quota refusals (see
    /// [`QuotaClassifier`]).
    pub fn with_quota_classifier(mut self, classifier: QuotaClassifier) -> Self {
        self.quota_classifier = Some(classifier);
        self
    }

    /// The database file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::File(path) => Some(path),
            Location::Memory(_) => None,
        }
    }

    /// The busy timeout.
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// Idle read connections kept.
    pub fn read_connections(&self) -> usize {
        self.read_connections
    }

    /// The page cap, if any.
    pub fn max_page_count(&self) -> Option<u64> {
        self.max_page_count
    }

    /// Checks the settings: a page cap (if set) of 1 to `i64::MAX`. An
    /// invalid setting is `400 invalid_input` naming it.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(pages) = self.max_page_count {
            if pages == 0 || i64::try_from(pages).is_err() {
                return Err(Error::InvalidInput {
                    reason: format!(
                        "max page count must be between 1 and {}, got {pages}",
                        i64::MAX
                    ),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("location", &self.location)
            .field("busy_timeout", &self.busy_timeout)
            .field("read_connections", &self.read_connections)
            .field("max_page_count", &self.max_page_count)
            .field("quota_classifier", &self.quota_classifier.is_some())
            .finish()
    }
}

impl PartialEq for SqliteOptions {
    /// Equal when they open the same database with the same settings and
    /// both or neither have a classifier (functions are not compared).
    fn eq(&self, other: &Self) -> bool {
        self.location == other.location
            && self.busy_timeout == other.busy_timeout
            && self.read_connections == other.read_connections
            && self.max_page_count == other.max_page_count
            && self.quota_classifier.is_some() == other.quota_classifier.is_some()
    }
}

/// The SQLite backend: one writer, a pool of readers, the meter.
pub(crate) struct SqliteBackend {
    writer: GroupWriter,
    readers: ReadPool,
    meter: Meter,
    rules: QuotaRules,
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("location", self.readers.location())
            .field("meter", &self.meter.snapshot())
            .finish_non_exhaustive()
    }
}

impl SqliteBackend {
    /// Opens (or creates) the database and brings its schema up to date.
    pub(crate) fn open(options: SqliteOptions, policy: OpenPolicy) -> Result<Self, Error> {
        options.validate()?;
        let now = policy.now;
        let rules = QuotaRules::new(options.quota_classifier.clone());
        let meter = Meter::default();
        let refusing = policy.refuse_writes;
        let mut writer = WriteConnection::open(
            &options.location,
            options.busy_timeout,
            options.max_page_count,
            refusing,
            policy.daily_rows_written_allowance,
        )
        .map_err(|error| classify(error.into(), &rules, refusing))?;
        schema::cold_start(&mut writer, &options.location, &meter, &rules, now)?;
        writer
            .load_indexes(&schema::table_names())
            .map_err(|error| classify(error.into(), &rules, refusing))?;
        let readers = ReadPool::new(
            options.location,
            options.busy_timeout,
            options.read_connections,
        );
        Ok(Self {
            writer: GroupWriter::new(writer, BATCH_CAP),
            readers,
            meter,
            rules,
        })
    }
}

impl Backend for SqliteBackend {
    fn read(
        &self,
        work: &mut dyn FnMut(&dyn ReadTransaction) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.readers
            .with(|conn| work(&Reader::new(conn, &self.meter)))
            .map_err(|error| classify(error, &self.rules, false))
    }

    fn write(
        &self,
        now: DateTime<Utc>,
        work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<(), Error>,
    ) -> Result<Committed, Error> {
        let tail = self
            .writer
            .write(now, &self.meter, &self.rules, &mut |writer| work(writer))?;
        Ok(Committed { tail })
    }

    fn set_refusing(&self, refuse: bool) {
        self.writer.connection().set_refusing(refuse);
    }

    fn is_refusing(&self) -> bool {
        self.writer.connection().is_refusing()
    }

    fn meter(&self) -> MeterSnapshot {
        self.meter.snapshot()
    }

    fn rows_written_today(&self, now: DateTime<Utc>) -> u64 {
        self.writer.connection().allowance_used(now)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            metered: true,
            skips_locked: false,
            round_trips: false,
        }
    }

    fn close(&mut self) {
        // Readers first: the write connection is then the store's last, and
        // SQLite itself folds the log in and deletes it as that closes,
        // when no other connection has the file open.
        self.readers.close_idle();
        self.writer.connection_mut().checkpoint_on_close();
    }
}

#[cfg(test)]
impl SqliteBackend {
    /// A fresh in-memory backend for tests of this module.
    pub(crate) fn for_tests(options: SqliteOptions) -> Self {
        let policy = OpenPolicy::of(&crate::StoreConfig::default());
        Self::open(options, policy).unwrap()
    }

    /// Runs `read` on one of the backend's read connections.
    pub(crate) fn with_reader<T>(
        &self,
        read: impl FnOnce(&Reader<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        self.readers
            .with(|conn| Ok(read(&Reader::new(conn, &self.meter))))
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_page_cap_is_at_least_one_page() {
        assert!(
            SqliteOptions::in_memory()
                .with_max_page_count(1)
                .validate()
                .is_ok()
        );
        for bad in [0, u64::MAX] {
            let error = SqliteOptions::in_memory()
                .with_max_page_count(bad)
                .validate()
                .unwrap_err();
            assert_eq!(error.code(), "invalid_input");
            assert!(error.to_string().contains("max page count"), "{error}");
        }
    }

    #[test]
    fn reads_do_not_wait_behind_an_open_write_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let backend = SqliteBackend::for_tests(SqliteOptions::file(dir.path().join("t.db")));
        let now = Utc::now();
        backend
            .writer
            .connection()
            .transaction(now, &backend.meter, &backend.rules, |writer| {
                writer.execute(
                    "INSERT INTO tessera_meta (key, value) VALUES ('k', 'v')",
                    [],
                )?;
                Ok(())
            })
            .unwrap();
        let (started, wait_started) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let backend = &backend;
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || {
                backend.writer.connection().transaction(
                    now,
                    &backend.meter,
                    &backend.rules,
                    |writer| {
                        writer.execute(
                            "UPDATE tessera_meta SET value = 'changed' WHERE key = 'k'",
                            [],
                        )?;
                        started.send(()).unwrap();
                        wait_release.recv().unwrap();
                        Ok(())
                    },
                )
            });
            wait_started.recv().unwrap();
            // The writer holds its lock and an uncommitted change; a read
            // answers at once with the last committed state.
            let value = backend
                .with_reader(|reader| {
                    reader.optional(
                        "SELECT value FROM tessera_meta WHERE key = 'k'",
                        [],
                        |row| row.get::<_, String>(0),
                    )
                })
                .unwrap();
            assert_eq!(value.as_deref(), Some("v"));
            release.send(()).unwrap();
            writer.join().unwrap().unwrap();
        });
    }
}
