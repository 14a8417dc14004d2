//! Audit benchmarks: a counter increment against a plain `HashMap` increment.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use std::{collections::HashMap, hint::black_box};

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_audit::{Action, CounterBuffer, CounterKey, Namespace, Outcome, Principal};

const PRINCIPALS: usize = 100;

fn increment(c: &mut Criterion) {
    // Parsed by inference, so this crate needs no chrono dependency of its own.
    let now = "2026-10-29T12:00:30Z".parse().expect("a valid time");
    let principals: Vec<Principal> = (0..PRINCIPALS)
        .map(|i| Principal::new(&format!("worker-{i}")).unwrap())
        .collect();
    let namespace = Namespace::new("main").unwrap();
    // Both sides build the same key from shared identifiers on every call.
    let key = |i: usize| {
        let outcome = if i % 2 == 0 {
            Outcome::Empty
        } else {
            Outcome::RateLimited
        };
        CounterKey::new(
            now,
            Some(principals[i % PRINCIPALS].clone()),
            namespace.clone(),
            Action::Claim,
            outcome,
        )
    };

    let mut group = c.benchmark_group("counter_increment");
    let mut buffer = CounterBuffer::new();
    let mut i = 0usize;
    group.bench_function("counter_buffer", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            buffer.increment(black_box(key(i)));
        })
    });
    black_box(buffer.total());

    let mut plain: HashMap<CounterKey, u64> = HashMap::new();
    let mut i = 0usize;
    group.bench_function("hashmap_baseline", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            *plain.entry(black_box(key(i))).or_insert(0) += 1;
        })
    });
    black_box(plain.len());
    group.finish();
}

criterion_group!(benches, increment);
criterion_main!(benches);
