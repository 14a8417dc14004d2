//! Idle pacing: the `Retry-After` hint an empty claim returns.
//!
//! While the same key keeps finding the same queue empty, the hint doubles
//! from 5 s to a 60 s ceiling: 5, 10, 20, 40, 60, 60, … ([`IDLE_HINTS`]). It
//! starts again at 5 s when that key is granted a lease (on any queue) or
//! that queue receives an enqueue. It is a hint, never a limit: a worker may
//! poll sooner. Readiness that does not come from an enqueue (a lapsed lease,
//! a retry backoff ending) is noticed at the next poll, at most 60 s later.
//!
//! State lives in memory and starts empty, so every key starts at 5 s after a
//! restart. Memory is bounded by [`IdleConfig::capacity`] (key, queue) entries;
//! past it the least recently seen entry is forgotten, which only means that
//! key starts again at 5 s on that queue.
//!
//! Every call is `O(1)` expected (hash maps) plus `O(log n)` for the
//! least-recently-seen index (a `BTreeMap` ordered by `(now, sequence)`).
//! Both resets are `O(1)` whatever the number of entries they reset: a key
//! and a queue each carry an epoch, a reset bumps it, and an entry recorded
//! under an older epoch counts as fresh.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::PolicyConfigError;

/// The idle hints in order; the last one repeats.
pub const IDLE_HINTS: [Duration; 5] = [
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(20),
    Duration::from_secs(40),
    Duration::from_secs(60),
];

const LAST_LEVEL: u8 = IDLE_HINTS.len() as u8 - 1;

/// Settings of an [`IdlePacing`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct IdleConfig {
    /// Most (key, queue) entries remembered at once. At least 1.
    /// Default 100,000.
    pub capacity: usize,
}

impl Default for IdleConfig {
    fn default() -> Self {
        Self { capacity: 100_000 }
    }
}

impl IdleConfig {
    /// Checks every setting against its minimum.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        PolicyConfigError::check(
            "idle.capacity",
            self.capacity.try_into().unwrap_or(u64::MAX),
            1,
        )
    }
}

/// Idle pacing hints for keys `K` polling queues `Q`.
///
/// ```
/// use std::time::{Duration, Instant};
/// use tessera_admission::{IdleConfig, IdlePacing};
///
/// let mut idle = IdlePacing::new(IdleConfig::default())?;
/// let now = Instant::now(); // a host reads its clock; the policy never does
/// let hints: Vec<u64> = (0..6).map(|_| idle.empty(&"key-1", &"jobs", now).as_secs()).collect();
/// assert_eq!(hints, [5, 10, 20, 40, 60, 60]);
///
/// idle.enqueued(&"jobs");
/// assert_eq!(idle.empty(&"key-1", &"jobs", now), Duration::from_secs(5));
/// # Ok::<(), tessera_admission::PolicyConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct IdlePacing<K, Q> {
    capacity: usize,
    keys: HashMap<K, KeyState<Q>>,
    queues: HashMap<Q, QueueState>,
    /// `(last seen, sequence)` of every entry, least recently seen first.
    by_last_seen: BTreeMap<(Instant, u64), (K, Q)>,
    len: usize,
    next_seq: u64,
}

/// A key's reset epoch and its entries, one per queue it found empty.
///
/// Kept only while it has entries, so the map is bounded by the capacity.
#[derive(Debug, Clone)]
struct KeyState<Q> {
    epoch: u64,
    streaks: HashMap<Q, Streak>,
}

/// A queue's reset epoch and how many entries refer to it.
///
/// Kept only while entries refer to it, so the map is bounded by the
/// capacity; a queue that comes back starts a new epoch count, which is safe
/// because no entry remembers the old one.
#[derive(Debug, Clone)]
struct QueueState {
    epoch: u64,
    streaks: usize,
}

#[derive(Debug, Clone)]
struct Streak {
    /// Index into [`IDLE_HINTS`] of the hint last given.
    level: u8,
    key_epoch: u64,
    queue_epoch: u64,
    last_seen: (Instant, u64),
}

impl<K: Hash + Eq + Clone, Q: Hash + Eq + Clone> IdlePacing<K, Q> {
    /// An empty pacing table: every key starts at 5 s.
    pub fn new(config: IdleConfig) -> Result<Self, PolicyConfigError> {
        config.validate()?;
        Ok(Self {
            capacity: config.capacity,
            keys: HashMap::new(),
            queues: HashMap::new(),
            by_last_seen: BTreeMap::new(),
            len: 0,
            next_seq: 0,
        })
    }

    /// Records that `key` found `queue` empty at `now` and returns the
    /// `Retry-After` hint to send: one of [`IDLE_HINTS`].
    #[must_use = "the hint is the Retry-After of the empty claim"]
    pub fn empty(&mut self, key: &K, queue: &Q, now: Instant) -> Duration {
        let seen = (now, self.next_seq);
        self.next_seq += 1;

        if let Some(state) = self.keys.get_mut(key) {
            if let Some(streak) = state.streaks.get_mut(queue) {
                let queue_epoch = self.queues[queue].epoch;
                let current = streak.key_epoch == state.epoch && streak.queue_epoch == queue_epoch;
                streak.level = if current {
                    (streak.level + 1).min(LAST_LEVEL)
                } else {
                    0
                };
                streak.key_epoch = state.epoch;
                streak.queue_epoch = queue_epoch;
                let pair = self
                    .by_last_seen
                    .remove(&streak.last_seen)
                    .expect("every entry is indexed by its last-seen stamp");
                streak.last_seen = seen;
                self.by_last_seen.insert(seen, pair);
                return IDLE_HINTS[usize::from(streak.level)];
            }
        }

        if self.len >= self.capacity {
            self.forget_least_recently_seen();
        }
        let queue_epoch = match self.queues.get_mut(queue) {
            Some(state) => {
                state.streaks += 1;
                state.epoch
            }
            None => {
                let state = QueueState {
                    epoch: 0,
                    streaks: 1,
                };
                self.queues.insert(queue.clone(), state);
                0
            }
        };
        if !self.keys.contains_key(key) {
            let state = KeyState {
                epoch: 0,
                streaks: HashMap::new(),
            };
            self.keys.insert(key.clone(), state);
        }
        let state = self.keys.get_mut(key).expect("inserted above");
        let streak = Streak {
            level: 0,
            key_epoch: state.epoch,
            queue_epoch,
            last_seen: seen,
        };
        state.streaks.insert(queue.clone(), streak);
        self.by_last_seen.insert(seen, (key.clone(), queue.clone()));
        self.len += 1;
        IDLE_HINTS[0]
    }

    /// The hint the next empty claim of `key` on `queue` would get, without
    /// recording anything.
    pub fn peek(&self, key: &K, queue: &Q) -> Duration {
        let Some(state) = self.keys.get(key) else {
            return IDLE_HINTS[0];
        };
        let Some(streak) = state.streaks.get(queue) else {
            return IDLE_HINTS[0];
        };
        let current =
            streak.key_epoch == state.epoch && streak.queue_epoch == self.queues[queue].epoch;
        if !current {
            return IDLE_HINTS[0];
        }
        IDLE_HINTS[usize::from((streak.level + 1).min(LAST_LEVEL))]
    }

    /// `key` was granted a lease: its hints start again at 5 s on every queue.
    pub fn granted(&mut self, key: &K) {
        if let Some(state) = self.keys.get_mut(key) {
            state.epoch += 1;
        }
    }

    /// `queue` received an enqueue: every key's hint on it starts again at 5 s.
    pub fn enqueued(&mut self, queue: &Q) {
        if let Some(state) = self.queues.get_mut(queue) {
            state.epoch += 1;
        }
    }

    /// The (key, queue) entries remembered, including ones a reset made fresh.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is remembered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most entries remembered at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn forget_least_recently_seen(&mut self) {
        let Some((_, (key, queue))) = self.by_last_seen.pop_first() else {
            return;
        };
        if let Some(state) = self.keys.get_mut(&key) {
            state.streaks.remove(&queue);
            if state.streaks.is_empty() {
                self.keys.remove(&key);
            }
        }
        if let Some(state) = self.queues.get_mut(&queue) {
            state.streaks -= 1;
            if state.streaks == 0 {
                self.queues.remove(&queue);
            }
        }
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arbitrary origin for hand-driven time; nothing waits on the clock.
    #[expect(clippy::disallowed_methods, reason = "an origin, not a reading")]
    fn origin() -> Instant {
        Instant::now()
    }

    fn pacing(capacity: usize) -> IdlePacing<u32, u32> {
        IdlePacing::new(IdleConfig { capacity }).unwrap()
    }

    /// The side maps never outgrow the entries that refer to them.
    fn assert_bounded(idle: &IdlePacing<u32, u32>) {
        let streaks: usize = idle.keys.values().map(|state| state.streaks.len()).sum();
        let queue_refs: usize = idle.queues.values().map(|state| state.streaks).sum();
        assert_eq!(streaks, idle.len);
        assert_eq!(queue_refs, idle.len);
        assert_eq!(idle.by_last_seen.len(), idle.len);
        assert!(idle.len <= idle.capacity);
        assert!(idle.keys.values().all(|state| !state.streaks.is_empty()));
        assert!(idle.queues.values().all(|state| state.streaks > 0));
    }

    #[test]
    fn side_maps_shrink_with_eviction() {
        let mut idle = pacing(3);
        let now = origin();
        for round in 0..50u32 {
            let _ = idle.empty(&(round % 7), &(round % 5), now);
            idle.granted(&(round % 3));
            idle.enqueued(&(round % 4));
            assert_bounded(&idle);
        }
    }

    #[test]
    fn reset_keeps_entry_until_next_empty() {
        let mut idle = pacing(10);
        let now = origin();
        let _ = idle.empty(&1, &1, now);
        idle.granted(&1);
        assert_eq!(idle.len(), 1);
        assert_eq!(idle.peek(&1, &1), IDLE_HINTS[0]);
        assert_eq!(idle.empty(&1, &1, now), IDLE_HINTS[0]);
        assert_eq!(idle.empty(&1, &1, now), IDLE_HINTS[1]);
        assert_bounded(&idle);
    }

    #[test]
    fn reset_of_unknown_key_or_queue_remembers_nothing() {
        let mut idle = pacing(10);
        idle.granted(&1);
        idle.enqueued(&1);
        assert!(idle.is_empty());
        assert!(idle.keys.is_empty() && idle.queues.is_empty());
    }
}
