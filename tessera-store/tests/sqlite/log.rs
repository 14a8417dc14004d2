//! The write-ahead log: checkpoints run on a thread of the store's own, and
//! SQLite's own checkpoint on the write connection bounds the log when
//! writes never pause.

use tessera_store::Grant;

use crate::harness::{Fixture, TestDb, namespace, queue};

/// Bytes of one log frame: its header and one 4 KiB page.
const FRAME: u64 = 24 + 4096;

#[test]
fn the_log_stays_bounded_while_writes_never_pause_and_nothing_is_lost() {
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("farm"), queue("frames"));
    // About 10 log pages an enqueue: over seven times the backstop's 4,000
    // pages. The bound leaves room for a checkpoint that a reader's
    // snapshot held back once: twice the backstop, a quarter of the writes.
    f.enqueue_range(&worker, &ns, &q, 0, 3_000);
    let mut log = f.path().into_os_string();
    log.push("-wal");
    // The log file keeps the size of its longest run between restarts.
    let pages = std::fs::metadata(&log).unwrap().len() / FRAME;
    assert!(pages > 0, "writes go through the log");
    assert!(pages <= 8_000, "the log grew to {pages} pages");
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 3_000);

    // Reopened, every task is still there.
    drop(f);
    let f = Fixture::new(&db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 3_000);
}
