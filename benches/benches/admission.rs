//! Admission benchmarks: the cost of one claim through the controller, beside
//! what a host would otherwise use.
//!
//! Run: `cargo bench -p tessera-benches --bench admission -- --warm-up-time 1 --measurement-time 3`
//!
//! The single-threaded groups (`floor`, `admitted`, `queued`, `full_queue`)
//! measure the thread's CPU time on Linux (`tessera_benches::ThreadCpuTime`), so a machine
//! busy with other work slows neither them nor their baselines by time
//! spent waiting for a CPU; `shared_2_threads` measures wall time.
//!
//! - `floor/mutex_counter`: `parking_lot::Mutex<u32>` increment then decrement,
//!   the least any shared counter costs.
//! - `floor/semaphore`: `tokio::sync::Semaphore::try_acquire` and drop, what
//!   users reach for today.
//! - `admitted/offer_release`: `offer` admitted at once, then `release`;
//!   `admitted/offer_release_behind_mutex`: the same, each call taking a
//!   `parking_lot::Mutex` around the controller as a threaded host does.
//! - `queued/offer_grant/N`: with N principals waiting and the window full,
//!   a queued `offer`, then `release` and the grant pulled by `poll_event`.
//! - `full_queue/fair_share_eviction/10000`: a full queue of 20,000 held by
//!   10,000 principals; a new principal's `offer` evicts the largest holder's
//!   newest waiter; the iteration also pulls that rejection, cancels the
//!   arrival and refills the slot, so the state repeats.
//! - `shared_2_threads/mutex_counter` and `shared_2_threads/offer_release`:
//!   the mutex counter and the admitted `offer` + `release` (one lock per
//!   call, as `admitted/offer_release_behind_mutex`), each run by 2 threads
//!   at once on one shared value. One iteration is one call sequence on each
//!   thread, timed from a common start to the last thread's finish.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tessera_admission::{Admission, AdmissionConfig, Event, Offer, Permit};
use tessera_benches::{CpuOrWallTime, cpu_time_criterion, on_threads};

/// Each iteration moves time on a little, as real traffic would.
const STEP: Duration = Duration::from_nanos(100);

fn config(limit: u32, max_pending: usize) -> AdmissionConfig {
    AdmissionConfig {
        initial_concurrency: limit,
        max_concurrency: limit,
        min_concurrency: 1,
        max_pending,
        // Long enough that nothing expires during a run.
        max_wait: Duration::from_secs(24 * 3600),
        ..AdmissionConfig::default()
    }
}

fn admitted(offer: Offer) -> Permit {
    match offer {
        Offer::Admitted(permit) => permit,
        other => panic!("expected admission, got {other:?}"),
    }
}

fn floors(c: &mut Criterion<CpuOrWallTime>) {
    let mut group = c.benchmark_group("floor");
    let counter = parking_lot::Mutex::new(0u32);
    group.bench_function("mutex_counter", |b| {
        b.iter(|| {
            *black_box(&counter).lock() += 1;
            *black_box(&counter).lock() -= 1;
        })
    });
    let semaphore = tokio::sync::Semaphore::new(32);
    group.bench_function("semaphore", |b| {
        b.iter(|| drop(black_box(&semaphore).try_acquire().unwrap()))
    });
    group.finish();
}

fn admitted_path(c: &mut Criterion<CpuOrWallTime>) {
    let mut group = c.benchmark_group("admitted");
    let mut now = Instant::now();
    let mut gate = Admission::new(AdmissionConfig::default(), now).unwrap();
    group.bench_function("offer_release", |b| {
        b.iter(|| {
            now += STEP;
            let permit = admitted(gate.offer(black_box(7u64), now));
            gate.release(permit, now);
        })
    });
    // As a thread-per-request host shares it: one lock per call.
    let shared = parking_lot::Mutex::new(Admission::new(AdmissionConfig::default(), now).unwrap());
    group.bench_function("offer_release_behind_mutex", |b| {
        b.iter(|| {
            now += STEP;
            let permit = admitted(shared.lock().offer(black_box(7u64), now));
            shared.lock().release(permit, now);
        })
    });
    group.finish();
}

fn queued_path(c: &mut Criterion<CpuOrWallTime>) {
    let mut group = c.benchmark_group("queued");
    for principals in [1u64, 100, 10_000] {
        let mut now = Instant::now();
        let mut gate = Admission::new(config(1, principals as usize + 16), now).unwrap();
        let mut permit = Some(admitted(gate.offer(0, now)));
        for principal in 0..principals {
            let _queued = gate.offer(principal, now);
        }
        let mut next = 0u64;
        group.bench_with_input(
            BenchmarkId::new("offer_grant", principals),
            &principals,
            |b, &principals| {
                b.iter(|| {
                    now += STEP;
                    next = (next + 1) % principals;
                    let ticket = match gate.offer(black_box(next), now) {
                        Offer::Queued(ticket) => ticket,
                        other => panic!("expected queueing, got {other:?}"),
                    };
                    gate.release(permit.take().unwrap(), now);
                    match gate.poll_event(now) {
                        Some(Event::Granted { permit: p, .. }) => permit = Some(p),
                        other => panic!("expected a grant, got {other:?}"),
                    }
                    ticket
                })
            },
        );
        assert_eq!(gate.stats().pending as u64, principals);
    }
    group.finish();
}

fn full_queue(c: &mut Criterion<CpuOrWallTime>) {
    let mut group = c.benchmark_group("full_queue");
    const PRINCIPALS: u64 = 10_000;
    const SLOTS: usize = 20_000;
    const HEAVY: u64 = u64::MAX;
    let mut now = Instant::now();
    let mut gate = Admission::new(config(1, SLOTS), now).unwrap();
    let _running = admitted(gate.offer(HEAVY, now));
    for principal in 1..PRINCIPALS {
        let _queued = gate.offer(principal, now);
    }
    while gate.stats().pending < SLOTS {
        let _queued = gate.offer(HEAVY, now);
    }
    assert_eq!(gate.stats().waiting_principals as u64, PRINCIPALS);
    let mut fresh = PRINCIPALS;
    group.bench_function(BenchmarkId::new("fair_share_eviction", PRINCIPALS), |b| {
        b.iter(|| {
            now += STEP;
            fresh += 1;
            let ticket = match gate.offer(black_box(fresh), now) {
                Offer::Queued(ticket) => ticket,
                other => panic!("expected queueing, got {other:?}"),
            };
            match gate.poll_event(now) {
                Some(Event::Rejected { .. }) => {}
                other => panic!("expected an eviction, got {other:?}"),
            }
            assert!(gate.cancel(ticket));
            match gate.offer(HEAVY, now) {
                Offer::Queued(ticket) => ticket,
                other => panic!("expected queueing, got {other:?}"),
            }
        })
    });
    assert_eq!(gate.stats().pending, SLOTS);
    group.finish();
}

fn shared(c: &mut Criterion) {
    let mut group = c.benchmark_group("shared_2_threads");
    let counter = parking_lot::Mutex::new(0u32);
    group.bench_function("mutex_counter", |b| {
        b.iter_custom(|iterations| {
            on_threads(
                2,
                iterations,
                |_, n| n,
                |_, iterations| {
                    for _ in 0..iterations {
                        *black_box(&counter).lock() += 1;
                        *black_box(&counter).lock() -= 1;
                    }
                },
            )
        })
    });
    let mut origin = Instant::now();
    let gate = parking_lot::Mutex::new(Admission::new(AdmissionConfig::default(), origin).unwrap());
    group.bench_function("offer_release", |b| {
        b.iter_custom(|iterations| {
            // Both threads move time on from where the last sample ended;
            // the controller takes the latest instant either has shown it.
            let start = origin;
            origin += STEP * u32::try_from(iterations).unwrap_or(u32::MAX);
            on_threads(
                2,
                iterations,
                |_, n| n,
                |thread, iterations| {
                    let mut now = start;
                    for _ in 0..iterations {
                        now += STEP;
                        let permit = admitted(gate.lock().offer(black_box(thread), now));
                        gate.lock().release(permit, now);
                    }
                },
            )
        })
    });
    assert_eq!(gate.lock().stats().in_flight, 0);
    group.finish();
}

criterion_group! {
    name = single_thread;
    config = cpu_time_criterion();
    targets = floors, admitted_path, queued_path, full_queue
}
criterion_group!(threads, shared);
criterion_main!(single_thread, threads);
