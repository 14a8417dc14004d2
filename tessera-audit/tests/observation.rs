//! Observation coalescing, through the public API.

use std::{collections::HashMap, num::NonZeroUsize};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use tessera_audit::*;

fn origin() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
}

fn steps() -> impl Strategy<Value = Vec<(u8, u8, u8)>> {
    // (principal, snapshot, seconds to advance first)
    proptest::collection::vec((0u8..6, 0u8..3, 0u8..70), 1..200)
}

proptest! {
    /// Whatever the capacity and forgetting, a changed snapshot always writes.
    #[test]
    fn never_suppresses_a_changed_account_or_kind(capacity in 1usize..5, steps in steps()) {
        let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(capacity).unwrap());
        let mut last_seen: HashMap<u8, u8> = HashMap::new();
        let mut now = origin();
        for (principal, snapshot, advance) in steps {
            now += TimeDelta::seconds(i64::from(advance));
            let write = coalescer.observe(&principal, &snapshot, now);
            if last_seen.insert(principal, snapshot) != Some(snapshot) {
                prop_assert!(write, "a changed snapshot was coalesced");
            }
            prop_assert!(coalescer.len() <= capacity);
        }
    }

    /// With room for everyone, the decision is exactly the rule: write on first
    /// sight, on a change, or once the interval has passed since the last write.
    #[test]
    fn with_room_the_rule_is_exact(steps in steps()) {
        let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(16).unwrap());
        let mut stored: HashMap<u8, (u8, DateTime<Utc>)> = HashMap::new();
        let mut now = origin();
        for (principal, snapshot, advance) in steps {
            now += TimeDelta::seconds(i64::from(advance));
            let expected = match stored.get(&principal) {
                None => true,
                Some(&(last, at)) => last != snapshot || now - at >= OBSERVATION_INTERVAL,
            };
            prop_assert_eq!(coalescer.observe(&principal, &snapshot, now), expected);
            if expected {
                stored.insert(principal, (snapshot, now));
            }
        }
    }
}

#[test]
fn works_with_principal_identifiers() {
    let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(2).unwrap());
    let worker = Principal::new("worker-7").unwrap();
    assert!(coalescer.observe(&worker, &("acme".to_owned(), 1u8), origin()));
    assert!(!coalescer.observe(
        &worker,
        &("acme".to_owned(), 1u8),
        origin() + TimeDelta::seconds(59)
    ));
    assert!(coalescer.observe(
        &worker,
        &("acme".to_owned(), 1u8),
        origin() + TimeDelta::seconds(60)
    ));
    assert_eq!(coalescer.capacity(), 2);
}
