//! Idle pacing through the public API, with hand-driven time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_admission::{ConfigError, IDLE_HINTS, IdleConfig, IdlePacing};

/// An arbitrary origin for hand-driven time; nothing waits on the clock.
#[expect(clippy::disallowed_methods, reason = "an origin, not a reading")]
fn origin() -> Instant {
    Instant::now()
}

fn pacing(capacity: usize) -> IdlePacing<&'static str, &'static str> {
    IdlePacing::new(IdleConfig { capacity }).unwrap()
}

fn secs(hints: impl IntoIterator<Item = Duration>) -> Vec<u64> {
    hints.into_iter().map(|hint| hint.as_secs()).collect()
}

fn ladder(
    idle: &mut IdlePacing<&'static str, &'static str>,
    key: &'static str,
    queue: &'static str,
    start: Instant,
    steps: u64,
) -> Vec<u64> {
    secs((0..steps).map(|i| idle.empty(&key, &queue, start + Duration::from_secs(i))))
}

#[test]
fn ladder_doubles_from_5_to_a_60_ceiling() {
    let mut idle = pacing(100);
    let start = origin();
    assert_eq!(
        ladder(&mut idle, "k", "q", start, 8),
        [5, 10, 20, 40, 60, 60, 60, 60]
    );
    assert_eq!(secs(IDLE_HINTS), [5, 10, 20, 40, 60]);
}

#[test]
fn grant_resets_every_queue_of_that_key_only() {
    let mut idle = pacing(100);
    let start = origin();
    ladder(&mut idle, "k", "q1", start, 4);
    ladder(&mut idle, "k", "q2", start, 3);
    ladder(&mut idle, "other", "q1", start, 4);

    idle.granted(&"k");

    assert_eq!(ladder(&mut idle, "k", "q1", start, 2), [5, 10]);
    assert_eq!(ladder(&mut idle, "k", "q2", start, 2), [5, 10]);
    assert_eq!(idle.empty(&"other", &"q1", start), Duration::from_secs(60));
}

#[test]
fn enqueue_resets_every_key_on_that_queue_only() {
    let mut idle = pacing(100);
    let start = origin();
    ladder(&mut idle, "a", "q", start, 5);
    ladder(&mut idle, "b", "q", start, 2);
    ladder(&mut idle, "a", "other", start, 3);

    idle.enqueued(&"q");

    assert_eq!(ladder(&mut idle, "a", "q", start, 3), [5, 10, 20]);
    assert_eq!(ladder(&mut idle, "b", "q", start, 1), [5]);
    assert_eq!(idle.empty(&"a", &"other", start), Duration::from_secs(40));
}

#[test]
fn repeated_resets_and_resets_before_any_empty() {
    let mut idle = pacing(100);
    let start = origin();
    idle.granted(&"k");
    idle.enqueued(&"q");
    assert_eq!(ladder(&mut idle, "k", "q", start, 3), [5, 10, 20]);
    idle.enqueued(&"q");
    idle.enqueued(&"q");
    idle.granted(&"k");
    assert_eq!(ladder(&mut idle, "k", "q", start, 2), [5, 10]);
}

#[test]
fn found_empty_until_a_grant_or_an_enqueue() {
    let mut idle = pacing(100);
    assert!(!idle.found_empty(&"k", &"q"));
    let _ = idle.empty(&"k", &"q", origin());
    assert!(idle.found_empty(&"k", &"q"));
    assert!(!idle.found_empty(&"k", &"other"));
    assert!(!idle.found_empty(&"other", &"q"));
    idle.granted(&"k");
    assert!(!idle.found_empty(&"k", &"q"));
    let _ = idle.empty(&"k", &"q", origin());
    idle.enqueued(&"q");
    assert!(!idle.found_empty(&"k", &"q"));
}

#[test]
fn peek_shows_the_next_hint_without_recording() {
    let mut idle = pacing(100);
    let start = origin();
    assert_eq!(idle.peek(&"k", &"q"), Duration::from_secs(5));
    ladder(&mut idle, "k", "q", start, 2);
    assert_eq!(idle.peek(&"k", &"q"), Duration::from_secs(20));
    assert_eq!(idle.peek(&"k", &"q"), Duration::from_secs(20));
    assert_eq!(idle.empty(&"k", &"q", start), Duration::from_secs(20));
    idle.enqueued(&"q");
    assert_eq!(idle.peek(&"k", &"q"), Duration::from_secs(5));
}

#[test]
fn capacity_forgets_the_least_recently_seen_entry() {
    let mut idle = pacing(2);
    let start = origin();
    let at = |s| start + Duration::from_secs(s);
    ladder(&mut idle, "a", "q", at(0), 3);
    ladder(&mut idle, "b", "q", at(10), 3);
    // Seeing `a` again makes `b` the least recently seen.
    assert_eq!(idle.empty(&"a", &"q", at(20)), Duration::from_secs(40));
    assert_eq!(idle.empty(&"c", &"q", at(30)), Duration::from_secs(5));
    assert_eq!(idle.len(), 2);

    assert_eq!(idle.peek(&"b", &"q"), Duration::from_secs(5));
    assert_eq!(idle.peek(&"a", &"q"), Duration::from_secs(60));
    assert_eq!(idle.peek(&"c", &"q"), Duration::from_secs(10));
}

#[test]
fn recency_follows_now_not_call_order() {
    let mut idle = pacing(2);
    let start = origin();
    let _ = idle.empty(&"late", &"q", start + Duration::from_secs(60));
    let _ = idle.empty(&"early", &"q", start);
    let _ = idle.empty(&"new", &"q", start + Duration::from_secs(61));
    assert_eq!(idle.peek(&"early", &"q"), Duration::from_secs(5));
    assert_eq!(idle.peek(&"late", &"q"), Duration::from_secs(10));
}

#[test]
fn entries_never_exceed_capacity() {
    let mut idle = IdlePacing::new(IdleConfig { capacity: 10 }).unwrap();
    let start = origin();
    for i in 0..1_000u32 {
        let _ = idle.empty(&i, &(i % 3), start + Duration::from_millis(u64::from(i)));
        assert!(idle.len() <= idle.capacity());
    }
    assert_eq!(idle.len(), 10);
}

#[test]
fn zero_capacity_is_a_config_error() {
    let error = IdlePacing::<u32, u32>::new(IdleConfig { capacity: 0 }).unwrap_err();
    assert_eq!(
        error,
        ConfigError::OutOfRange {
            name: "idle.capacity",
            value: "0".into(),
            expected: "at least 1"
        }
    );
    assert_eq!(
        error.to_string(),
        "idle.capacity: 0 is out of range, expected at least 1"
    );
    assert_eq!(IdleConfig::default().capacity, 100_000);
}

#[test]
fn config_deserializes_with_defaults() {
    let config: IdleConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(config, IdleConfig::default());
    let config: IdleConfig = serde_json::from_str(r#"{"capacity":7}"#).unwrap();
    assert_eq!(config.capacity, 7);
}

#[derive(Debug, Clone)]
enum Op {
    Empty { key: u8, queue: u8, at: u64 },
    Granted { key: u8 },
    Enqueued { queue: u8 },
}

fn ops(keys: u8, queues: u8) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (0..keys, 0..queues, 0..600u64).prop_map(|(key, queue, at)| Op::Empty { key, queue, at }),
        1 => (0..keys).prop_map(|key| Op::Granted { key }),
        1 => (0..queues).prop_map(|queue| Op::Enqueued { queue }),
    ];
    proptest::collection::vec(op, 0..200)
}

/// A direct model: resets and eviction by scanning every entry.
#[derive(Default)]
struct Model {
    entries: HashMap<(u8, u8), ModelEntry>,
    seq: u64,
}

/// (index of the last hint, `None` once reset; (last seen, sequence)).
type ModelEntry = (Option<usize>, (u64, u64));

impl Model {
    fn empty(&mut self, key: u8, queue: u8, at: u64, capacity: usize) -> Duration {
        self.seq += 1;
        let seen = (at, self.seq);
        if let Some((level, last)) = self.entries.get_mut(&(key, queue)) {
            let next = level.map_or(0, |level| (level + 1).min(IDLE_HINTS.len() - 1));
            *level = Some(next);
            *last = seen;
            return IDLE_HINTS[next];
        }
        if self.entries.len() >= capacity {
            let oldest = *self
                .entries
                .iter()
                .min_by_key(|(_, (_, last))| *last)
                .unwrap()
                .0;
            self.entries.remove(&oldest);
        }
        self.entries.insert((key, queue), (Some(0), seen));
        IDLE_HINTS[0]
    }

    fn reset(&mut self, matches: impl Fn(&(u8, u8)) -> bool) {
        for (pair, (level, _)) in &mut self.entries {
            if matches(pair) {
                // A reset entry keeps its place in the table but starts over.
                *level = None;
            }
        }
    }
}

proptest! {
    /// Matches the model exactly, eviction included, with arbitrary (even
    /// out-of-order) times.
    #[test]
    fn matches_model(capacity in 1usize..8, ops in ops(4, 3)) {
        let mut idle = IdlePacing::new(IdleConfig { capacity }).unwrap();
        let mut model = Model::default();
        let start = origin();
        for op in ops {
            match op {
                Op::Empty { key, queue, at } => {
                    let peeked = idle.peek(&key, &queue);
                    let streak = matches!(model.entries.get(&(key, queue)), Some((Some(_), _)));
                    prop_assert_eq!(idle.found_empty(&key, &queue), streak);
                    let hint = idle.empty(&key, &queue, start + Duration::from_secs(at));
                    prop_assert_eq!(hint, model.empty(key, queue, at, capacity));
                    prop_assert_eq!(peeked, hint);
                    prop_assert!(idle.found_empty(&key, &queue));
                }
                Op::Granted { key } => {
                    idle.granted(&key);
                    model.reset(|&(k, _)| k == key);
                }
                Op::Enqueued { queue } => {
                    idle.enqueued(&queue);
                    model.reset(|&(_, q)| q == queue);
                }
            }
            prop_assert!(idle.len() <= capacity);
            prop_assert_eq!(idle.len(), model.entries.len());
        }
    }

    /// Without eviction: every hint is on the ladder, a pair's first hint and
    /// its first after a reset are 5 s, and otherwise each hint is the
    /// previous one doubled up to 60 s, so it never goes down but on a reset.
    #[test]
    fn hints_climb_the_ladder_and_fall_only_on_reset(ops in ops(4, 3)) {
        let mut idle = IdlePacing::new(IdleConfig::default()).unwrap();
        let mut last: HashMap<(u8, u8), Duration> = HashMap::new();
        let start = origin();
        for op in ops {
            match op {
                Op::Empty { key, queue, at } => {
                    let hint = idle.empty(&key, &queue, start + Duration::from_secs(at));
                    prop_assert!(IDLE_HINTS.contains(&hint));
                    let expected = last
                        .get(&(key, queue))
                        .map_or(IDLE_HINTS[0], |&previous| (previous * 2).min(IDLE_HINTS[4]));
                    prop_assert_eq!(hint, expected);
                    last.insert((key, queue), hint);
                }
                Op::Granted { key } => {
                    idle.granted(&key);
                    last.retain(|&(k, _), _| k != key);
                }
                Op::Enqueued { queue } => {
                    idle.enqueued(&queue);
                    last.retain(|&(_, q), _| q != queue);
                }
            }
        }
    }
}
