//! What long-polls wait on: an epoch per polled queue and one condvar.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Bumped when every long-poll should look again for itself (the
    /// backend's signals stopped arriving).
    generation: AtomicU64,
}

/// How a [`QueueSignals::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The queue received an enqueue.
    Work,
    /// Every long-poll was asked to look again ([`QueueSignals::wake_all`]).
    LookAgain,
    /// The clock reached the time waited for.
    TimedOut,
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

    /// Wakes every long-poll to look again for itself: the backend's
    /// signals stopped arriving, so they may have missed an enqueue.
    pub(crate) fn wake_all(&self) {
        let _queues = self.queues.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// The current [`wake_all`](Self::wake_all) generation, read before a
    /// long-poll looks at its queue.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
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

    /// Waits until `key`'s epoch moves past `epoch`, the generation past
    /// `generation`, or the clock reaches `until`.
    pub(crate) fn wait(
        &self,
        key: &QueueKey,
        epoch: u64,
        generation: u64,
        until: Instant,
        clock: &dyn Clock,
    ) -> Woken {
        let mut queues = self.queues.lock();
        loop {
            if queues.get(key).is_some_and(|signal| signal.epoch != epoch) {
                return Woken::Work;
            }
            if self.generation.load(Ordering::SeqCst) != generation {
                return Woken::LookAgain;
            }
            let now = clock.now();
            if now >= until {
                return Woken::TimedOut;
            }
            let mut park = until - now;
            if let Some(slice) = clock.max_park() {
                park = park.min(slice);
            }
            self.changed.wait_for(&mut queues, park);
        }
    }
}
