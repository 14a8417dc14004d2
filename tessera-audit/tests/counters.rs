//! The counter buffer's hand-out protocol, through the public API.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use tessera_audit::*;

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 23, 58, 0).unwrap()
}

fn key(time: DateTime<Utc>, subject: u8) -> CounterKey {
    let principal =
        (subject % 3 != 0).then(|| Principal::new(&format!("p{}", subject % 3)).unwrap());
    let outcome = if subject % 2 == 0 {
        Outcome::Empty
    } else {
        Outcome::RateLimited
    };
    CounterKey::new(
        time,
        principal,
        Namespace::new("main").unwrap(),
        Action::Claim,
        outcome,
    )
}

#[derive(Debug, Clone)]
enum Op {
    /// A request `lag` seconds before now (late arrivals land in past minutes).
    Increment {
        subject: u8,
        lag: u8,
    },
    Advance(u8),
    TakeDue,
    TakeAll,
    Written(usize),
    Failed(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..6, 0u8..90).prop_map(|(subject, lag)| Op::Increment { subject, lag }),
        3 => (0u8..90).prop_map(Op::Advance),
        2 => Just(Op::TakeDue),
        1 => Just(Op::TakeAll),
        2 => any::<usize>().prop_map(Op::Written),
        2 => any::<usize>().prop_map(Op::Failed),
    ]
}

proptest! {
    #[test]
    fn counts_are_never_lost_nor_written_twice(ops in proptest::collection::vec(op(), 1..200)) {
        let mut buffer = CounterBuffer::new();
        let mut now = start();
        let mut in_flight: Vec<CounterBatch> = Vec::new();
        let mut increments: HashMap<CounterKey, u64> = HashMap::new();
        let mut written: HashMap<CounterKey, u64> = HashMap::new();
        let mut total_increments = 0u64;
        let mut total_written = 0u64;

        for op in ops {
            match op {
                Op::Increment { subject, lag } => {
                    let key = key(now - TimeDelta::seconds(i64::from(lag)), subject);
                    *increments.entry(key.clone()).or_default() += 1;
                    total_increments += 1;
                    buffer.increment(key);
                }
                Op::Advance(seconds) => now += TimeDelta::seconds(i64::from(seconds)),
                Op::TakeDue => {
                    let due = buffer.due(now);
                    let batch = buffer.take_due(now);
                    prop_assert_eq!(due, batch.is_some());
                    if let Some(batch) = batch {
                        // Below the distinct limit, only passed minutes are handed out.
                        for counter in batch.counters() {
                            prop_assert!(counter.key.minute().has_passed(now));
                        }
                        in_flight.push(batch);
                    }
                }
                Op::TakeAll => {
                    let was_empty = buffer.is_empty();
                    let batch = buffer.take_all();
                    prop_assert_eq!(was_empty, batch.is_none());
                    prop_assert!(buffer.is_empty());
                    in_flight.extend(batch);
                }
                Op::Written(i) if !in_flight.is_empty() => {
                    let batch = in_flight.swap_remove(i % in_flight.len());
                    for counter in batch.counters() {
                        *written.entry(counter.key.clone()).or_default() += counter.count;
                    }
                    total_written += batch.total();
                    buffer.written(batch);
                }
                Op::Failed(i) if !in_flight.is_empty() => {
                    let batch = in_flight.swap_remove(i % in_flight.len());
                    buffer.failed(batch, now);
                }
                Op::Written(_) | Op::Failed(_) => {}
            }

            let handed_out: u64 = in_flight.iter().map(CounterBatch::total).sum();
            prop_assert_eq!(total_written + buffer.total() + handed_out, total_increments);
            prop_assert_eq!(buffer.in_flight(), in_flight.len());
            if let Some(timeout) = buffer.poll_timeout() {
                prop_assert!(buffer.due(timeout.max(now)));
                if timeout > now {
                    prop_assert!(!buffer.due(now));
                }
            } else {
                prop_assert!(buffer.is_empty());
            }
        }

        // Drain: every count is written exactly once, key by key.
        for batch in in_flight {
            for counter in batch.counters() {
                *written.entry(counter.key.clone()).or_default() += counter.count;
            }
            buffer.written(batch);
        }
        if let Some(batch) = buffer.take_all() {
            let mut seen = std::collections::HashSet::new();
            for counter in batch.counters() {
                prop_assert!(seen.insert(counter.key.clone()), "a key twice in one batch");
                *written.entry(counter.key.clone()).or_default() += counter.count;
            }
            buffer.written(batch);
        }
        prop_assert_eq!(written, increments);
        prop_assert!(buffer.take_all().is_none());
        prop_assert_eq!(buffer.in_flight(), 0);
    }
}

#[test]
fn the_distinct_limit_hands_out_the_current_minute_too() {
    let mut buffer = CounterBuffer::new();
    let now = start();
    for i in 0..CounterBuffer::MAX_WAITING {
        buffer.increment(CounterKey::new(
            now,
            Some(Principal::new(&format!("p{i}")).unwrap()),
            Namespace::new("main").unwrap(),
            Action::VerifyKey,
            Outcome::Ok,
        ));
    }
    let batch = buffer.take_due(now).unwrap();
    assert_eq!(batch.counters().len(), 1024);
    assert!(
        batch
            .counters()
            .iter()
            .all(|c| !c.key.minute().has_passed(now))
    );
    buffer.written(batch);
    assert!(buffer.is_empty());
}
