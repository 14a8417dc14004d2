//! Concurrency limits: at most so many leased attempts in a queue, and in
//! each partition of it.
//!
//! A slot is a stored attempt in the `leased` state, and nothing else: a
//! backend counts them when it grants, and never keeps a counter to
//! increment and decrement. So a slot is freed exactly when its attempt
//! leaves `leased`: by a submit or failure report with the live fencing
//! token, by a cancel, or when a lapse is recorded (the attempt is granted
//! again under a higher token, or expired). A lapsed lease whose lapse is
//! not yet recorded still holds its slot, and a holder whose lease lapsed can
//! never free one twice, since its stale token changes nothing.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

/// A queue's concurrency limits; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ConcurrencyLimit {
    /// At most this many of the queue's attempts leased at once.
    #[serde(default)]
    pub queue: Option<NonZeroU32>,
    /// At most this many leased at once among the queue's tasks of one
    /// [`PartitionKey`](crate::PartitionKey). Tasks without a partition key
    /// count only towards `queue`.
    #[serde(default)]
    pub per_partition: Option<NonZeroU32>,
}

/// The slots already held when one more attempt would be granted: leased
/// attempts other than the one being granted (a lapsed attempt granted
/// again gives up its own slot as it takes the new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Held {
    /// Leased attempts in the queue.
    pub queue: u32,
    /// Leased attempts in the candidate's partition; `None` when the
    /// candidate has no partition key.
    pub partition: Option<u32>,
}

impl ConcurrencyLimit {
    /// No limit at all.
    pub const NONE: Self = Self {
        queue: None,
        per_partition: None,
    };

    /// Whether one more attempt may be leased with `held` slots taken.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tessera_lease::{ConcurrencyLimit, Held};
    /// let one_per_customer = ConcurrencyLimit { queue: None, per_partition: NonZeroU32::new(1) };
    /// assert!(one_per_customer.admits(Held { queue: 5, partition: Some(0) }));
    /// assert!(!one_per_customer.admits(Held { queue: 5, partition: Some(1) }));
    /// assert!(one_per_customer.admits(Held { queue: 5, partition: None }));
    /// ```
    pub fn admits(&self, held: Held) -> bool {
        let under =
            |limit: Option<NonZeroU32>, count: u32| limit.is_none_or(|max| count < max.get());
        under(self.queue, held.queue)
            && held
                .partition
                .is_none_or(|count| under(self.per_partition, count))
    }

    /// Whether any limit is set, so a backend must count before granting.
    pub fn is_limited(&self) -> bool {
        self.queue.is_some() || self.per_partition.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_admits_everything() {
        assert!(ConcurrencyLimit::NONE.admits(Held {
            queue: u32::MAX,
            partition: Some(u32::MAX)
        }));
        assert!(!ConcurrencyLimit::NONE.is_limited());
    }

    #[test]
    fn the_queue_limit_counts_every_partition() {
        let limit = ConcurrencyLimit {
            queue: NonZeroU32::new(3),
            per_partition: NonZeroU32::new(2),
        };
        assert!(limit.admits(Held {
            queue: 2,
            partition: Some(1)
        }));
        assert!(!limit.admits(Held {
            queue: 3,
            partition: Some(0)
        }));
        assert!(!limit.admits(Held {
            queue: 2,
            partition: Some(2)
        }));
        assert!(!limit.admits(Held {
            queue: 3,
            partition: None
        }));
    }
}
