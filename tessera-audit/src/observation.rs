//! Coalescing of the observational `last_used_at` write.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    num::NonZeroUsize,
};

use chrono::{DateTime, TimeDelta, Utc};

/// The shortest time between two `last_used_at` writes of an unchanged principal.
pub const OBSERVATION_INTERVAL: TimeDelta = TimeDelta::seconds(60);

/// What an observation of a principal asks its caller to write.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Observation {
    /// Nothing: written less than [`OBSERVATION_INTERVAL`] ago, snapshot
    /// unchanged.
    Skip,
    /// The interval has passed since the last write, the principal is not
    /// remembered, or the clock stepped back. Write `last_used_at` when it is
    /// cheap (a store writes it inside the principal's next audited action),
    /// then report it with [`ObservationCoalescer::written`]; until then the
    /// principal stays due.
    Due,
    /// The snapshot (account or kind) differs from the one last seen: write at
    /// once. The coalescer already counts this write as done.
    Changed,
}

/// Decides when a principal's `last_used_at` (and its identity snapshot) must be
/// written: at most once per [`OBSERVATION_INTERVAL`], except that a changed
/// snapshot (account or principal kind) is written at once.
///
/// `P` identifies a principal (a [`Principal`](crate::Principal), a row id);
/// `S` is what must propagate at once when it changes, typically
/// `(account, kind)`.
///
/// [`observe`](Self::observe) answers with an [`Observation`]: `Changed` is
/// written at once and counted as written; `Due` is written whenever the
/// caller next writes anyway and reported with [`written`](Self::written),
/// so a request that writes nothing else need not pay a row for it.
///
/// It remembers, for at most `capacity` principals, the snapshot last seen and
/// when `last_used_at` was last written; past that the least recently seen is
/// forgotten. Forgetting only costs one write: a principal it does not
/// remember is due, as after a restart. It is not told the stored row, so the
/// decision costs no read.
///
/// If a write it asked for fails, [`forget`](Self::forget) the principal to
/// retry, or keep the memory to leave a storage that refuses writes alone
/// until the interval ends; either way `last_used_at` is an approximate
/// observation, not the activity log.
///
/// ```
/// use std::num::NonZeroUsize;
/// use chrono::{TimeDelta, TimeZone, Utc};
/// use tessera_audit::{Observation, ObservationCoalescer};
///
/// let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(10_000).unwrap());
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
/// assert_eq!(coalescer.observe(&"key-1", &("acme", "keyed"), now), Observation::Due);
/// coalescer.written(&"key-1", now);
/// let later = now + TimeDelta::seconds(30);
/// assert_eq!(coalescer.observe(&"key-1", &("acme", "keyed"), later), Observation::Skip);
/// let moved = now + TimeDelta::seconds(31);
/// assert_eq!(coalescer.observe(&"key-1", &("globex", "keyed"), moved), Observation::Changed);
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
    /// The snapshot last seen; `None` if known only from a write.
    snapshot: Option<S>,
    /// When `last_used_at` was last written; `None`: not since remembered.
    written_at: Option<DateTime<Utc>>,
    seen: u64,
}

impl<S> Entry<S> {
    fn is_due(&self, now: DateTime<Utc>) -> bool {
        let Some(written_at) = self.written_at else {
            return true;
        };
        // A clock that stepped back must not stretch the interval.
        let elapsed = now.signed_duration_since(written_at);
        elapsed >= OBSERVATION_INTERVAL || elapsed < TimeDelta::zero()
    }
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

    /// Records that `principal` was seen at `now` with `snapshot` and says
    /// what to write (see [`Observation`]).
    ///
    /// `Changed` when the snapshot differs from the one last seen; `Due` when
    /// the principal is not remembered, was not written since, was written
    /// [`OBSERVATION_INTERVAL`] or more ago, or the clock stepped back;
    /// otherwise `Skip`.
    pub fn observe(&mut self, principal: &P, snapshot: &S, now: DateTime<Utc>) -> Observation {
        let entry = self.touch(principal);
        match &entry.snapshot {
            Some(seen) if seen != snapshot => {
                entry.snapshot = Some(snapshot.clone());
                entry.written_at = Some(now);
                return Observation::Changed;
            }
            Some(_) => {}
            None => entry.snapshot = Some(snapshot.clone()),
        }
        if entry.is_due(now) {
            Observation::Due
        } else {
            Observation::Skip
        }
    }

    /// Whether `principal`'s `last_used_at` is due at `now` (as
    /// [`Observation::Due`]), without recording a sighting.
    #[must_use]
    pub fn is_due(&self, principal: &P, now: DateTime<Utc>) -> bool {
        self.entries
            .get(principal)
            .is_none_or(|entry| entry.is_due(now))
    }

    /// `principal`'s `last_used_at` was written at `now`; the interval
    /// restarts from here.
    pub fn written(&mut self, principal: &P, now: DateTime<Utc>) {
        self.touch(principal).written_at = Some(now);
    }

    /// Forgets `principal`, so it is due at its next observation.
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

    /// `principal`'s entry, made the most recently seen; created (evicting
    /// the least recently seen past capacity) if it has none.
    fn touch(&mut self, principal: &P) -> &mut Entry<S> {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(entry) = self.entries.get_mut(principal) {
            // Reuse the stored clone of the key.
            let key = self
                .by_seen
                .remove(&entry.seen)
                .unwrap_or_else(|| principal.clone());
            self.by_seen.insert(stamp, key);
            entry.seen = stamp;
        } else {
            if self.entries.len() >= self.capacity {
                if let Some((_, oldest)) = self.by_seen.pop_first() {
                    self.entries.remove(&oldest);
                }
            }
            self.entries.insert(
                principal.clone(),
                Entry {
                    snapshot: None,
                    written_at: None,
                    seen: stamp,
                },
            );
            self.by_seen.insert(stamp, principal.clone());
        }
        self.entries
            .get_mut(principal)
            .expect("the entry was just made")
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use Observation::{Changed, Due, Skip};

    fn noon() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
    }

    fn coalescer(capacity: usize) -> ObservationCoalescer<u32, (&'static str, &'static str)> {
        ObservationCoalescer::new(NonZeroUsize::new(capacity).unwrap())
    }

    const ACME: (&str, &str) = ("acme", "keyed");

    #[test]
    fn sixty_second_interval_from_the_last_write() {
        let mut c = coalescer(8);
        assert_eq!(c.observe(&1, &ACME, noon()), Due, "first sight");
        // Due stays due until reported written.
        assert_eq!(c.observe(&1, &ACME, noon()), Due);
        c.written(&1, noon());
        let almost = noon() + OBSERVATION_INTERVAL - TimeDelta::nanoseconds(1);
        assert_eq!(c.observe(&1, &ACME, almost), Skip);
        assert!(!c.is_due(&1, almost));
        assert_eq!(c.observe(&1, &ACME, noon() + OBSERVATION_INTERVAL), Due);
        assert!(c.is_due(&1, noon() + OBSERVATION_INTERVAL));
        c.written(&1, noon() + TimeDelta::seconds(70));
        assert_eq!(c.observe(&1, &ACME, noon() + TimeDelta::seconds(129)), Skip);
        assert_eq!(c.observe(&1, &ACME, noon() + TimeDelta::seconds(130)), Due);
    }

    #[test]
    fn changed_account_or_kind_writes_at_once() {
        let mut c = coalescer(8);
        assert_eq!(c.observe(&1, &ACME, noon()), Due);
        assert_eq!(c.observe(&1, &("globex", "keyed"), noon()), Changed);
        assert_eq!(c.observe(&1, &("globex", "admin"), noon()), Changed);
        // A change counts as the write.
        assert_eq!(c.observe(&1, &("globex", "admin"), noon()), Skip);
        // Changing back is a change too.
        assert_eq!(c.observe(&1, &ACME, noon()), Changed);
    }

    #[test]
    fn principals_are_independent() {
        let mut c = coalescer(8);
        assert_eq!(c.observe(&1, &ACME, noon()), Due);
        c.written(&1, noon());
        assert_eq!(c.observe(&2, &ACME, noon()), Due);
        assert_eq!(c.observe(&1, &ACME, noon()), Skip);
    }

    #[test]
    fn least_recently_seen_is_forgotten_past_capacity() {
        let mut c = coalescer(2);
        c.written(&1, noon());
        c.written(&2, noon());
        // Seeing 1 again makes 2 the least recently seen.
        assert_eq!(c.observe(&1, &ACME, noon()), Skip);
        assert_eq!(c.observe(&3, &ACME, noon()), Due);
        assert_eq!(c.len(), 2);
        assert!(!c.is_due(&1, noon()));
        assert!(c.is_due(&2, noon()), "2 was forgotten, so it is due");
    }

    #[test]
    fn a_snapshot_known_only_from_a_write_is_not_a_change() {
        let mut c = coalescer(8);
        c.written(&1, noon());
        assert_eq!(c.observe(&1, &ACME, noon()), Skip);
        assert_eq!(c.observe(&1, &("globex", "keyed"), noon()), Changed);
    }

    #[test]
    fn forget_and_clock_step_back_are_due() {
        let mut c = coalescer(8);
        assert_eq!(c.observe(&1, &ACME, noon()), Due);
        c.written(&1, noon());
        c.forget(&1);
        assert!(c.is_empty());
        assert_eq!(c.observe(&1, &ACME, noon()), Due);
        c.written(&1, noon());
        assert_eq!(c.observe(&1, &ACME, noon() - TimeDelta::seconds(1)), Due);
    }
}
