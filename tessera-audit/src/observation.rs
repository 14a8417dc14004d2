//! Coalescing of the observational `last_used_at` write.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    num::NonZeroUsize,
};

use chrono::{DateTime, TimeDelta, Utc};

/// The shortest time between two `last_used_at` writes of an unchanged principal.
pub const OBSERVATION_INTERVAL: TimeDelta = TimeDelta::seconds(60);

/// Decides when a principal's `last_used_at` (and its identity snapshot) must be
/// written: at most once per [`OBSERVATION_INTERVAL`], except that a changed
/// snapshot (account or principal kind) is written at once.
///
/// `P` identifies a principal (a [`Principal`](crate::Principal), a row id);
/// `S` is what must propagate at once when it changes, typically
/// `(account, kind)`.
///
/// It remembers what it last decided to write, for at most `capacity`
/// principals; past that the least recently seen is forgotten. Forgetting only
/// costs one write: a principal it does not remember is written on its next
/// observation, as after a restart. It is not told the stored row, so the
/// decision costs no read.
///
/// If a write it asked for fails, [`forget`](Self::forget) the principal to
/// retry on the next observation, or keep the memory to leave a storage that
/// refuses writes alone until the interval ends; either way `last_used_at` is
/// an approximate observation, not the activity log.
///
/// ```
/// use std::num::NonZeroUsize;
/// use chrono::{TimeDelta, TimeZone, Utc};
/// use tessera_audit::ObservationCoalescer;
///
/// let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(10_000).unwrap());
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
/// assert!(coalescer.observe(&"key-1", &("acme", "keyed"), now));
/// assert!(!coalescer.observe(&"key-1", &("acme", "keyed"), now + TimeDelta::seconds(30)));
/// assert!(coalescer.observe(&"key-1", &("globex", "keyed"), now + TimeDelta::seconds(31)));
/// ```
#[derive(Debug, Clone)]
pub struct ObservationCoalescer<P, S> {
    entries: HashMap<P, Entry<S>>,
    // Seen stamp to principal; the first entry is the least recently seen, so
    // eviction and moving a principal to the back are O(log n).
    by_seen: BTreeMap<u64, P>,
    next_stamp: u64,
    capacity: usize,
}

#[derive(Debug, Clone)]
struct Entry<S> {
    snapshot: S,
    written_at: DateTime<Utc>,
    seen: u64,
}

impl<P: Hash + Eq + Clone, S: Eq + Clone> ObservationCoalescer<P, S> {
    /// A coalescer that remembers at most `capacity` principals.
    pub fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: HashMap::new(),
            by_seen: BTreeMap::new(),
            next_stamp: 0,
            capacity: capacity.get(),
        }
    }

    /// Records that `principal` was seen at `now` with `snapshot`; returns
    /// whether its `last_used_at` and snapshot must be written.
    ///
    /// True when the principal is not remembered, when its snapshot differs from
    /// the one last written, when [`OBSERVATION_INTERVAL`] or more has passed
    /// since the last write, or when the clock stepped back (so a jump cannot
    /// stretch the interval).
    #[must_use]
    pub fn observe(&mut self, principal: &P, snapshot: &S, now: DateTime<Utc>) -> bool {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(entry) = self.entries.get_mut(principal) {
            // Move to the most recently seen end, reusing the stored clone.
            let key = self
                .by_seen
                .remove(&entry.seen)
                .unwrap_or_else(|| principal.clone());
            self.by_seen.insert(stamp, key);
            entry.seen = stamp;
            let elapsed = now.signed_duration_since(entry.written_at);
            let write = entry.snapshot != *snapshot
                || elapsed >= OBSERVATION_INTERVAL
                || elapsed < TimeDelta::zero();
            if write {
                entry.snapshot = snapshot.clone();
                entry.written_at = now;
            }
            return write;
        }
        if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.by_seen.pop_first() {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(
            principal.clone(),
            Entry {
                snapshot: snapshot.clone(),
                written_at: now,
                seen: stamp,
            },
        );
        self.by_seen.insert(stamp, principal.clone());
        true
    }

    /// Forgets `principal`, so its next observation writes.
    pub fn forget(&mut self, principal: &P) {
        if let Some(entry) = self.entries.remove(principal) {
            self.by_seen.remove(&entry.seen);
        }
    }

    /// How many principals it remembers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it remembers no principal.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most principals it remembers.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn noon() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
    }

    fn coalescer(capacity: usize) -> ObservationCoalescer<u32, (&'static str, &'static str)> {
        ObservationCoalescer::new(NonZeroUsize::new(capacity).unwrap())
    }

    const ACME: (&str, &str) = ("acme", "keyed");

    #[test]
    fn sixty_second_interval() {
        let mut c = coalescer(8);
        assert!(c.observe(&1, &ACME, noon()));
        let almost = noon() + OBSERVATION_INTERVAL - TimeDelta::nanoseconds(1);
        assert!(!c.observe(&1, &ACME, almost));
        assert!(c.observe(&1, &ACME, noon() + OBSERVATION_INTERVAL));
        // The interval restarts from the last write, not the last observation.
        assert!(!c.observe(&1, &ACME, noon() + TimeDelta::seconds(119)));
        assert!(c.observe(&1, &ACME, noon() + TimeDelta::seconds(120)));
    }

    #[test]
    fn changed_account_or_kind_writes_at_once() {
        let mut c = coalescer(8);
        assert!(c.observe(&1, &ACME, noon()));
        assert!(c.observe(&1, &("globex", "keyed"), noon()));
        assert!(c.observe(&1, &("globex", "admin"), noon()));
        assert!(!c.observe(&1, &("globex", "admin"), noon()));
        // Changing back is a change too.
        assert!(c.observe(&1, &ACME, noon()));
    }

    #[test]
    fn principals_are_independent() {
        let mut c = coalescer(8);
        assert!(c.observe(&1, &ACME, noon()));
        assert!(c.observe(&2, &ACME, noon()));
        assert!(!c.observe(&1, &ACME, noon()));
    }

    #[test]
    fn least_recently_seen_is_forgotten_past_capacity() {
        let mut c = coalescer(2);
        assert!(c.observe(&1, &ACME, noon()));
        assert!(c.observe(&2, &ACME, noon()));
        // Seeing 1 again makes 2 the least recently seen.
        assert!(!c.observe(&1, &ACME, noon()));
        assert!(c.observe(&3, &ACME, noon()));
        assert_eq!(c.len(), 2);
        assert!(!c.observe(&1, &ACME, noon()));
        assert!(
            c.observe(&2, &ACME, noon()),
            "2 was forgotten, so it writes"
        );
    }

    #[test]
    fn forget_and_clock_step_back_write() {
        let mut c = coalescer(8);
        assert!(c.observe(&1, &ACME, noon()));
        c.forget(&1);
        assert!(c.is_empty());
        assert!(c.observe(&1, &ACME, noon()));
        assert!(c.observe(&1, &ACME, noon() - TimeDelta::seconds(1)));
        assert!(!c.observe(&1, &ACME, noon()));
    }
}
