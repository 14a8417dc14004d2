//! Observation coalescing, through the public API.

use std::{collections::HashMap, num::NonZeroUsize};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use tessera_audit::*;

fn origin() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
}

fn steps() -> impl Strategy<Value = Vec<(u8, u8, u8, bool)>> {
    // (principal, snapshot, seconds to advance first, whether a due write is
    // made and reported)
    proptest::collection::vec((0u8..6, 0u8..3, 0u8..70, any::<bool>()), 1..200)
}

proptest! {
    /// Whatever the capacity, forgetting and reported writes, a changed
    /// snapshot is always `Changed`, and memory stays bounded.
    #[test]
    fn never_suppresses_a_changed_account_or_kind(capacity in 1usize..5, steps in steps()) {
        let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(capacity).unwrap());
        let mut last_seen: HashMap<u8, u8> = HashMap::new();
        let mut now = origin();
        for (principal, snapshot, advance, write_due) in steps {
            now += TimeDelta::seconds(i64::from(advance));
            let was_due = coalescer.is_due(&principal, now);
            let decision = coalescer.observe(&principal, &snapshot, now);
            match last_seen.insert(principal, snapshot) {
                Some(last) if last != snapshot => prop_assert!(
                    decision == Observation::Changed || decision == Observation::Due,
                    "a changed snapshot was coalesced"
                ),
                _ => prop_assert_ne!(decision, Observation::Changed, "nothing changed"),
            }
            if decision == Observation::Due {
                prop_assert!(was_due, "due, yet is_due said otherwise");
                if write_due {
                    coalescer.written(&principal, now);
                }
            }
            prop_assert!(coalescer.len() <= capacity);
        }
    }

    /// With room for everyone, the decision is exactly the rule: `Changed` on a
    /// changed snapshot (counted as written), else `Due` until a write is
    /// reported and again once the interval has passed since the last write.
    #[test]
    fn with_room_the_rule_is_exact(steps in steps()) {
        let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(16).unwrap());
        // Principal to (last snapshot, last write).
        let mut model: HashMap<u8, (u8, Option<DateTime<Utc>>)> = HashMap::new();
        let mut now = origin();
        for (principal, snapshot, advance, write_due) in steps {
            now += TimeDelta::seconds(i64::from(advance));
            let (last, written_at) = model.entry(principal).or_insert((snapshot, None));
            let due = written_at.is_none_or(|at| now - at >= OBSERVATION_INTERVAL);
            prop_assert_eq!(coalescer.is_due(&principal, now), due);
            let expected = if *last != snapshot {
                *written_at = Some(now);
                Observation::Changed
            } else if due {
                Observation::Due
            } else {
                Observation::Skip
            };
            *last = snapshot;
            prop_assert_eq!(coalescer.observe(&principal, &snapshot, now), expected);
            if expected == Observation::Due && write_due {
                coalescer.written(&principal, now);
                *written_at = Some(now);
            }
        }
    }
}

#[test]
fn works_with_principal_identifiers() {
    let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(2).unwrap());
    let worker = Principal::new("worker-7").unwrap();
    let acme = ("acme".to_owned(), 1u8);
    assert_eq!(
        coalescer.observe(&worker, &acme, origin()),
        Observation::Due
    );
    coalescer.written(&worker, origin());
    let almost = origin() + TimeDelta::seconds(59);
    assert_eq!(coalescer.observe(&worker, &acme, almost), Observation::Skip);
    let minute = origin() + TimeDelta::seconds(60);
    assert_eq!(coalescer.observe(&worker, &acme, minute), Observation::Due);
    let admin = ("acme".to_owned(), 2u8);
    assert_eq!(
        coalescer.observe(&worker, &admin, minute),
        Observation::Changed
    );
    assert_eq!(coalescer.capacity(), 2);
}
