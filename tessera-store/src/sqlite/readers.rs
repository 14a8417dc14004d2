//! Reading: a connection's rows through [`Reader`], which meters them, and
//! the pool of read-only connections.

use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, Params, Row};

use super::meter::Meter;
use super::open::{Location, configure};
use crate::error::Error;

/// Read access to a connection; counts the rows its queries return.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub(super) conn: &'a Connection,
    pub(super) meter: &'a Meter,
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

    /// The names of the columns `sql` answers with.
    #[cfg(test)]
    pub(crate) fn columns(&self, sql: &str) -> rusqlite::Result<Vec<String>> {
        let statement = self.conn.prepare(sql)?;
        Ok(statement
            .column_names()
            .into_iter()
            .map(str::to_owned)
            .collect())
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
