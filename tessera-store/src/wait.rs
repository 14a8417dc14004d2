//! The long-poll: wait until a queue receives work or a timeout passes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use tessera_audit::{Action, Resource};
use tessera_lease::{Namespace, QueueName};

use crate::access::{Caller, Scope};
use crate::claim::QueueKey;
use crate::clock::Clock;
use crate::error::Error;
use crate::sql::millis;
use crate::sql::tasks as sql;
use crate::store::Store;

/// The longest one [`Store::wait_for_work`] call waits.
pub const MAX_LONG_POLL: Duration = Duration::from_secs(300);

/// How a long-poll ended.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    /// The queue had a claimable task, or received an enqueue: claim now.
    WorkAvailable,
    /// The timeout passed without an enqueue.
    TimedOut,
}

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
    fn register(&self, key: &QueueKey) -> u64 {
        let mut queues = self.queues.lock();
        let signal = queues.entry(key.clone()).or_insert(Signal {
            epoch: 0,
            waiters: 0,
        });
        signal.waiters += 1;
        signal.epoch
    }

    fn waiting(&self) -> usize {
        self.queues
            .lock()
            .values()
            .map(|signal| signal.waiters)
            .sum()
    }

    fn unregister(&self, key: &QueueKey) {
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
    fn wait(&self, key: &QueueKey, epoch: u64, deadline: Instant, clock: &dyn Clock) -> bool {
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

impl Store {
    /// How many [`wait_for_work`](Self::wait_for_work) calls are waiting,
    /// for metrics. O(queues being polled).
    pub fn long_polls_waiting(&self) -> usize {
        self.signals.waiting()
    }

    /// Long-polls `queue` of `namespace`: returns at once if it has a
    /// claimable task, otherwise when it receives an enqueue or when
    /// `timeout` (at most [`MAX_LONG_POLL`]) passes on the store's clock.
    ///
    /// Needs the `claim` scope and the namespace grant. One indexed read at
    /// the start and one audit row per request, however long it waits; the
    /// wait itself reads and writes nothing. Readiness that does not come
    /// from an enqueue (a lease lapsing, a backoff ending) is noticed by
    /// the next poll or claim. Blocks the calling thread (parking in real
    /// time, at most [`Clock::max_park`] at a time).
    pub fn wait_for_work(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        timeout: Duration,
    ) -> Result<WaitOutcome, Error> {
        let scope = self.admit(caller, namespace, Scope::Claim, Action::WaitForWork)?;
        let deadline = self.clock().now() + timeout.min(MAX_LONG_POLL);
        let key = (namespace.clone(), queue.clone());
        // Registered before the read, so an enqueue committed after it is
        // seen as a new epoch.
        let epoch = self.signals.register(&key);
        let outcome = self
            .read(|reader| {
                Ok(sql::has_claimable(
                    reader,
                    namespace.as_str(),
                    queue.as_str(),
                    millis(self.now_utc()),
                )?)
            })
            .map(|ready| {
                if ready
                    || self
                        .signals
                        .wait(&key, epoch, deadline, self.clock().as_ref())
                {
                    WaitOutcome::WorkAvailable
                } else {
                    WaitOutcome::TimedOut
                }
            });
        self.signals.unregister(&key);
        let outcome = outcome.inspect_err(|error| self.count(&scope, error.outcome()))?;
        let resource = Resource::new(&format!("queue:{queue}")).ok();
        self.audit_read(&scope, resource)?;
        Ok(outcome)
    }
}
