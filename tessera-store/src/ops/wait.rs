//! The long-poll: wait until a queue receives work or a timeout passes.

use std::time::{Duration, Instant};

use tessera_audit::{Action, Resource};
use tessera_lease::{Namespace, QueueName};

use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::wait::{MAX_LONG_POLL, WaitOutcome};
use crate::state::signals::Woken;
use crate::state::waiting::QueueKey;
use crate::store::Store;

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
    /// the next poll or claim. Where the backend's signals may be missed
    /// (PostgreSQL with its listening connection down) the long-poll reads
    /// again at the backend's polling interval. Blocks the calling thread
    /// (parking in real time, at most
    /// [`Clock::max_park`](crate::Clock::max_park) at a time).
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
        let outcome = self.watch(namespace, queue, &key, epoch, deadline);
        self.signals.unregister(&key);
        let outcome = outcome.inspect_err(|error| self.count(&scope, error.outcome()))?;
        let resource = Resource::new(&format!("queue:{queue}")).ok();
        self.audit_read(&scope, resource)?;
        Ok(outcome)
    }

    /// Reads whether the queue has work, then waits for an enqueue, the
    /// deadline, or the backend's polling interval (and reads again).
    fn watch(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        key: &QueueKey,
        epoch: u64,
        deadline: Instant,
    ) -> Result<WaitOutcome, Error> {
        let clock = self.clock().as_ref();
        loop {
            let generation = self.signals.generation();
            if self.read(|reader| Ok(reader.has_claimable(namespace, queue, self.now_utc())?))? {
                return Ok(WaitOutcome::WorkAvailable);
            }
            let until = match self.backend().poll_interval() {
                Some(interval) => deadline.min(clock.now() + interval),
                None => deadline,
            };
            match self.signals.wait(key, epoch, generation, until, clock) {
                Woken::Work => return Ok(WaitOutcome::WorkAvailable),
                Woken::TimedOut if clock.now() >= deadline => return Ok(WaitOutcome::TimedOut),
                Woken::TimedOut | Woken::LookAgain => {}
            }
        }
    }
}
