//! What long-polls wait on: an epoch per polled queue and one condvar.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::clock::Clock;
use crate::state::waiting::QueueKey;

#[derive(Debug)]
struct Signal {
    /// Bumped by every enqueue into the queue.
    epoch: u64,
    /// Long-polls registered on the queue; the entry goes with the last.
    waiters: usize,
}

/// One epoch per queue that long-polls wait on, and one condvar for all of
/// them. Only queues with a waiter have an entry, so memory follows the
/// long-polls, not the queues.
#[derive(Debug, Default)]
pub(crate) struct QueueSignals {
    queues: Mutex<HashMap<QueueKey, Signal>>,
    changed: Condvar,
}

impl QueueSignals {
    /// An enqueue into `key`: wakes its long-polls.
    pub(crate) fn notify(&self, key: &QueueKey) {
        let mut queues = self.queues.lock();
        if let Some(signal) = queues.get_mut(key) {
            signal.epoch += 1;
            self.changed.notify_all();
        }
    }

    /// Registers a long-poll on `key`; returns the epoch it started at.
    pub(crate) fn register(&self, key: &QueueKey) -> u64 {
        let mut queues = self.queues.lock();
        let signal = queues.entry(key.clone()).or_insert(Signal {
            epoch: 0,
            waiters: 0,
        });
        signal.waiters += 1;
        signal.epoch
    }

    pub(crate) fn waiting(&self) -> usize {
        self.queues
            .lock()
            .values()
            .map(|signal| signal.waiters)
            .sum()
    }

    pub(crate) fn unregister(&self, key: &QueueKey) {
        let mut queues = self.queues.lock();
        if let Some(signal) = queues.get_mut(key) {
            signal.waiters -= 1;
            if signal.waiters == 0 {
                queues.remove(key);
            }
        }
    }

    /// Waits until `key`'s epoch moves past `epoch` (`true`) or the clock
    /// reaches `deadline` (`false`).
    pub(crate) fn wait(
        &self,
        key: &QueueKey,
        epoch: u64,
        deadline: Instant,
        clock: &dyn Clock,
    ) -> bool {
        let mut queues = self.queues.lock();
        loop {
            if queues.get(key).is_some_and(|signal| signal.epoch != epoch) {
                return true;
            }
            let now = clock.now();
            if now >= deadline {
                return false;
            }
            let mut park = deadline - now;
            if let Some(slice) = clock.max_park() {
                park = park.min(slice);
            }
            self.changed.wait_for(&mut queues, park);
        }
    }
}
