//! When a principal's `last_used_at` is written.
//!
//! `tessera-audit`'s rule: at most once per [`OBSERVATION_INTERVAL`], and at
//! once when the principal's account or kind changed. The store splits it
//! by what pays for the write. A changed identity is written when the key
//! is resolved, in a transaction of its own. A write due only because the
//! interval passed rides along in the transaction of the principal's next
//! audited action, so a request that writes nothing (an empty claim, a
//! denial, a failure, a replay) never pays a row for it: `last_used_at`
//! reflects the last audited action, at most the interval behind.
//!
//! [`Observations`] remembers, for at most a configured number of
//! principals, the identity each was last seen with and when its
//! `last_used_at` was last written. Forgetting a principal costs one write
//! at most: one it does not remember is due at its next audited action, as
//! after a restart.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_audit::OBSERVATION_INTERVAL;

use crate::access::{PrincipalId, PrincipalKind};

/// What must be written at once when it changes: account and kind.
pub(crate) type Identity = (String, PrincipalKind);

#[derive(Debug)]
struct Entry {
    /// The identity last seen; `None` if known only from a write.
    identity: Option<Identity>,
    /// When `last_used_at` was last written; `None`: not since first seen.
    written_at: Option<DateTime<Utc>>,
    seen: u64,
}

/// The store's `last_used_at` memory (see the module docs).
#[derive(Debug)]
pub(crate) struct Observations {
    entries: HashMap<PrincipalId, Entry>,
    // Seen stamp to principal, least recently seen first, so eviction and
    // moving a principal to the back are O(log n).
    by_seen: BTreeMap<u64, PrincipalId>,
    next_stamp: u64,
    capacity: usize,
}

impl Observations {
    /// A memory of at most `capacity` principals.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: HashMap::new(),
            by_seen: BTreeMap::new(),
            next_stamp: 0,
            capacity: capacity.get(),
        }
    }

    /// A key of `principal` resolved at `now` with `identity`: whether its
    /// `last_used_at` must be written at once, because the identity differs
    /// from the one last seen. That write is then taken as done (a refused
    /// one is not retried within the interval).
    pub(crate) fn resolved(
        &mut self,
        principal: PrincipalId,
        identity: &Identity,
        now: DateTime<Utc>,
    ) -> bool {
        let entry = self.entry(principal);
        match &entry.identity {
            Some(seen) if seen != identity => {
                entry.identity = Some(identity.clone());
                entry.written_at = Some(now);
                true
            }
            Some(_) => false,
            None => {
                entry.identity = Some(identity.clone());
                false
            }
        }
    }

    /// Whether an audited action of `principal` at `now` carries its
    /// `last_used_at`: never written since first seen, the interval passed
    /// since the last write, or the clock stepped back (so a jump cannot
    /// stretch the interval). Changes nothing; [`written`](Self::written)
    /// records the write once it commits.
    pub(crate) fn is_due(&self, principal: PrincipalId, now: DateTime<Utc>) -> bool {
        let Some(written_at) = self
            .entries
            .get(&principal)
            .and_then(|entry| entry.written_at)
        else {
            return true;
        };
        let elapsed = now.signed_duration_since(written_at);
        elapsed >= OBSERVATION_INTERVAL || elapsed < TimeDelta::zero()
    }

    /// `principal`'s `last_used_at` was written at `now`.
    pub(crate) fn written(&mut self, principal: PrincipalId, now: DateTime<Utc>) {
        self.entry(principal).written_at = Some(now);
    }

    /// How many principals it remembers.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// `principal`'s entry, made the most recently seen; created (evicting
    /// the least recently seen past capacity) if it has none.
    fn entry(&mut self, principal: PrincipalId) -> &mut Entry {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(entry) = self.entries.get_mut(&principal) {
            self.by_seen.remove(&entry.seen);
            entry.seen = stamp;
        } else {
            if self.entries.len() >= self.capacity {
                if let Some((_, oldest)) = self.by_seen.pop_first() {
                    self.entries.remove(&oldest);
                }
            }
            self.entries.insert(
                principal,
                Entry {
                    identity: None,
                    written_at: None,
                    seen: stamp,
                },
            );
        }
        self.by_seen.insert(stamp, principal);
        self.entries
            .get_mut(&principal)
            .expect("the entry was just made")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noon() -> DateTime<Utc> {
        "2026-10-29T12:00:00Z".parse().unwrap()
    }

    fn p(n: &str) -> PrincipalId {
        PrincipalId::parse(n).unwrap()
    }

    fn acme() -> Identity {
        ("acme".to_owned(), PrincipalKind::Keyed)
    }

    fn memory(capacity: usize) -> Observations {
        Observations::new(NonZeroUsize::new(capacity).unwrap())
    }

    #[test]
    fn resolving_a_key_writes_only_a_changed_identity() {
        let mut m = memory(8);
        // First sight: nothing to compare with, nothing written.
        assert!(!m.resolved(p("p1"), &acme(), noon()));
        assert!(!m.resolved(p("p1"), &acme(), noon()));
        let globex = ("globex".to_owned(), PrincipalKind::Keyed);
        assert!(m.resolved(p("p1"), &globex, noon()));
        let admin = ("globex".to_owned(), PrincipalKind::Admin);
        assert!(m.resolved(p("p1"), &admin, noon()));
        // Changing back is a change too.
        assert!(m.resolved(p("p1"), &acme(), noon()));
    }

    #[test]
    fn an_audited_action_is_due_once_per_interval() {
        let mut m = memory(8);
        assert!(!m.resolved(p("p1"), &acme(), noon()));
        assert!(m.is_due(p("p1"), noon()), "never written");
        // Deciding changes nothing; only a committed write does.
        assert!(m.is_due(p("p1"), noon()));
        m.written(p("p1"), noon());
        let almost = noon() + OBSERVATION_INTERVAL - TimeDelta::milliseconds(1);
        assert!(!m.is_due(p("p1"), almost));
        assert!(m.is_due(p("p1"), noon() + OBSERVATION_INTERVAL));
        assert!(
            m.is_due(p("p1"), noon() - TimeDelta::seconds(1)),
            "clock back"
        );
        // A write at once for a changed identity counts as the write.
        let globex = ("globex".to_owned(), PrincipalKind::Keyed);
        let later = noon() + TimeDelta::seconds(90);
        assert!(m.resolved(p("p1"), &globex, later));
        assert!(!m.is_due(p("p1"), later + TimeDelta::seconds(30)));
    }

    #[test]
    fn the_least_recently_seen_is_forgotten_past_capacity() {
        let mut m = memory(2);
        m.written(p("p1"), noon());
        m.written(p("p2"), noon());
        // Seeing p1 again makes p2 the least recently seen.
        assert!(!m.resolved(p("p1"), &acme(), noon()));
        assert!(!m.resolved(p("p3"), &acme(), noon()));
        assert_eq!(m.len(), 2);
        assert!(!m.is_due(p("p1"), noon()));
        assert!(m.is_due(p("p2"), noon()), "p2 was forgotten, so it is due");
    }
}
