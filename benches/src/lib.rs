//! Criterion benchmarks for Tessera; see `benches/` and the README's tables.
//! This library holds what several benches share.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// Runs `work(thread, prepared)` on `threads` threads released together,
/// after each ran `prepare(thread, iterations)` untimed, and returns the
/// time from their common start to the last one's finish: the measurement
/// criterion's `iter_custom` wants for work shared between threads.
pub fn on_threads<T: Send>(
    threads: usize,
    iterations: u64,
    prepare: impl Fn(usize, u64) -> T + Sync,
    work: impl Fn(usize, T) + Sync,
) -> Duration {
    let start = Barrier::new(threads);
    thread::scope(|scope| {
        let runs: Vec<_> = (0..threads)
            .map(|thread| {
                let (start, prepare, work) = (&start, &prepare, &work);
                scope.spawn(move || {
                    let prepared = prepare(thread, iterations);
                    start.wait();
                    let began = Instant::now();
                    work(thread, prepared);
                    (began, Instant::now())
                })
            })
            .collect();
        let spans: Vec<(Instant, Instant)> = runs
            .into_iter()
            .map(|run| run.join().expect("a benchmark thread panicked"))
            .collect();
        let began = spans.iter().map(|span| span.0).min();
        let ended = spans.iter().map(|span| span.1).max();
        match (began, ended) {
            (Some(began), Some(ended)) => ended - began,
            _ => Duration::ZERO,
        }
    })
}
