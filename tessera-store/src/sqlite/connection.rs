//! Connections: one writer (shared by group commit), a small pool of readers, and the
//! hooks that meter the writer and let it refuse writes like a provider with
//! a spent allowance.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use rusqlite::config::DbConfig;
use rusqlite::hooks::{Action, AuthAction, AuthContext, Authorization};
use rusqlite::{Connection, OpenFlags, Params, Row};

use tessera_admission::DailyRowAllowance;

use super::checkpoint::{BACKSTOP_PAGES, Checkpointer};
use super::meter::Meter;
use super::quota::{QuotaRules, classify};
use crate::backend::Fit;
use crate::error::{Error, StorageError};

/// Prepared statements kept per connection; above the number of distinct
/// statements the store runs, so hot statements are prepared once.
const STATEMENT_CACHE: usize = 128;

/// Where the database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A file on disk, in WAL mode.
    File(std::path::PathBuf),
    /// A process-private in-memory database shared by name between the
    /// store's connections (SQLite's `memdb` VFS); it uses SQLite's default
    /// rollback journal in memory, since WAL needs a file.
    Memory(String),
}

impl Location {
    pub(crate) fn is_memory(&self) -> bool {
        matches!(self, Self::Memory(_))
    }

    /// A connection for the checkpoint thread: read-write, since a
    /// checkpoint writes the database file, with the store's settings.
    pub(crate) fn open_for_checkpoints(&self) -> rusqlite::Result<Connection> {
        let conn = self.open(false)?;
        configure(&conn, Duration::ZERO)?;
        Ok(conn)
    }

    fn open(&self, read_only: bool) -> rusqlite::Result<Connection> {
        let access = if read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
        };
        // Each connection is used by one thread at a time (the writer's
        // mutex, the pool's hand-out), so SQLite's own mutex is not needed.
        let flags = access | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        match self {
            Self::File(path) => Connection::open_with_flags(path, flags),
            Self::Memory(uri) => {
                Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
            }
        }
    }
}

/// What a statement writes, learned by the authorizer as it is prepared.
#[derive(Debug, Default)]
struct Effects {
    /// The `(table, column)` pairs it assigns.
    assigned: Vec<(String, String)>,
    /// The tables it inserts into or deletes from.
    whole_rows: Vec<String>,
    /// The tables it updates.
    updated: Vec<String>,
}

/// What each statement run through [`Writer::execute`] writes, by SQL text.
type AssignmentCache = RefCell<HashMap<String, Arc<Effects>>>;

/// State shared between the write connection and its SQLite hooks.
#[derive(Debug, Default)]
pub(crate) struct HookState {
    /// Whether the authorizer denies every write-capable statement.
    pub(crate) refusing: AtomicBool,
    /// Rows written by the open transaction, index entries included.
    pending_rows: AtomicU64,
    inner: Mutex<HookInner>,
}

#[derive(Debug, Default)]
struct HookInner {
    /// Each index's columns, by table: those it holds and those its
    /// `WHERE` reads; loaded once from the live schema.
    indexes: HashMap<String, Vec<Vec<String>>>,
    /// `WITHOUT ROWID` tables, which the update hook does not see.
    without_rowid: HashSet<String>,
    /// What the statement being prepared writes, as the authorizer sees it.
    collecting: Option<Effects>,
    /// What the statement being run writes.
    running: Option<Arc<Effects>>,
}

impl HookState {
    fn rows_for(&self, action: Action, table: &str) -> u64 {
        let inner = self.inner.lock();
        let Some(indexes) = inner.indexes.get(table) else {
            return 1;
        };
        let touched = match action {
            Action::SQLITE_UPDATE => match &inner.running {
                Some(effects) => indexes
                    .iter()
                    .filter(|columns| {
                        columns.iter().any(|column| {
                            effects
                                .assigned
                                .iter()
                                .any(|(t, c)| t == table && c == column)
                        })
                    })
                    .count(),
                None => indexes.len(),
            },
            _ => indexes.len(),
        };
        1 + touched as u64
    }

    /// Rows written by the running statement, which changed `changed` rows,
    /// if it writes a `WITHOUT ROWID` table: the update hook does not see
    /// those, so each changed row counts as a hooked one would (an upsert
    /// as an insert, an upper bound).
    fn unhooked_rows(&self, changed: usize) -> u64 {
        let unhooked = {
            let inner = self.inner.lock();
            let Some(effects) = &inner.running else {
                return 0;
            };
            // A statement writes one table: the store uses no triggers.
            let inserted = effects
                .whole_rows
                .iter()
                .map(|t| (t, Action::SQLITE_INSERT));
            let updated = effects.updated.iter().map(|t| (t, Action::SQLITE_UPDATE));
            inserted
                .chain(updated)
                .find(|(table, _)| inner.without_rowid.contains(*table))
                .map(|(table, action)| (table.clone(), action))
        };
        unhooked.map_or(0, |(table, action)| {
            self.rows_for(action, &table) * changed as u64
        })
    }

    fn authorize(&self, context: &AuthAction<'_>) -> Authorization {
        if let Some(effects) = self.inner.lock().collecting.as_mut() {
            match *context {
                AuthAction::Update {
                    table_name,
                    column_name,
                } => {
                    effects
                        .assigned
                        .push((table_name.to_owned(), column_name.to_owned()));
                    if !effects.updated.iter().any(|t| t == table_name) {
                        effects.updated.push(table_name.to_owned());
                    }
                }
                AuthAction::Insert { table_name } | AuthAction::Delete { table_name }
                    if !effects.whole_rows.iter().any(|t| t == table_name) =>
                {
                    effects.whole_rows.push(table_name.to_owned());
                }
                _ => {}
            }
        }
        if self.refusing.load(Ordering::Relaxed) && is_write_capable(context) {
            Authorization::Deny
        } else {
            Authorization::Allow
        }
    }

    pub(crate) fn add_pending(&self, rows: u64) {
        self.pending_rows.fetch_add(rows, Ordering::Relaxed);
    }
}

/// The columns of `table_columns` that the `WHERE` clause of the
/// `CREATE INDEX` statement `sql` names. String literals are skipped; a
/// name is matched as SQLite does, ignoring ASCII case.
fn filter_columns(sql: &str, table_columns: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_filter = false;
    let mut chars = sql.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let name = match c {
            '\'' => {
                // A literal ends at a quote not doubled.
                while let Some((_, c)) = chars.next() {
                    if c == '\'' && chars.next_if(|&(_, c)| c == '\'').is_none() {
                        break;
                    }
                }
                continue;
            }
            '"' | '`' | '[' => {
                let close = if c == '[' { ']' } else { c };
                let mut name = String::new();
                for (_, c) in chars.by_ref() {
                    if c == close {
                        break;
                    }
                    name.push(c);
                }
                name
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut end = start + c.len_utf8();
                while let Some((i, c)) =
                    chars.next_if(|&(_, c)| c.is_ascii_alphanumeric() || c == '_' || c == '$')
                {
                    end = i + c.len_utf8();
                }
                let word = &sql[start..end];
                if !in_filter {
                    in_filter = word.eq_ignore_ascii_case("where");
                    continue;
                }
                word.to_owned()
            }
            _ => continue,
        };
        if let Some(column) = table_columns
            .iter()
            .find(|column| in_filter && column.eq_ignore_ascii_case(&name))
        {
            if !found.contains(column) {
                found.push(column.clone());
            }
        }
    }
    found
}

/// Whether a statement with this action could change the database, as a
/// provider that refuses every write-capable statement sees it. Reads,
/// schema introspection (`pragma_table_info(...)` and the like) and opening
/// or ending transactions are allowed; a pragma assignment is refused.
fn is_write_capable(action: &AuthAction<'_>) -> bool {
    match action {
        AuthAction::Select
        | AuthAction::Read { .. }
        | AuthAction::Function { .. }
        | AuthAction::Recursive
        | AuthAction::Transaction { .. }
        | AuthAction::Savepoint { .. } => false,
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => pragma_value.is_some() && !is_introspection(pragma_name),
        _ => true,
    }
}

/// Pragmas that only describe the schema, whatever their argument.
fn is_introspection(pragma: &str) -> bool {
    matches!(
        pragma.to_ascii_lowercase().as_str(),
        "table_info"
            | "table_xinfo"
            | "table_list"
            | "index_list"
            | "index_info"
            | "index_xinfo"
            | "foreign_key_list"
    )
}

/// Opens a connection with the settings every store connection has.
fn configure(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // A connection setting: it writes nothing to the file.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}

/// The one connection that writes.
pub(crate) struct WriteConnection {
    conn: Connection,
    hooks: Arc<HookState>,
    /// What each statement run through [`Writer::execute`] writes, learned
    /// by the authorizer when it is prepared.
    assignments: AssignmentCache,
    allowance: DailyRowAllowance,
    /// Checkpoints off the write path, on a file.
    checkpointer: Option<Checkpointer>,
}

/// The savepoint an optional tail runs under.
const TAIL: &str = "SAVEPOINT optional_tail";
const TAIL_ROLLBACK: &str = "ROLLBACK TO optional_tail";
/// The savepoint an operation runs under after others in one transaction.
const OPERATION: &str = "SAVEPOINT operation";
const OPERATION_ROLLBACK: &str = "ROLLBACK TO operation";
const OPERATION_RELEASE: &str = "RELEASE operation";

/// What one operation of a transaction left: its value, the rows it wrote
/// and whether its optional tail is part of it.
#[derive(Debug)]
pub(crate) struct Done<T> {
    pub(crate) value: T,
    pub(crate) rows: u64,
    pub(crate) tail: bool,
}

impl std::fmt::Debug for WriteConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteConnection")
            .field("refusing", &self.hooks.refusing.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl WriteConnection {
    /// Opens the write connection with its hooks; writes nothing.
    pub(crate) fn open(
        location: &Location,
        busy_timeout: Duration,
        max_page_count: Option<u64>,
        refusing: bool,
        daily_allowance: u64,
    ) -> rusqlite::Result<Self> {
        let conn = location.open(false)?;
        configure(&conn, busy_timeout)?;
        if let Some(pages) = max_page_count {
            // A connection setting; it reads the page count, writes nothing.
            conn.pragma_update(None, "max_page_count", pages)?;
        }
        let hooks = Arc::new(HookState::default());
        hooks.refusing.store(refusing, Ordering::Relaxed);
        let checkpointer = match location {
            Location::File(_) => Checkpointer::start(location.clone(), Arc::clone(&hooks)).ok(),
            Location::Memory(_) => None,
        };
        if checkpointer.is_some() {
            // A connection setting, made before the authorizer is in place:
            // SQLite's own checkpoint, as the backstop.
            conn.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)?;
        }
        let for_updates = Arc::clone(&hooks);
        conn.update_hook(Some(move |action: Action, _: &str, table: &str, _: i64| {
            let rows = for_updates.rows_for(action, table);
            for_updates.add_pending(rows);
        }));
        let for_authorizer = Arc::clone(&hooks);
        conn.authorizer(Some(move |context: AuthContext<'_>| {
            for_authorizer.authorize(&context.action)
        }));
        Ok(Self {
            conn,
            hooks,
            assignments: RefCell::new(HashMap::new()),
            allowance: DailyRowAllowance::new(daily_allowance),
            checkpointer,
        })
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn is_refusing(&self) -> bool {
        self.hooks.refusing.load(Ordering::Relaxed)
    }

    /// Starts or stops refusing write-capable statements.
    pub(crate) fn set_refusing(&mut self, refuse: bool) {
        self.hooks.refusing.store(refuse, Ordering::Relaxed);
        // The authorizer runs when a statement is prepared; cached
        // statements were authorized under the old setting.
        self.conn.flush_prepared_statement_cache();
    }

    /// Loads, for metering, each table's indexes with the columns whose
    /// assignment touches them (those they hold, and for a partial index
    /// those its `WHERE` reads), and which tables are `WITHOUT ROWID`.
    pub(crate) fn load_indexes(&mut self, tables: &[&str]) -> rusqlite::Result<()> {
        let mut indexes = HashMap::new();
        let mut without_rowid = HashSet::new();
        for table in tables {
            let mut list = Vec::new();
            let clustered: bool = self.conn.query_row(
                "SELECT count(*) FROM pragma_table_list WHERE name = ?1 AND wr = 1",
                [table],
                |row| row.get::<_, i64>(0).map(|count| count > 0),
            )?;
            if clustered {
                without_rowid.insert((*table).to_owned());
            }
            // A WITHOUT ROWID table's primary key is the table itself, not
            // an index beside it.
            let mut statement = self.conn.prepare(
                "SELECT name, partial FROM pragma_index_list(?1) \
                 WHERE NOT (?2 AND origin = 'pk')",
            )?;
            let names = statement
                .query_map(rusqlite::params![table, clustered], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, bool>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut statement = self
                .conn
                .prepare("SELECT name FROM pragma_table_info(?1)")?;
            let table_columns = statement
                .query_map([table], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            for (name, partial) in names {
                let mut statement = self
                    .conn
                    .prepare("SELECT name FROM pragma_index_xinfo(?1) WHERE key = 1")?;
                let mut columns = statement
                    .query_map([&name], |row| row.get::<_, Option<String>>(0))?
                    .filter_map(|column| column.transpose())
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                if partial {
                    // Changing a filtered column moves the row into or out
                    // of the index.
                    let sql: String = self.conn.query_row(
                        "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
                        [&name],
                        |row| row.get(0),
                    )?;
                    for column in filter_columns(&sql, &table_columns) {
                        if !columns.contains(&column) {
                            columns.push(column);
                        }
                    }
                }
                list.push(columns);
            }
            indexes.insert((*table).to_owned(), list);
        }
        let mut inner = self.hooks.inner.lock();
        inner.indexes = indexes;
        inner.without_rowid = without_rowid;
        Ok(())
    }

    /// Rows written today, for the allowance.
    pub(crate) fn allowance_used(&mut self, now: DateTime<Utc>) -> u64 {
        self.allowance.used(now)
    }

    /// Runs `work` in one `BEGIN IMMEDIATE` transaction of its own:
    /// [`begin`](Self::begin), [`operation`](Self::operation) and
    /// [`commit`](Self::commit).
    pub(crate) fn transaction<T>(
        &mut self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
        work: impl FnOnce(&Writer<'_>) -> Result<T, Error>,
    ) -> Result<Done<T>, Error> {
        self.begin(now, meter, rules)?;
        let done = self.operation(now, meter, rules, None, work)?;
        self.commit(now, meter, rules, done.rows, 1)?;
        Ok(done)
    }

    /// Opens a transaction for one or more operations: `BEGIN IMMEDIATE`.
    pub(crate) fn begin(
        &mut self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
    ) -> Result<(), Error> {
        if !self.conn.is_autocommit() {
            // Left open by a panic inside an earlier transaction.
            let _ = self.run("ROLLBACK");
        }
        self.hooks.pending_rows.store(0, Ordering::Relaxed);
        self.run("BEGIN IMMEDIATE")
            .map_err(|error| self.classified(error.into(), meter, rules, now))
    }

    /// Runs `work` as one operation of the open transaction, and checks
    /// that what it wrote fits the daily allowance beside what `earlier`
    /// operations of the transaction wrote.
    ///
    /// With no earlier operations (`earlier` is `None`) a failure rolls the
    /// whole transaction back. After others, the operation runs under a
    /// savepoint and a failure rolls back to it alone. Either way the
    /// error is classified and nothing of the operation is left. An
    /// optional tail ([`Writer::run_optional`]) that alone takes the
    /// operation past the allowance is rolled back and the rest kept.
    pub(crate) fn operation<T>(
        &mut self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
        earlier: Option<u64>,
        work: impl FnOnce(&Writer<'_>) -> Result<T, Error>,
    ) -> Result<Done<T>, Error> {
        let before = self.hooks.pending_rows.load(Ordering::Relaxed);
        if earlier.is_some() {
            self.run(OPERATION)
                .map_err(|error| self.classified(error.into(), meter, rules, now))?;
        }
        let writer = Writer {
            reader: Reader {
                conn: &self.conn,
                meter,
            },
            hooks: &self.hooks,
            assignments: &self.assignments,
            tail: Cell::new(None),
        };
        let value = work(&writer);
        let mut tail = writer.tail.get();
        let undo = |connection: &Self| {
            match earlier {
                Some(_) => {
                    let _ = connection.run(OPERATION_ROLLBACK);
                    let _ = connection.run(OPERATION_RELEASE);
                }
                None => connection.rollback(),
            }
            connection
                .hooks
                .pending_rows
                .store(before, Ordering::Relaxed);
        };
        let value = match value {
            Ok(value) => value,
            Err(error) => {
                undo(self);
                return Err(self.classified(error, meter, rules, now));
            }
        };
        let mut rows = self.hooks.pending_rows.load(Ordering::Relaxed) - before;
        let earlier_rows = earlier.unwrap_or(0);
        let fit = match Fit::of(&mut self.allowance, now, earlier_rows + rows, tail) {
            Fit::WithoutTail if self.run(TAIL_ROLLBACK).is_err() => Fit::Refused,
            fit => fit,
        };
        match fit {
            Fit::Whole => {}
            Fit::WithoutTail => {
                rows = rows.saturating_sub(tail.take().unwrap_or(0));
                self.hooks
                    .pending_rows
                    .store(before + rows, Ordering::Relaxed);
            }
            Fit::Refused => {
                undo(self);
                meter.refused();
                return Err(Error::storage_quota_exhausted(now));
            }
        }
        if earlier.is_some() {
            if let Err(error) = self.run(OPERATION_RELEASE) {
                undo(self);
                return Err(self.classified(error.into(), meter, rules, now));
            }
        }
        Ok(Done {
            value,
            rows,
            tail: tail.is_some(),
        })
    }

    /// Commits the open transaction, whose `operations` wrote `rows`. A
    /// failed commit rolls it all back; its error is classified, and a
    /// quota refusal counts once for each operation.
    pub(crate) fn commit(
        &mut self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
        rows: u64,
        operations: usize,
    ) -> Result<(), Error> {
        if let Err(error) = self.run("COMMIT") {
            self.rollback();
            let error = classify(error.into(), rules, self.is_refusing(), now);
            if error.is_quota_exhausted() {
                meter.refused_by(operations);
            }
            return Err(error);
        }
        self.allowance.record(now, rows);
        meter.committed(rows);
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed(rows);
        }
        Ok(())
    }

    /// Whether no transaction is open: none was begun, or SQLite rolled
    /// the open one back after a fault (a full disk, an I/O error).
    pub(crate) fn is_idle(&self) -> bool {
        self.conn.is_autocommit()
    }

    /// `error` classified (quota refusal, corruption); a quota refusal is
    /// counted.
    fn classified(
        &self,
        error: Error,
        meter: &Meter,
        rules: &QuotaRules,
        now: DateTime<Utc>,
    ) -> Error {
        let error = classify(error, rules, self.is_refusing(), now);
        if error.is_quota_exhausted() {
            meter.refused();
        }
        error
    }

    /// Folds the write-ahead log into the database file before the
    /// connection closes, and empties it; best effort: it never waits for
    /// another connection's readers and never fails. While writes are
    /// refused the file is left as it is, SQLite's own checkpoint on close
    /// included; the next open reads the log.
    pub(crate) fn checkpoint_on_close(&mut self) {
        if let Some(mut checkpointer) = self.checkpointer.take() {
            checkpointer.stop();
        }
        if self.is_refusing() {
            let _ = self
                .conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
            return;
        }
        self.rollback();
        let _ = self.conn.busy_timeout(Duration::ZERO);
        let _ = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }

    /// Runs a transaction statement, prepared once per connection: every
    /// write runs `BEGIN IMMEDIATE` and `COMMIT`.
    fn run(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(drop)
    }

    /// Rolls back the open transaction, if any.
    pub(crate) fn rollback(&self) {
        if !self.conn.is_autocommit() {
            // Failing to roll back leaves nothing to do: SQLite has then
            // already rolled the transaction back itself.
            let _ = self.run("ROLLBACK");
        }
    }
}

/// Read access to a connection; counts the rows its queries return.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    conn: &'a Connection,
    meter: &'a Meter,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(conn: &'a Connection, meter: &'a Meter) -> Self {
        Self { conn, meter }
    }

    /// The first row, if any.
    pub(crate) fn optional<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<Option<T>> {
        let mut statement = self.conn.prepare_cached(sql)?;
        let mut rows = statement.query(params)?;
        match rows.next()? {
            Some(row) => {
                self.meter.read(1);
                map(row).map(Some)
            }
            None => Ok(None),
        }
    }

    /// The `EXPLAIN QUERY PLAN` detail lines of `sql`.
    #[cfg(test)]
    pub(crate) fn explain(&self, sql: &str) -> rusqlite::Result<Vec<String>> {
        let mut statement = self.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
        // Parameters stay unbound (NULL): the plan does not depend on them.
        let mut rows = statement.raw_query();
        let mut lines = Vec::new();
        while let Some(row) = rows.next()? {
            lines.push(row.get::<_, String>(3)?);
        }
        Ok(lines)
    }

    /// Every row.
    pub(crate) fn all<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        mut map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<Vec<T>> {
        let mut statement = self.conn.prepare_cached(sql)?;
        let mut rows = statement.query(params)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(map(row)?);
        }
        self.meter.read(out.len() as u64);
        Ok(out)
    }
}

/// Write access inside a transaction (see
/// [`WriteConnection::transaction`]); reads through [`Reader`] by deref.
pub(crate) struct Writer<'a> {
    reader: Reader<'a>,
    hooks: &'a HookState,
    assignments: &'a AssignmentCache,
    /// The rows of the optional tail, once one ran.
    tail: Cell<Option<u64>>,
}

impl<'a> std::ops::Deref for Writer<'a> {
    type Target = Reader<'a>;

    fn deref(&self) -> &Reader<'a> {
        &self.reader
    }
}

impl Writer<'_> {
    /// Runs a write statement; returns the number of rows it changed.
    pub(crate) fn execute<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        let effects = self.effects_of(sql)?;
        self.hooks.inner.lock().running = Some(effects);
        let result = self
            .reader
            .conn
            .prepare_cached(sql)
            .and_then(|mut statement| statement.execute(params));
        if let Ok(changed) = result {
            self.hooks.add_pending(self.hooks.unhooked_rows(changed));
        }
        self.hooks.inner.lock().running = None;
        result
    }

    /// Runs an `INSERT` and returns the new row's id.
    pub(crate) fn insert<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<i64> {
        self.execute(sql, params)?;
        Ok(self.reader.conn.last_insert_rowid())
    }

    /// The row id of the last row inserted on this connection.
    pub(crate) fn last_insert_rowid(&self) -> i64 {
        self.reader.conn.last_insert_rowid()
    }

    /// Runs `work` as the transaction's optional tail: a write the
    /// transaction may carry but must never fail for, such as an
    /// observation. It runs under a savepoint; if it fails, it alone is
    /// rolled back and the error dropped, and if the transaction fits the
    /// daily allowance only without it, it is rolled back before the
    /// commit. It must be the transaction's last write, and there is at
    /// most one. Returns whether it is part of the transaction so far.
    pub(crate) fn run_optional(
        &self,
        work: impl FnOnce(&Self) -> Result<(), StorageError>,
    ) -> bool {
        debug_assert!(self.tail.get().is_none(), "one optional tail");
        let before = self.hooks.pending_rows.load(Ordering::Relaxed);
        let run = |sql: &str| {
            self.reader
                .conn
                .prepare_cached(sql)
                .and_then(|mut statement| statement.execute([]))
        };
        if run(TAIL).is_err() {
            return false;
        }
        match work(self) {
            Ok(()) => {
                let after = self.hooks.pending_rows.load(Ordering::Relaxed);
                self.tail.set(Some(after.saturating_sub(before)));
                true
            }
            Err(_) => {
                // If even this fails, SQLite rolled the whole transaction
                // back, and the commit reports it.
                let _ = run(TAIL_ROLLBACK);
                self.hooks.pending_rows.store(before, Ordering::Relaxed);
                false
            }
        }
    }

    /// Runs DDL, counting one row (its `sqlite_master` entry).
    pub(crate) fn ddl(&self, sql: &str) -> rusqlite::Result<()> {
        self.reader.conn.execute_batch(sql)?;
        self.hooks.add_pending(1);
        Ok(())
    }

    fn effects_of(&self, sql: &str) -> rusqlite::Result<Arc<Effects>> {
        if let Some(known) = self.assignments.borrow().get(sql) {
            return Ok(Arc::clone(known));
        }
        self.hooks.inner.lock().collecting = Some(Effects::default());
        let prepared = self.reader.conn.prepare_cached(sql).map(drop);
        let collected = self
            .hooks
            .inner
            .lock()
            .collecting
            .take()
            .unwrap_or_default();
        prepared?;
        let effects = Arc::new(collected);
        self.assignments
            .borrow_mut()
            .insert(sql.to_owned(), Arc::clone(&effects));
        Ok(effects)
    }
}

/// Idle read connections, handed out one per read.
pub(crate) struct ReadPool {
    location: Location,
    busy_timeout: Duration,
    keep: usize,
    idle: Mutex<Vec<Connection>>,
}

impl std::fmt::Debug for ReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPool")
            .field("keep", &self.keep)
            .field("idle", &self.idle.lock().len())
            .finish_non_exhaustive()
    }
}

impl ReadPool {
    pub(crate) fn new(location: Location, busy_timeout: Duration, keep: usize) -> Self {
        Self {
            location,
            busy_timeout,
            keep,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        let conn = self.location.open(true)?;
        configure(&conn, self.busy_timeout)?;
        conn.pragma_update(None, "query_only", true)?;
        Ok(conn)
    }

    /// Where the database lives.
    pub(crate) fn location(&self) -> &Location {
        &self.location
    }

    /// Closes the idle connections.
    pub(crate) fn close_idle(&mut self) {
        self.idle.get_mut().clear();
    }

    /// Runs `read` on an idle connection, or a new one when all are busy.
    pub(crate) fn with<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let pooled = self.idle.lock().pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => self.open()?,
        };
        let result = read(&conn);
        let mut idle = self.idle.lock();
        if idle.len() < self.keep {
            idle.push(conn);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn scratch() -> (WriteConnection, Meter) {
        scratch_with_allowance(0)
    }

    fn scratch_with_allowance(daily_rows: u64) -> (WriteConnection, Meter) {
        let location = Location::Memory(format!(
            "file:/tessera-db-test-{}?vfs=memdb",
            crate::key::hex(&rand_bytes())
        ));
        let mut writer =
            WriteConnection::open(&location, Duration::from_secs(1), None, false, daily_rows)
                .unwrap();
        writer
            .connection()
            .execute_batch(
                "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b INTEGER, c INTEGER);
                 CREATE INDEX t_a ON t (a);
                 CREATE INDEX t_bc ON t (b, c);
                 CREATE TABLE w (k INTEGER, v INTEGER, n INTEGER, PRIMARY KEY (k)) WITHOUT ROWID;
                 CREATE INDEX w_v ON w (v);
                 CREATE TABLE bare (k INTEGER PRIMARY KEY, n INTEGER) WITHOUT ROWID;
                 CREATE TABLE p (id INTEGER PRIMARY KEY, state TEXT, holder TEXT, at INTEGER);
                 CREATE INDEX p_leased ON p (holder) WHERE \"State\" = 'leased' AND at > 0;",
            )
            .unwrap();
        writer.load_indexes(&["t", "w", "bare", "p"]).unwrap();
        (writer, Meter::default())
    }

    fn rand_bytes() -> [u8; 8] {
        let mut bytes = [0; 8];
        getrandom::fill(&mut bytes).unwrap();
        bytes
    }

    fn rows(writer: &mut WriteConnection, meter: &Meter, sql: &str) -> u64 {
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let before = meter.snapshot();
        writer
            .transaction(now, meter, &QuotaRules::default(), |w| {
                w.execute(sql, [])?;
                Ok(())
            })
            .unwrap();
        meter.snapshot().since(&before).rows_written
    }

    #[test]
    fn rows_written_count_the_index_entries_a_change_touches() {
        let (mut writer, meter) = scratch();
        // A row and its two index entries.
        assert_eq!(
            rows(
                &mut writer,
                &meter,
                "INSERT INTO t (a, b, c) VALUES (1, 2, 3)"
            ),
            3
        );
        // An update touches only the indexes holding an assigned column.
        assert_eq!(rows(&mut writer, &meter, "UPDATE t SET a = 5"), 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE t SET c = 5"), 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE t SET a = 6, b = 6"), 3);
        assert_eq!(
            rows(
                &mut writer,
                &meter,
                "INSERT INTO t (a, b, c) VALUES (1, 2, 3)"
            ),
            3
        );
        // Two rows deleted, each with two index entries.
        assert_eq!(rows(&mut writer, &meter, "DELETE FROM t WHERE id > 0"), 6);
    }

    #[test]
    fn an_update_of_a_filtered_column_touches_the_partial_index() {
        let (mut writer, meter) = scratch();
        let insert = "INSERT INTO p (state, holder, at) VALUES ('ready', NULL, 1)";
        assert_eq!(rows(&mut writer, &meter, insert), 2);
        // `state` and `at` are not held by the index, but its WHERE reads
        // them: the row enters or leaves it.
        let lease = "UPDATE p SET state = 'leased', holder = 'w' WHERE id = 1";
        assert_eq!(rows(&mut writer, &meter, lease), 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE p SET state = 'done'"), 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE p SET at = 2"), 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE p SET holder = NULL"), 2);
        // A literal naming a column is not a read of it.
        let columns = |names: &[&str]| names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>();
        let table = columns(&["id", "state", "holder", "leased"]);
        let sql = "CREATE INDEX x ON p (holder) WHERE [STATE] = 'leased' AND 'it''s id' > `id`";
        assert_eq!(filter_columns(sql, &table), columns(&["state", "id"]));
        let sql = "CREATE INDEX holder ON p (state) WHERE holder IS NOT NULL";
        assert_eq!(filter_columns(sql, &table), columns(&["holder"]));
    }

    #[test]
    fn without_rowid_tables_are_metered_from_the_change_count() {
        let (mut writer, meter) = scratch();
        // Its key is the table: a row and its one secondary index entry.
        assert_eq!(
            rows(
                &mut writer,
                &meter,
                "INSERT INTO w VALUES (1, 1, 0), (2, 2, 0)"
            ),
            2 * 2
        );
        assert_eq!(rows(&mut writer, &meter, "UPDATE w SET v = v + 1"), 2 * 2);
        assert_eq!(rows(&mut writer, &meter, "UPDATE w SET n = 5"), 2);
        assert_eq!(
            rows(&mut writer, &meter, "UPDATE w SET n = 6 WHERE k = 9"),
            0
        );
        assert_eq!(rows(&mut writer, &meter, "DELETE FROM w WHERE k = 1"), 2);
        // Without a secondary index, one row per row, upserts included.
        let upsert = "INSERT INTO bare VALUES (1, 1) \
                      ON CONFLICT (k) DO UPDATE SET n = n + excluded.n";
        assert_eq!(rows(&mut writer, &meter, upsert), 1);
        assert_eq!(rows(&mut writer, &meter, upsert), 1);
        let n: i64 = writer
            .connection()
            .query_row("SELECT n FROM bare", [], |row| row.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn a_failed_transaction_counts_nothing_and_leaves_nothing() {
        let (mut writer, meter) = scratch();
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let result: Result<Done<()>, Error> =
            writer.transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a) VALUES (1)", [])?;
                Err(Error::conflict(crate::error::ConflictKind::Other, "test"))
            });
        assert!(result.is_err());
        assert_eq!(meter.snapshot().rows_written, 0);
        let count: i64 = writer
            .connection()
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 0);
    }

    fn count(writer: &WriteConnection) -> i64 {
        writer
            .connection()
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn an_optional_tail_is_committed_and_metered_with_the_rest() {
        let (mut writer, meter) = scratch();
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let done = writer
            .transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a, b, c) VALUES (1, 2, 3)", [])?;
                Ok(w.run_optional(|w| Ok(w.execute("UPDATE t SET c = 4", []).map(drop)?)))
            })
            .unwrap();
        assert!(done.value && done.tail);
        // The insert (row and two index entries), the tail (row and t_bc).
        assert_eq!(meter.snapshot().rows_written, 3 + 2);
    }

    #[test]
    fn a_failing_optional_tail_is_rolled_back_alone() {
        let (mut writer, meter) = scratch();
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let done = writer
            .transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a, b, c) VALUES (1, 2, 3)", [])?;
                Ok(w.run_optional(|w| {
                    w.execute("INSERT INTO t (a) VALUES (5)", [])?;
                    Ok(w.execute("INSERT INTO missing (a) VALUES (1)", [])
                        .map(drop)?)
                }))
            })
            .unwrap();
        assert!(!done.value && !done.tail);
        assert_eq!(count(&writer), 1, "the tail's first insert was undone too");
        assert_eq!(meter.snapshot().rows_written, 3);
    }

    #[test]
    fn an_optional_tail_past_the_allowance_is_dropped_and_the_rest_committed() {
        // Room for one insert (3 rows) and not for its 2-row tail.
        let (mut writer, meter) = scratch_with_allowance(4);
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let done = writer
            .transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a, b, c) VALUES (1, 2, 3)", [])?;
                w.run_optional(|w| Ok(w.execute("UPDATE t SET c = 4", []).map(drop)?));
                Ok(())
            })
            .unwrap();
        assert!(!done.tail);
        let c: i64 = writer
            .connection()
            .query_row("SELECT c FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(c, 3);
        assert_eq!(meter.snapshot().rows_written, 3);
        assert_eq!(writer.allowance_used(now), 3);
        // Without a tail to give up, a transaction past the allowance is
        // refused whole.
        let error = writer
            .transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a, b, c) VALUES (1, 2, 3)", [])?;
                Ok(())
            })
            .unwrap_err();
        assert!(error.is_quota_exhausted());
        assert_eq!(count(&writer), 1);
    }

    #[test]
    fn refusing_applies_to_statements_prepared_before() {
        let (mut writer, meter) = scratch();
        assert_eq!(rows(&mut writer, &meter, "INSERT INTO t (a) VALUES (1)"), 3);
        writer.set_refusing(true);
        let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
        let error = writer
            .transaction(now, &meter, &QuotaRules::default(), |w| {
                w.execute("INSERT INTO t (a) VALUES (1)", [])?;
                Ok(())
            })
            .unwrap_err();
        assert!(error.is_quota_exhausted(), "{error:?}");
        assert_eq!(meter.snapshot().refused_writes, 1);
        writer.set_refusing(false);
        assert_eq!(rows(&mut writer, &meter, "INSERT INTO t (a) VALUES (1)"), 3);
    }

    #[test]
    fn write_capable_actions_are_refused_and_reads_are_not() {
        assert!(!is_write_capable(&AuthAction::Select));
        assert!(!is_write_capable(&AuthAction::Read {
            table_name: "t",
            column_name: "c"
        }));
        assert!(!is_write_capable(&AuthAction::Pragma {
            pragma_name: "journal_mode",
            pragma_value: None
        }));
        assert!(is_write_capable(&AuthAction::Pragma {
            pragma_name: "journal_mode",
            pragma_value: Some("wal")
        }));
        assert!(!is_write_capable(&AuthAction::Pragma {
            pragma_name: "table_info",
            pragma_value: Some("access_keys")
        }));
        assert!(is_write_capable(&AuthAction::Insert { table_name: "t" }));
        assert!(is_write_capable(&AuthAction::CreateTable {
            table_name: "t"
        }));
    }
}
