//! How many operations share a commit: N threads (default 1, 2, 4, 8, 16)
//! each enqueue, claim or heartbeat 400 times through the public API on
//! a real SQLite file, and the store's meter counts the write
//! transactions they committed.
//!
//! Run: `cargo run --release -p tessera-benches --bin group_commit [-- THREADS…]`

use tessera_benches::{StoreFixture, on_threads, queue};
use tessera_store::Store;

/// Operations per thread and kind.
const PER_THREAD: u64 = 400;

fn main() {
    let mut counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|arg| arg.parse().expect("a thread count"))
        .collect();
    if counts.is_empty() {
        counts = vec![1, 2, 4, 8, 16];
    }
    println!(
        "| threads | operation | operations | commits | operations per commit | µs per operation |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: |");
    for threads in counts {
        run(threads);
    }
}

fn run(threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let f = StoreFixture::new(threads, |config| {
        Store::open(dir.path().join("tessera.db"), config).unwrap()
    });
    let queues: Vec<_> = (0..threads).map(|t| queue(&format!("q{t}"))).collect();
    let held: Vec<_> = (0..threads)
        .map(|t| {
            let q = queue(&format!("held{t}"));
            f.enqueue(&f.workers[t], &q);
            f.claim(&f.workers[t], &q)
        })
        .collect();
    for name in ["enqueue", "claim", "heartbeat"] {
        let before = f.store.meter();
        let took = on_threads(
            threads,
            PER_THREAD,
            |_, n| n,
            |t, n| {
                let (worker, q) = (&f.workers[t], &queues[t]);
                for _ in 0..n {
                    match name {
                        "enqueue" => {
                            f.enqueue(worker, q);
                        }
                        "claim" => {
                            f.claim(worker, q);
                        }
                        _ => f.heartbeat(worker, &held[t]),
                    }
                }
            },
        );
        let commits = f.store.meter().since(&before).write_transactions;
        let operations = threads as u64 * PER_THREAD;
        println!(
            "| {threads} | {name} | {operations} | {commits} | {:.1} | {:.1} |",
            operations as f64 / commits as f64,
            took.as_secs_f64() * 1e6 / operations as f64
        );
    }
}
