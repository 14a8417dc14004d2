//! Store benchmarks: the cost of each operation on a real SQLite file, beside
//! the cheapest durable write SQLite can do on the same settings.
//!
//! Run: `cargo bench -p tessera-benches --bench store -- --warm-up-time 1 --measurement-time 3`
//!
//! Every store lives on a file in a temporary directory, opened by
//! `Store::open` with its own settings (WAL, `synchronous=NORMAL`, one
//! writer behind a mutex, pooled readers) and a one-hour lease, so no lease
//! lapses during a run. Its clock is a `ManualClock` moved on by a
//! millisecond before each operation, so every heartbeat really moves its
//! lease's expiry (two heartbeats within one millisecond of the system
//! clock would leave the second nothing to write).
//!
//! - `store_1_thread/minimal_commit`: the baseline. One row inserted into a
//!   table without secondary indexes, one `BEGIN IMMEDIATE` … `COMMIT`
//!   transaction per row, through rusqlite on its own file in the same
//!   directory with the same journal settings; the three statements are
//!   prepared once. Nothing durable is cheaper.
//! - `store_1_thread/enqueue`, `claim`, `heartbeat`, `submit`: one
//!   operation through the public API, by a caller authenticated once.
//!   `claim` is admitted at once and runs the lease transaction; its tasks
//!   are enqueued before the timed run. `heartbeat` extends one lease again
//!   and again. `submit` hands in a fresh idempotency key on a lease taken
//!   before the timed run.
//! - `store_1_thread/claim_empty`: a claim that finds its queue empty
//!   (nothing written: a read and an in-memory count).
//! - `store_1_thread/lifecycle`: enqueue, claim, heartbeat and submit of one
//!   task.
//! - `store_N_threads/*` (N = 2, 4, 8, 16): the same, run by N threads at
//!   once, each with its own key; one iteration is one operation on each
//!   thread, timed from their common start to the last one's finish, so
//!   the time per operation is the figure over N. Concurrent writes share
//!   commits (group commit). The baseline's threads share one connection
//!   behind a `parking_lot::Mutex` and commit one row each, one at a time.
//! - `batches/*`: in a store of its own, beside its own `minimal_commit`:
//!   `enqueue_one` is one enqueue and `enqueue_batch_1000` one
//!   `enqueue_batch` of 1,000 tasks (the issue's bound: at most 10×
//!   `enqueue_one`); `rows_only_1000` is the floor under it: the same
//!   1,000 task and attempt rows, with the same indexes, inserted by hand
//!   through prepared statements in one transaction on a file of their
//!   own, with no rules, meter or audit row, and
//!   `rows_only_1000_100_a_statement` the same rows 100 to an `INSERT`; `claim_10_one_at_a_time` is ten claims in a row and
//!   `claim_batch_10` one `claim_batch` of ten, each on tasks enqueued
//!   untimed before it.
//! - `claim_scaling/ready/N`: a claim with N ready tasks in its queue
//!   (1,000, 100,000, 1,000,000) and 10,000 keys, callers taken in turn;
//!   each timed claim is followed by an untimed enqueue, so the queue keeps
//!   N ready tasks. The tasks are enqueued through the public API (the
//!   store has no bulk path), in one growing store, and checkpointed to
//!   disk before the timing starts (about a minute and a half of seeding
//!   for the million).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rusqlite::Connection;
use tempfile::TempDir;
use tessera_benches::{
    SqliteMinimalCommit as MinimalCommit, StoreFixture, TICK, on_threads, operations_on_one_thread,
    operations_on_threads, queue,
};
use tessera_store::{Brief, EnqueueOptions, QueueName, Store};

/// The thread counts of the `store_N_threads` groups.
const THREADS: [usize; 4] = [2, 4, 8, 16];

/// A store on a file, with workers that hold every scope in one namespace.
struct Fixture {
    dir: TempDir,
    on: StoreFixture,
}

impl Fixture {
    fn new(dir: TempDir, workers: usize) -> Self {
        let on = StoreFixture::new(workers, |config| {
            Store::open(dir.path().join("tessera.db"), config).unwrap()
        });
        Self { dir, on }
    }
}

impl std::ops::Deref for Fixture {
    type Target = StoreFixture;

    fn deref(&self) -> &StoreFixture {
        &self.on
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut StoreFixture {
        &mut self.on
    }
}

fn one_thread(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut baseline = MinimalCommit::open(&dir.path().join("baseline.db"));
    let mut f = Fixture::new(dir, 1);
    let worker = f.workers[0].clone();
    let mut group = c.benchmark_group("store_1_thread");

    group.bench_function("minimal_commit", |b| b.iter(|| baseline.commit()));

    let q = queue("empty");
    group.bench_function("claim_empty", |b| {
        b.iter(|| {
            f.clock.advance(TICK);
            let outcome = f.store.claim(&worker, &f.namespace, &q).unwrap();
            assert!(outcome.claimed().is_none());
        })
    });

    operations_on_one_thread(&mut group, &mut f);
    group.finish();
}

fn many_threads(c: &mut Criterion) {
    for threads in THREADS {
        let dir = tempfile::tempdir().unwrap();
        let baseline =
            parking_lot::Mutex::new(MinimalCommit::open(&dir.path().join("baseline.db")));
        let f = Arc::new(Fixture::new(dir, threads));
        let mut group = c.benchmark_group(format!("store_{threads}_threads"));

        group.bench_function("minimal_commit", |b| {
            b.iter_custom(|iterations| {
                on_threads(
                    threads,
                    iterations,
                    |_, iterations| iterations,
                    |_, iterations| {
                        for _ in 0..iterations {
                            baseline.lock().commit();
                        }
                    },
                )
            })
        });

        operations_on_threads(&mut group, &f, threads);
        group.finish();
    }
}

/// The rows of `enqueue_batch` alone: a task and an attempt per task, with
/// the store's indexes on them, inserted by hand, 1,000 per transaction.
struct RowsOnly {
    conn: Connection,
    next: i64,
}

impl RowsOnly {
    fn open(path: &Path) -> Self {
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id INTEGER PRIMARY KEY, namespace TEXT NOT NULL, \
             queue TEXT NOT NULL, task_id TEXT NOT NULL, version INTEGER NOT NULL, \
             brief BLOB NOT NULL, brief_format TEXT NOT NULL, alternatives INTEGER NOT NULL, \
             lapse_backoff_ms INTEGER NOT NULL, max_tries INTEGER NOT NULL, \
             priority INTEGER NOT NULL, last_token INTEGER NOT NULL, claimable_at INTEGER, \
             created_at INTEGER NOT NULL, enqueued_by TEXT NOT NULL);
             CREATE UNIQUE INDEX tasks_ref ON tasks (namespace, task_id, version);
             CREATE INDEX tasks_claim_order ON tasks (namespace, queue, priority, claimable_at, id) \
             WHERE claimable_at IS NOT NULL;
             CREATE TABLE attempts (id INTEGER PRIMARY KEY, task INTEGER NOT NULL, \
             number INTEGER NOT NULL, namespace TEXT NOT NULL, queue TEXT NOT NULL, \
             state TEXT NOT NULL, until_at INTEGER, tries INTEGER NOT NULL, \
             priority INTEGER NOT NULL);
             CREATE UNIQUE INDEX attempts_task ON attempts (task, number);
             CREATE INDEX attempts_state ON attempts (namespace, state);",
        )
        .unwrap();
        Self { conn, next: 0 }
    }

    fn insert_1000(&mut self) {
        let conn = &self.conn;
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let mut task = conn
            .prepare_cached(
                "INSERT INTO tasks (namespace, queue, task_id, version, brief, brief_format, \
                 alternatives, lapse_backoff_ms, max_tries, priority, last_token, \
                 claimable_at, created_at, enqueued_by) \
                 VALUES ('bench', 'q', ?1, 1, ?2, 'bytes', 1, 0, 20, 0, 0, 0, ?3, 'p1')",
            )
            .unwrap();
        let mut attempt = conn
            .prepare_cached(
                "INSERT INTO attempts (task, number, namespace, queue, state, tries, priority) \
                 VALUES (?1, 1, 'bench', 'q', 'ready', 0, 0)",
            )
            .unwrap();
        for _ in 0..1000 {
            self.next += 1;
            let id = format!("t-{:028x}", self.next);
            task.execute(rusqlite::params![
                id,
                br#"{"frame":42}"#.as_slice(),
                self.next
            ])
            .unwrap();
            attempt.execute([conn.last_insert_rowid()]).unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
    }

    /// The same rows, 100 to a statement: what multi-row inserts could
    /// save of the per-statement cost.
    fn insert_1000_multirow(&mut self) {
        const ROWS: usize = 100;
        let tasks = format!(
            "INSERT INTO tasks (namespace, queue, task_id, version, brief, brief_format, \
             alternatives, lapse_backoff_ms, max_tries, priority, last_token, claimable_at, \
             created_at, enqueued_by) VALUES {}",
            vec!["('bench', 'q', ?, 1, ?, 'bytes', 1, 0, 20, 0, 0, 0, ?, 'p1')"; ROWS].join(", ")
        );
        let attempts = format!(
            "INSERT INTO attempts (task, number, namespace, queue, state, tries, priority) \
             VALUES {}",
            vec!["(?, 1, 'bench', 'q', 'ready', 0, 0)"; ROWS].join(", ")
        );
        let conn = &self.conn;
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let mut task = conn.prepare_cached(&tasks).unwrap();
        let mut attempt = conn.prepare_cached(&attempts).unwrap();
        let brief = br#"{"frame":42}"#.as_slice();
        for _ in 0..1000 / ROWS {
            let ids: Vec<String> = (0..ROWS)
                .map(|n| format!("t-{:028x}", self.next + n as i64 + 1))
                .collect();
            let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(ROWS * 3);
            let created: Vec<i64> = (0..ROWS).map(|n| self.next + n as i64 + 1).collect();
            for n in 0..ROWS {
                values.push(&ids[n]);
                values.push(&brief);
                values.push(&created[n]);
            }
            task.execute(values.as_slice()).unwrap();
            self.next += ROWS as i64;
            let last = conn.last_insert_rowid();
            let rows: Vec<i64> = (0..ROWS as i64)
                .map(|n| last - ROWS as i64 + 1 + n)
                .collect();
            let values: Vec<&dyn rusqlite::ToSql> =
                rows.iter().map(|id| id as &dyn rusqlite::ToSql).collect();
            attempt.execute(values.as_slice()).unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
    }
}

fn batches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut baseline = MinimalCommit::open(&dir.path().join("baseline.db"));
    let f = Fixture::new(dir, 1);
    let worker = &f.workers[0];
    let brief = Brief::Bytes(br#"{"frame":42}"#.to_vec());
    let batch: Vec<(Brief, EnqueueOptions)> =
        vec![(brief.clone(), EnqueueOptions::default()); 1000];
    let mut rows = RowsOnly::open(&f.dir.path().join("rows.db"));
    let mut group = c.benchmark_group("batches");
    group.bench_function("minimal_commit", |b| b.iter(|| baseline.commit()));
    group.bench_function("rows_only_1000", |b| b.iter(|| rows.insert_1000()));
    group.bench_function("rows_only_1000_100_a_statement", |b| {
        b.iter(|| rows.insert_1000_multirow())
    });
    let q = queue("enqueued");
    group.bench_function("enqueue_one", |b| b.iter(|| f.enqueue(worker, &q)));
    group.bench_function("enqueue_batch_1000", |b| {
        b.iter(|| {
            f.clock.advance(TICK);
            black_box(
                f.store
                    .enqueue_batch(worker, &f.namespace, &q, &batch)
                    .unwrap(),
            );
        })
    });
    let q = queue("claimed");
    let ten = &batch[..10];
    let refill = || {
        f.clock.advance(TICK);
        f.store
            .enqueue_batch(worker, &f.namespace, &q, ten)
            .unwrap();
    };
    group.bench_function("claim_10_one_at_a_time", |b| {
        b.iter_custom(|iterations| {
            let mut timed = Duration::ZERO;
            for _ in 0..iterations {
                refill();
                let began = Instant::now();
                for _ in 0..10 {
                    black_box(f.claim(worker, &q));
                }
                timed += began.elapsed();
            }
            timed
        })
    });
    group.bench_function("claim_batch_10", |b| {
        b.iter_custom(|iterations| {
            let mut timed = Duration::ZERO;
            for _ in 0..iterations {
                refill();
                let began = Instant::now();
                f.clock.advance(TICK);
                let claimed = f.store.claim_batch(worker, &f.namespace, &q, 10).unwrap();
                assert_eq!(claimed.claimed.len(), 10);
                timed += began.elapsed();
            }
            timed
        })
    });
    group.finish();
}

/// Enqueues through the API until `queue` holds `ready` ready tasks,
/// reporting how long it took, then checkpoints the log from a connection
/// of its own (which syncs the file), so the writes of seeding are on disk
/// before anything is timed.
fn fill(f: &Fixture, queue: &QueueName, from: usize, ready: usize) {
    let began = Instant::now();
    for _ in from..ready {
        f.enqueue(&f.workers[0], queue);
    }
    let conn = Connection::open(f.dir.path().join("tessera.db")).unwrap();
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint was blocked");
    eprintln!(
        "claim_scaling: {} tasks enqueued and checkpointed in {:.1?} ({ready} ready)",
        ready - from,
        began.elapsed(),
    );
}

fn claim_scaling(c: &mut Criterion) {
    const KEYS: usize = 10_000;
    // Built on first use, so a filter that skips these benchmarks skips
    // the minute of seeding too.
    let mut fixture: Option<Fixture> = None;
    let mut ready = 0;
    let mut turn = 0;
    let q = queue("scaling");
    let mut group = c.benchmark_group("claim_scaling");
    group.sample_size(10);
    for size in [1_000, 100_000, 1_000_000] {
        group.bench_with_input(BenchmarkId::new("ready", size), &size, |b, &size| {
            let f = fixture.get_or_insert_with(|| {
                let mut f = Fixture::new(tempfile::tempdir().unwrap(), 1);
                let began = Instant::now();
                f.add_workers(KEYS - 1);
                eprintln!("claim_scaling: {KEYS} keys made in {:.1?}", began.elapsed());
                f
            });
            if ready < size {
                fill(f, &q, ready, size);
                ready = size;
            }
            b.iter_custom(|iterations| {
                let mut timed = Duration::ZERO;
                for _ in 0..iterations {
                    turn = (turn + 1) % f.workers.len();
                    let caller = &f.workers[turn];
                    let began = Instant::now();
                    black_box(f.claim(caller, &q));
                    timed += began.elapsed();
                    f.enqueue(caller, &q);
                }
                timed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, one_thread, many_threads, batches, claim_scaling);
criterion_main!(benches);
