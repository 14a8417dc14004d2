//! The databases tests run on: a fresh one of one backend per test, which
//! a test opens as often as it likes, and looks at behind the store's back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{Error, PrincipalId, Store, StoreConfig};

#[cfg(feature = "postgres")]
use super::pg;
use super::sqlite;
#[cfg(feature = "postgres")]
use tessera_store::postgres::PostgresOptions;

/// A backend the store runs on.
///
/// Adding one: a variant here; its arm in each `match` of this file (the
/// compiler lists them); a constructor that panics, naming what is
/// missing, where the backend is not configured; a cfg from the store's
/// build script that marks its tests ignored there; and its line in the
/// conformance suite's `conformance!`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendKind {
    /// An embedded SQLite file (`Store::open_sqlite`).
    Sqlite,
    /// A schema of its own on the PostgreSQL server that
    /// `TESSERA_TEST_POSTGRES_URL` names (`Store::open_postgres`).
    Postgres,
}

impl BackendKind {
    /// A fresh, empty database of this backend.
    ///
    /// Panics where the backend is not configured on this machine; the
    /// tests that need it are marked ignored there (see `build.rs`), so
    /// only `--ignored` reaches this.
    pub(crate) fn database(self) -> TestDb {
        match self {
            Self::Sqlite => TestDb::sqlite(),
            Self::Postgres => TestDb::postgres(),
        }
    }

    /// Its name, as child processes are told it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    /// The backend [`name`](Self::name) names.
    pub(crate) fn from_name(name: &str) -> Self {
        match name {
            "sqlite" => Self::Sqlite,
            "postgres" => Self::Postgres,
            other => panic!("no backend is called {other:?}"),
        }
    }

    /// Whether its stores meter rows ([`Store::meters_rows`]): the row
    /// counts tests check, and the daily rows-written allowance.
    pub(crate) fn meters_rows(self) -> bool {
        match self {
            Self::Sqlite => true,
            Self::Postgres => false,
        }
    }
}

/// One database of one backend, made fresh for a test.
///
/// Every [`open`](Self::open) opens the same database again, so a test
/// can restart the store, or run several stores (and processes) on it.
/// What is made for it goes away with the `TestDb` that made it.
#[derive(Debug)]
pub(crate) struct TestDb {
    place: Place,
}

#[derive(Debug)]
enum Place {
    /// A file in a temporary directory, removed with the `TestDb` that
    /// made it (`_dir`); one attached to by a child process has none.
    Sqlite {
        path: PathBuf,
        _dir: Option<TempDir>,
    },
    /// A schema of its own, dropped with the `TestDb` that made it
    /// (`owned`); one attached to by a child process is not.
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        schema: String,
        owned: bool,
    },
}

#[cfg(feature = "postgres")]
impl Drop for TestDb {
    fn drop(&mut self) {
        if let Place::Postgres {
            url,
            schema,
            owned: true,
        } = &self.place
        {
            pg::drop_schema(url, schema);
        }
    }
}

impl TestDb {
    /// A new SQLite file, `tessera.db`, in a temporary directory of its
    /// own; the store creates it when first opened.
    pub(crate) fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            place: Place::Sqlite {
                path: dir.path().join("tessera.db"),
                _dir: Some(dir),
            },
        }
    }

    /// A new schema on the test server, created when a store first opens
    /// it. Panics when `TESSERA_TEST_POSTGRES_URL` is unset or the build
    /// has no PostgreSQL backend.
    pub(crate) fn postgres() -> Self {
        #[cfg(feature = "postgres")]
        {
            Self {
                place: Place::Postgres {
                    url: pg::server_url(),
                    schema: pg::fresh_schema(),
                    owned: true,
                },
            }
        }
        #[cfg(not(feature = "postgres"))]
        {
            panic!("a PostgreSQL test needs the store built with feature postgres");
        }
    }

    /// Its backend.
    pub(crate) fn kind(&self) -> BackendKind {
        match self.place {
            Place::Sqlite { .. } => BackendKind::Sqlite,
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => BackendKind::Postgres,
        }
    }

    /// Another fresh, empty database of the same backend.
    pub(crate) fn fresh(&self) -> Self {
        self.kind().database()
    }

    /// Where the database is, as a string another process can be given
    /// (with the [`kind`](Self::kind)) to [`attach`](Self::attach).
    pub(crate) fn locator(&self) -> String {
        match &self.place {
            Place::Sqlite { path, .. } => path.to_str().unwrap().to_owned(),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => format!("{schema}\t{url}"),
        }
    }

    /// The database another `TestDb` made, named by its kind and
    /// [`locator`](Self::locator); this one removes nothing when dropped.
    pub(crate) fn attach(kind: BackendKind, locator: &str) -> Self {
        match kind {
            BackendKind::Sqlite => Self {
                place: Place::Sqlite {
                    path: PathBuf::from(locator),
                    _dir: None,
                },
            },
            #[cfg(feature = "postgres")]
            BackendKind::Postgres => {
                let (schema, url) = locator.split_once('\t').unwrap();
                Self {
                    place: Place::Postgres {
                        url: url.to_owned(),
                        schema: schema.to_owned(),
                        owned: false,
                    },
                }
            }
            #[cfg(not(feature = "postgres"))]
            BackendKind::Postgres => unreachable!("no PostgreSQL database was made"),
        }
    }

    /// Opens a store on the database with `config`, or fails the test.
    pub(crate) fn open(&self, config: StoreConfig) -> Store {
        self.open_result(config)
            .unwrap_or_else(|error| panic!("opening {self:?}: {error:?}"))
    }

    /// Opens a store on the database with `config`: for tests of what
    /// opening refuses.
    pub(crate) fn open_result(&self, config: StoreConfig) -> Result<Store, Error> {
        let store = match &self.place {
            Place::Sqlite { path, .. } => Store::open_sqlite(SqliteOptions::file(path), config),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => Store::open_postgres(
                PostgresOptions::new(url.as_str())
                    .with_schema(schema.as_str())
                    .with_pool_size(4),
                config,
            ),
        }?;
        // Checks of the meter are skipped exactly where the store says it
        // has none, never because a backend stopped metering.
        assert_eq!(store.meters_rows(), self.meters_rows(), "{self:?}");
        Ok(store)
    }

    /// Opens a store as one of several processes working the database at
    /// once, where waiting for another's write is the normal case, not a
    /// fault (SQLite: a busy timeout of two minutes).
    pub(crate) fn open_shared(&self, config: StoreConfig) -> Store {
        match &self.place {
            Place::Sqlite { path, .. } => Store::open_sqlite(
                SqliteOptions::file(path).with_busy_timeout(Duration::from_secs(120)),
                config,
            )
            .unwrap(),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => Store::open_postgres(
                PostgresOptions::new(url.as_str())
                    .with_schema(schema.as_str())
                    .with_statement_timeout(Duration::from_secs(120)),
                config,
            )
            .unwrap(),
        }
    }

    /// Whether anything of the database exists yet (SQLite: its file).
    pub(crate) fn exists(&self) -> bool {
        match &self.place {
            Place::Sqlite { path, .. } => path.exists(),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::exists(url, schema),
        }
    }

    /// Whether its stores meter rows: tests check row counts only then.
    pub(crate) fn meters_rows(&self) -> bool {
        self.kind().meters_rows()
    }

    /// The SQLite file, for a SQLite database.
    pub(crate) fn sqlite_path(&self) -> Option<&Path> {
        match &self.place {
            Place::Sqlite { path, .. } => Some(path),
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => None,
        }
    }

    /// The sorted names of the files in the database's own directory, for
    /// a backend that keeps its database in local files (SQLite).
    pub(crate) fn files(&self) -> Option<Vec<String>> {
        match &self.place {
            Place::Sqlite { path, .. } => Some(sqlite::files_beside(path)),
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => None,
        }
    }
}

// Looking behind the store's back, through a connection of the test's own.
impl TestDb {
    /// Every table's row count and a digest of all its rows: two equal
    /// snapshots mean nothing was written.
    pub(crate) fn table_snapshot(&self) -> BTreeMap<String, (u64, [u8; 32])> {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::table_snapshot(path),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::table_snapshot(url, schema),
        }
    }

    /// Rows in `table`.
    pub(crate) fn count_rows(&self, table: &str) -> u64 {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::count_rows(path, table),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::count_rows(url, schema, table),
        }
    }

    /// Stored receipts: the attempts a submission ended, each of which
    /// keeps its receipt in its row.
    pub(crate) fn count_receipts(&self) -> u64 {
        let condition = "idempotency_key IS NOT NULL";
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::count_where(path, "attempts", condition),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => {
                pg::count_where(url, schema, "attempts", condition)
            }
        }
    }

    /// Attempts in `state` (its stored name, e.g. `ready`).
    pub(crate) fn count_attempts_in(&self, state: &str) -> u64 {
        let condition = format!("state = '{state}'");
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::count_where(path, "attempts", &condition),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => {
                pg::count_where(url, schema, "attempts", &condition)
            }
        }
    }

    /// Stored counter rows: SQLite keeps them by minute of the day
    /// (`access_day_counters`), PostgreSQL by minute (`access_counters`).
    pub(crate) fn counter_rows(&self) -> u64 {
        match &self.place {
            Place::Sqlite { .. } => self.count_rows("access_day_counters"),
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => self.count_rows("access_counters"),
        }
    }

    /// The backend's own check of the database: `"ok"` when it is sound,
    /// else what is wrong (SQLite: `PRAGMA integrity_check`).
    pub(crate) fn integrity_check(&self) -> String {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::integrity_check(path),
            // The server keeps its own storage sound; there is no file to
            // check.
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => "ok".to_owned(),
        }
    }

    /// Every byte the database is kept in that a test can read (SQLite:
    /// the file, its write-ahead log and its shared memory).
    pub(crate) fn stored_bytes(&self) -> Vec<u8> {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::stored_bytes(path),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::stored_bytes(url, schema),
        }
    }

    /// Folds any log of recent writes into the database's main storage,
    /// and checks that all of it was (SQLite: `PRAGMA
    /// wal_checkpoint(TRUNCATE)`, with no store left open).
    pub(crate) fn checkpoint(&self) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::checkpoint(path),
            // Committed is durable on the server; nothing to fold in.
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => {}
        }
    }
}

// Changing stored rows behind the store's back, to reach states the API
// cannot.
impl TestDb {
    /// Renames a principal's account.
    pub(crate) fn rename_account(&self, principal: PrincipalId, account: &str) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::rename_account(path, principal, account),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => {
                pg::rename_account(url, schema, principal, account);
            }
        }
    }

    /// Writes `version` as the database's schema version, as an older
    /// build would have left it.
    pub(crate) fn set_schema_version(&self, version: i64) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::set_schema_version(path, version),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::set_schema_version(url, schema, version),
        }
    }

    /// Rewrites the database as schema version 4 kept it: each receipt a
    /// row of a `receipts` table of its own, the attempts without their
    /// receipt columns, and the version marker at 4.
    pub(crate) fn downgrade_receipts_to_version_four(&self) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::downgrade_receipts(path),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::downgrade_receipts(url, schema),
        }
        self.set_schema_version(4);
    }

    /// Rewrites the database as schema version 5 kept it: no edges
    /// between tasks (and, on PostgreSQL, no count of a task's children),
    /// and the version marker at 5.
    pub(crate) fn downgrade_edges_to_version_five(&self) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::downgrade_edges(path),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::downgrade_edges(url, schema),
        }
        self.set_schema_version(5);
    }

    /// Sets the try count of every attempt of every task.
    pub(crate) fn set_try_counts(&self, tries: u32) {
        match &self.place {
            Place::Sqlite { path, .. } => sqlite::set_try_counts(path, tries),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema, .. } => pg::set_try_counts(url, schema, tries),
        }
    }
}

// What only a PostgreSQL database has.
#[cfg(feature = "postgres")]
impl TestDb {
    /// Opens a store on the database with PostgreSQL options `options`
    /// makes from the test's own (server and schema).
    pub(crate) fn open_postgres(
        &self,
        options: impl FnOnce(PostgresOptions) -> PostgresOptions,
        config: StoreConfig,
    ) -> Result<Store, Error> {
        let Place::Postgres { url, schema, .. } = &self.place else {
            panic!("{self:?} is not a PostgreSQL database");
        };
        let base = PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
        Store::open_postgres(options(base), config)
    }

    /// The server's URL and the database's schema.
    pub(crate) fn postgres_place(&self) -> (&str, &str) {
        match &self.place {
            Place::Postgres { url, schema, .. } => (url, schema),
            _ => panic!("{self:?} is not a PostgreSQL database"),
        }
    }

    /// Runs `sql` on a client of the test's own, with the database's
    /// schema first on its search path.
    pub(crate) fn postgres_execute(&self, sql: &str) {
        let (url, schema) = self.postgres_place();
        let mut client = pg::client(url);
        client
            .batch_execute(&format!("SET search_path TO \"{schema}\"; {sql}"))
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// The first column of the first row `sql` returns, as an integer.
    pub(crate) fn postgres_number(&self, sql: &str) -> i64 {
        let (url, schema) = self.postgres_place();
        let mut client = pg::client(url);
        client
            .batch_execute(&format!("SET search_path TO \"{schema}\""))
            .unwrap();
        client.query_one(sql, &[]).unwrap().get(0)
    }
}
