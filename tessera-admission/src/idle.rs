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

use crate::ConfigError;

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
    /// Checks every setting against its minimum; errors name the setting as
    /// `idle.<field>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::out_of_range("idle.capacity", 0, "at least 1"));
        }
        Ok(())
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
/// # Ok::<(), tessera_admission::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct IdlePacing<K, Q> {
    capacity: usize,
    keys: HashMap<K, KeyState<Q>>,
    queues: HashMap<Q, QueueState>,
    /// `(last seen, sequence)` of every entry, least recently seen first:
    /// one entry per (key, queue), so its length is the number remembered.
    by_last_seen: BTreeMap<(Instant, u64), (K, Q)>,
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

impl Streak {
    /// Whether neither the key nor the queue was reset since the hint was
    /// last given.
    fn is_current(&self, key_epoch: u64, queue_epoch: u64) -> bool {
        self.key_epoch == key_epoch && self.queue_epoch == queue_epoch
    }
}

impl<K: Hash + Eq + Clone, Q: Hash + Eq + Clone> IdlePacing<K, Q> {
    /// An empty pacing table: every key starts at 5 s.
    pub fn new(config: IdleConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            capacity: config.capacity,
            keys: HashMap::new(),
            queues: HashMap::new(),
            by_last_seen: BTreeMap::new(),
            next_seq: 0,
        })
    }

    /// Records that `key` found `queue` empty at `now` and returns the
    /// `Retry-After` hint to send: one of [`IDLE_HINTS`].
    #[must_use = "the hint is the Retry-After of the empty claim"]
    pub fn empty(&mut self, key: &K, queue: &Q, now: Instant) -> Duration {
        let seen = (now, self.next_seq);
        self.next_seq += 1;
        let level = match self.continue_streak(key, queue, seen) {
            Some(level) => level,
            None => {
                self.start_streak(key, queue, seen);
                0
            }
        };
        IDLE_HINTS[usize::from(level)]
    }

    /// The hint the next empty claim of `key` on `queue` would get, without
    /// recording anything.
    pub fn peek(&self, key: &K, queue: &Q) -> Duration {
        let level = self
            .current_level(key, queue)
            .map(|level| (level + 1).min(LAST_LEVEL));
        IDLE_HINTS[usize::from(level.unwrap_or(0))]
    }

    /// Whether `key`'s last claim on `queue` found it empty, with no lease
    /// granted to `key` and no enqueue to `queue` since: the queue is
    /// likely still empty for that key, so a host may answer its next claim
    /// from a cheap read before taking the write path.
    pub fn found_empty(&self, key: &K, queue: &Q) -> bool {
        self.current_level(key, queue).is_some()
    }

    /// The level of `key`'s streak on `queue`, if it has one that no reset
    /// made fresh.
    fn current_level(&self, key: &K, queue: &Q) -> Option<u8> {
        let state = self.keys.get(key)?;
        let streak = state.streaks.get(queue)?;
        streak
            .is_current(state.epoch, self.queue_epoch(queue))
            .then_some(streak.level)
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
        self.by_last_seen.len()
    }

    /// Whether no entry is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_last_seen.is_empty()
    }

    /// Most entries remembered at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Another empty claim of a remembered (key, queue): moves its streak one
    /// level up (or back to the start after a reset) and returns the level;
    /// `None` if the pair is not remembered.
    fn continue_streak(&mut self, key: &K, queue: &Q, seen: (Instant, u64)) -> Option<u8> {
        let queue_epoch = self.queue_epoch(queue);
        let state = self.keys.get_mut(key)?;
        let streak = state.streaks.get_mut(queue)?;
        streak.level = if streak.is_current(state.epoch, queue_epoch) {
            (streak.level + 1).min(LAST_LEVEL)
        } else {
            0
        };
        streak.key_epoch = state.epoch;
        streak.queue_epoch = queue_epoch;
        // Move the pair to the most recently seen end, reusing its stored
        // clones.
        let pair = self
            .by_last_seen
            .remove(&streak.last_seen)
            .unwrap_or_else(|| (key.clone(), queue.clone()));
        streak.last_seen = seen;
        self.by_last_seen.insert(seen, pair);
        Some(streak.level)
    }

    /// Starts a streak for a (key, queue) not remembered, forgetting the
    /// least recently seen pair first when full.
    fn start_streak(&mut self, key: &K, queue: &Q, seen: (Instant, u64)) {
        if self.len() >= self.capacity {
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
        let state = self.keys.entry(key.clone()).or_insert_with(|| KeyState {
            epoch: 0,
            streaks: HashMap::new(),
        });
        let streak = Streak {
            level: 0,
            key_epoch: state.epoch,
            queue_epoch,
            last_seen: seen,
        };
        state.streaks.insert(queue.clone(), streak);
        self.by_last_seen.insert(seen, (key.clone(), queue.clone()));
    }

    /// The queue's reset epoch; a queue no entry refers to has none yet.
    fn queue_epoch(&self, queue: &Q) -> u64 {
        self.queues.get(queue).map_or(0, |state| state.epoch)
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
        assert_eq!(streaks, idle.len());
        assert_eq!(queue_refs, idle.len());
        assert!(idle.len() <= idle.capacity);
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
