//! The one write connection and write access inside its transactions.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::config::DbConfig;
use rusqlite::hooks::{Action, AuthContext};
use rusqlite::{Connection, Params};
use tessera_admission::DailyRowAllowance;

use super::checkpoint::{BACKSTOP_PAGES, Checkpointer};
use super::hooks::{AssignmentCache, Effects, HookState, filter_columns};
use super::meter::Meter;
use super::open::{Location, configure};
use super::quota::{QuotaRules, classify};
use super::readers::Reader;
use crate::backend::Fit;
use crate::error::{Error, StorageError};

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
                    Ok((
                        row.get::<_, String>("name")?,
                        row.get::<_, bool>("partial")?,
                    ))
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
        self.begin(meter, rules)?;
        let done = self.operation(now, meter, rules, None, work)?;
        self.commit(now, meter, rules, done.rows, 1)?;
        Ok(done)
    }

    /// Opens a transaction for one or more operations: `BEGIN IMMEDIATE`.
    pub(crate) fn begin(&mut self, meter: &Meter, rules: &QuotaRules) -> Result<(), Error> {
        if !self.conn.is_autocommit() {
            // Left open by a panic inside an earlier transaction.
            let _ = self.run("ROLLBACK");
        }
        self.hooks.pending_rows.store(0, Ordering::Relaxed);
        self.run("BEGIN IMMEDIATE")
            .map_err(|error| self.classified(error.into(), meter, rules))
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
                .map_err(|error| self.classified(error.into(), meter, rules))?;
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
                return Err(self.classified(error, meter, rules));
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
                return Err(Error::quota_refused());
            }
        }
        if earlier.is_some() {
            if let Err(error) = self.run(OPERATION_RELEASE) {
                undo(self);
                return Err(self.classified(error.into(), meter, rules));
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
            let error = classify(error.into(), rules, self.is_refusing());
            if error.is_quota_refusal() {
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
    fn classified(&self, error: Error, meter: &Meter, rules: &QuotaRules) -> Error {
        let error = classify(error, rules, self.is_refusing());
        if error.is_quota_refusal() {
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
        assert!(error.is_quota_refusal());
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
        assert!(error.is_quota_refusal(), "{error:?}");
        assert_eq!(meter.snapshot().refused_writes, 1);
        writer.set_refusing(false);
        assert_eq!(rows(&mut writer, &meter, "INSERT INTO t (a) VALUES (1)"), 3);
    }
}
