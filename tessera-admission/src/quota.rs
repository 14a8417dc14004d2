//! The legacy per-principal `claims_per_minute` quota, as a generic cell
//! rate: a minute's allowance at once, then one claim per `60 s / N`.
//!
//! Times are nanoseconds on the controller's clock.

use std::collections::btree_map::BTreeMap;
use std::collections::hash_map::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// A minute, in nanoseconds.
const MINUTE: u64 = 60_000_000_000;

/// Per principal, the theoretical arrival time of its next claim. A principal
/// whose time has passed is back to a full allowance and is forgotten, so
/// memory holds only principals active within the last minute.
#[derive(Debug)]
pub(crate) struct Quota<P> {
    /// Time one claim uses up: `60 s / N`.
    emission: u64,
    /// How far ahead of `now` the theoretical arrival may run: the other
    /// `N - 1` claims of a burst.
    tolerance: u64,
    theoretical: HashMap<P, (u64, u64)>,
    /// The same entries by time, to forget them in order without a scan.
    by_time: BTreeMap<(u64, u64), P>,
    next_entry: u64,
}

impl<P: Hash + Eq + Clone> Quota<P> {
    /// `None` when the quota is off (0).
    pub(crate) fn new(per_minute: u32) -> Option<Self> {
        let emission = MINUTE.checked_div(u64::from(per_minute))?;
        Some(Self {
            emission,
            tolerance: MINUTE - emission,
            theoretical: HashMap::new(),
            by_time: BTreeMap::new(),
            next_entry: 0,
        })
    }

    /// `Err(wait)` when `principal` has no allowance left until `now + wait`.
    pub(crate) fn check(&self, principal: &P, now: u64) -> Result<(), Duration> {
        let Some(&(theoretical, _)) = self.theoretical.get(principal) else {
            return Ok(());
        };
        let ahead = theoretical.saturating_sub(now);
        if ahead <= self.tolerance {
            Ok(())
        } else {
            Err(Duration::from_nanos(ahead - self.tolerance))
        }
    }

    /// Spends one claim of `principal`'s allowance.
    pub(crate) fn charge(&mut self, principal: P, now: u64) {
        let entry = self.next_entry;
        self.next_entry += 1;
        let start = match self.theoretical.get(&principal) {
            Some(&(theoretical, old)) => {
                self.by_time.remove(&(theoretical, old));
                theoretical.max(now)
            }
            None => now,
        };
        // Past the end of the clock's range the principal is simply not
        // limited any further, rather than the controller panicking.
        let theoretical = start.checked_add(self.emission).unwrap_or(start);
        self.by_time.insert((theoretical, entry), principal.clone());
        self.theoretical.insert(principal, (theoretical, entry));
    }

    /// Forgets principals back to a full allowance at `now`.
    pub(crate) fn forget(&mut self, now: u64) {
        while let Some(entry) = self.by_time.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let principal = entry.remove();
            self.theoretical.remove(&principal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One second on the controller's clock.
    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn off_at_zero() {
        assert!(Quota::<u8>::new(0).is_none());
    }

    #[test]
    fn a_minute_at_once_then_one_per_emission_interval() {
        let start = 7 * SECOND;
        let mut quota = Quota::new(6).unwrap();
        for _ in 0..6 {
            assert_eq!(quota.check(&"a", start), Ok(()));
            quota.charge("a", start);
        }
        assert_eq!(quota.check(&"a", start), Err(Duration::from_secs(10)));
        assert_eq!(quota.check(&"b", start), Ok(()), "per principal");
        let later = start + 4 * SECOND;
        assert_eq!(quota.check(&"a", later), Err(Duration::from_secs(6)));
        let later = start + 10 * SECOND;
        assert_eq!(quota.check(&"a", later), Ok(()));
        quota.charge("a", later);
        assert!(quota.check(&"a", later).is_err());
    }

    #[test]
    fn forgets_principals_once_their_allowance_is_full_again() {
        let start = 7 * SECOND;
        let mut quota = Quota::new(60).unwrap();
        quota.charge("a", start);
        quota.charge("b", start + 30 * SECOND);
        quota.forget(start + SECOND);
        assert_eq!(quota.theoretical.len(), 1);
        assert_eq!(quota.by_time.len(), 1);
        quota.forget(start + 31 * SECOND);
        assert!(quota.theoretical.is_empty() && quota.by_time.is_empty());
    }
}
