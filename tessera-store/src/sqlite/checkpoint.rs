//! Checkpoints off the write path.
//!
//! By default SQLite folds the write-ahead log into the database file (a
//! checkpoint) on the committing connection once the log holds 1,000
//! pages: the commit that crosses the mark waits while the pages are
//! copied and both files are synced. Here a thread of the store's own, on
//! a connection of its own, runs a `PASSIVE` checkpoint each time
//! [`EVERY_ROWS`] more rows were committed (rows stand in for pages: an
//! operation appends about as many log pages as it writes rows). A passive
//! checkpoint never takes the write lock and never waits for a reader, so
//! commits go on while it copies.
//!
//! The log starts over from its beginning only when a write begins with
//! every page in it copied, which a steady stream of commits rarely
//! allows. So the write connection keeps SQLite's own checkpoint as a
//! backstop at [`BACKSTOP_PAGES`]: it bounds the log, and finds nearly
//! every page already copied when it runs.
//!
//! While writes are refused the thread copies nothing: the file is left as
//! it is, as on close.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rusqlite::Connection;

use super::hooks::HookState;
use super::open::Location;

/// Rows committed between two background checkpoints: about as many log
/// pages as SQLite's own default interval.
pub(crate) const EVERY_ROWS: u64 = 1_000;

/// Log pages at which the write connection checkpoints itself: the
/// backstop that bounds the log (16 MiB of 4 KiB pages), four background
/// intervals, so it finds most pages already copied.
pub(crate) const BACKSTOP_PAGES: u32 = 4_000;

/// The checkpoint thread of one write connection; stopped and joined on
/// drop.
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer")
            .field("rows", &self.shared.rows.load(Ordering::Relaxed))
            .field("runs", &self.shared.runs.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What the writer and the thread share.
#[derive(Default)]
struct Shared {
    /// Rows committed since the thread last woke.
    rows: AtomicU64,
    /// Checkpoints run.
    runs: AtomicU64,
    /// Wake-ups that found writes refused and copied nothing.
    skipped: AtomicU64,
    /// Whether the thread is to stop; the condvar's mutex.
    stopping: Mutex<bool>,
    wake: Condvar,
}

impl Checkpointer {
    /// Starts the thread for the database at `location` (a file), which
    /// checks `hooks` for refused writes.
    pub(crate) fn start(location: Location, hooks: Arc<HookState>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name("tessera-checkpoint".to_owned())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared, &location, &hooks)
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// `rows` were committed: wakes the thread once enough have been.
    pub(crate) fn committed(&self, rows: u64) {
        let before = self.shared.rows.fetch_add(rows, Ordering::Relaxed);
        if before < EVERY_ROWS && before + rows >= EVERY_ROWS {
            // Under the mutex, so the thread is either waiting or about to
            // look at the count again: the wake-up is never lost.
            let _stopping = self.shared.stopping.lock();
            self.shared.wake.notify_one();
        }
    }

    /// Stops the thread and waits for it (a checkpoint it is running
    /// finishes first).
    pub(crate) fn stop(&mut self) {
        *self.shared.stopping.lock() = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    #[cfg(test)]
    fn runs(&self) -> (u64, u64) {
        (
            self.shared.runs.load(Ordering::SeqCst),
            self.shared.skipped.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: waits for [`EVERY_ROWS`] committed rows, then checkpoints,
/// until stopped.
fn run(shared: &Shared, location: &Location, hooks: &HookState) {
    let mut connection: Option<Connection> = None;
    let mut stopping = shared.stopping.lock();
    loop {
        while !*stopping && shared.rows.load(Ordering::Relaxed) < EVERY_ROWS {
            shared.wake.wait(&mut stopping);
        }
        if *stopping {
            return;
        }
        shared.rows.store(0, Ordering::Relaxed);
        MutexGuard::unlocked(&mut stopping, || {
            if hooks.refusing.load(Ordering::Relaxed) {
                shared.skipped.fetch_add(1, Ordering::SeqCst);
            } else if checkpoint(&mut connection, location) {
                shared.runs.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
}

/// One passive checkpoint, opening the thread's connection first if it
/// has none; whether it ran. A failure (the file gone, a full disk, another
/// process checkpointing) is left for the next one or the backstop.
fn checkpoint(connection: &mut Option<Connection>, location: &Location) -> bool {
    if connection.is_none() {
        *connection = location.open_for_checkpoints().ok();
    }
    connection.as_ref().is_some_and(|conn| {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// The main database file's size: pages reach it only by a checkpoint.
    fn file_pages(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len()) / 4096
    }

    /// Waits (up to a minute, for a slow machine) until `done` holds.
    fn eventually(mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "the checkpoint thread never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A WAL database with a table, written by `writer` alone.
    fn database(dir: &tempfile::TempDir) -> (std::path::PathBuf, Connection) {
        let path = dir.path().join("c.db");
        let writer = Connection::open(&path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.execute_batch("CREATE TABLE t (b BLOB)").unwrap();
        (path, writer)
    }

    fn write_pages(writer: &Connection, pages: usize) {
        for _ in 0..pages {
            writer
                .execute("INSERT INTO t (b) VALUES (zeroblob(4000))", [])
                .unwrap();
        }
    }

    #[test]
    fn enough_committed_rows_fold_the_log_into_the_file_off_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = database(&dir);
        let hooks = Arc::new(HookState::default());
        let mut checkpointer =
            Checkpointer::start(Location::File(path.clone()), Arc::clone(&hooks)).unwrap();
        write_pages(&writer, 50);
        // Too few rows: nothing wakes the thread, the pages stay in the log.
        checkpointer.committed(EVERY_ROWS - 1);
        assert_eq!(checkpointer.runs(), (0, 0));
        assert!(file_pages(&path) < 50);
        checkpointer.committed(1);
        eventually(|| checkpointer.runs().0 == 1);
        assert!(file_pages(&path) >= 50, "{} pages", file_pages(&path));
        checkpointer.stop();
        checkpointer.stop();
    }

    #[test]
    fn while_writes_are_refused_the_file_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = database(&dir);
        let hooks = Arc::new(HookState::default());
        hooks.refusing.store(true, Ordering::Relaxed);
        let checkpointer =
            Checkpointer::start(Location::File(path.clone()), Arc::clone(&hooks)).unwrap();
        write_pages(&writer, 50);
        let before = file_pages(&path);
        checkpointer.committed(EVERY_ROWS);
        eventually(|| checkpointer.runs().1 == 1);
        assert_eq!(checkpointer.runs(), (0, 1));
        assert_eq!(file_pages(&path), before);
        // Refusal over: the next interval copies.
        hooks.refusing.store(false, Ordering::Relaxed);
        checkpointer.committed(EVERY_ROWS);
        eventually(|| checkpointer.runs().0 == 1);
        assert!(file_pages(&path) >= 50);
    }
}
