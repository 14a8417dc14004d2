//! Where the database lives, and opening a connection to it with the
//! settings every store connection has.

use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

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

    pub(super) fn open(&self, read_only: bool) -> rusqlite::Result<Connection> {
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

/// Opens a connection with the settings every store connection has.
pub(super) fn configure(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // A connection setting: it writes nothing to the file.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}
