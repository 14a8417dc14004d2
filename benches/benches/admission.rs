//! Admission benchmarks.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{Criterion, criterion_group, criterion_main};

fn floor(c: &mut Criterion) {
    let m = parking_lot::Mutex::new(0u32);
    c.bench_function("mutex_counter", |b| {
        b.iter(|| {
            *m.lock() += 1;
            *m.lock() -= 1;
        })
    });
}

criterion_group!(benches, floor);
criterion_main!(benches);
