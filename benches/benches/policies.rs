//! Benchmarks of the idle pacing and mint allowance policies, per call,
//! beside a plain `HashMap` lookup in the same run.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use std::collections::HashMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_admission::{AddressGroup, IdleConfig, IdlePacing, MintAllowance, MintConfig};

/// Idle workers in the idle benchmarks, each polling its own queue.
const KEYS: u64 = 10_000;
/// Address groups rotated through in the mint benchmarks.
const GROUPS: u32 = 1_000;

fn baseline(c: &mut Criterion) {
    let mut map = HashMap::new();
    map.insert(1u64, 1u32);
    c.bench_function("hashmap_lookup", |b| b.iter(|| map.get(&black_box(1))));

    let map: HashMap<u64, u32> = (0..KEYS).map(|key| (key, 0)).collect();
    let mut key = 0;
    c.bench_function("hashmap_lookup_10k", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            map.get(&black_box(key)).copied()
        })
    });
}

fn idle(c: &mut Criterion) {
    let start = Instant::now();
    let mut idle = IdlePacing::new(IdleConfig::default()).expect("default config is valid");
    for key in 0..KEYS {
        let _ = idle.empty(&key, &(key as u32 % 16), start);
    }

    // The hot path: an empty claim records and reorders the entry.
    let mut key = 0;
    let mut now = start;
    c.bench_function("idle_empty", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            now += Duration::from_millis(1);
            idle.empty(&black_box(key), &(key as u32 % 16), now)
        })
    });

    c.bench_function("idle_peek", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            idle.peek(&black_box(key), &(key as u32 % 16))
        })
    });
}

fn mint(c: &mut Criterion) {
    let group = |n: u32| AddressGroup::from(Ipv4Addr::from(n));
    let start = Instant::now();

    // Every call allowed: time advances one interval per call, and each group
    // comes back after more than an hour, so stale groups are dropped too.
    let mut mint = MintAllowance::new(MintConfig::default()).expect("default config is valid");
    let interval = mint.interval();
    let mut n = 0;
    let mut now = start;
    c.bench_function("mint_check_allowed", |b| {
        b.iter(|| {
            n = (n + 1) % GROUPS;
            now += interval;
            mint.check(black_box(group(n)), now)
        })
    });

    // Every call refused: the burst is spent and time stands still.
    let mut mint = MintAllowance::new(MintConfig::default()).expect("default config is valid");
    for n in 0..mint.burst() {
        let _ = mint.check(group(n), start);
    }
    c.bench_function("mint_check_refused", |b| {
        b.iter(|| {
            n = (n + 1) % GROUPS;
            mint.check(black_box(group(n)), start)
        })
    });
}

criterion_group!(benches, baseline, idle, mint);
criterion_main!(benches);
