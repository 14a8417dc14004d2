//! Benchmarks of the idle pacing and mint allowance policies.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{Criterion, criterion_group, criterion_main};

fn baseline(c: &mut Criterion) {
    let mut map = std::collections::HashMap::new();
    map.insert(1u64, 1u32);
    c.bench_function("hashmap_lookup", |b| b.iter(|| map.get(&std::hint::black_box(1))));
}

criterion_group!(benches, baseline);
criterion_main!(benches);
