//! The worker loop: claims ahead in batches, holds a small buffer,
//! heartbeats what it holds at once, and acknowledges through the
//! completer.

use std::collections::{HashMap, VecDeque};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_audit::Action;
use tessera_lease::{
    Failure, FencingToken, IdempotencyKey, Lease, Namespace, QueueName, Retry, Submitted, Task,
    TaskRecord, TaskState,
};

use crate::backend::{TaskChange, TaskHandle};
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::audit::ActionScope;
use crate::model::claim::{Claimed, ClaimedBatch, EmptyReason, MAX_CLAIM_BATCH};
use crate::model::task::{Output, TaskRef, not_found};
use crate::store::Store;

/// How a [`Worker`] claims ahead and when it lets a buffered task go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerOptions {
    /// The most tasks one refill claims (one
    /// [`claim_batch`](Store::claim_batch), one admission offer), 1 to
    /// [`MAX_CLAIM_BATCH`]; the buffer never holds more. Default 10.
    pub fetch: usize,
    /// A buffered task is handed out only while its lease has at least
    /// this long left; one with less is let go (its lease lapses and the
    /// task comes back to the queue). `min_lease_left_ms` in serde.
    /// Default 10 seconds; below the store's lease duration.
    #[serde(rename = "min_lease_left_ms", with = "crate::model::millis")]
    pub min_lease_left: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            fetch: 10,
            min_lease_left: Duration::from_secs(10),
        }
    }
}

impl WorkerOptions {
    /// Claims up to `fetch` tasks a refill.
    #[must_use]
    pub fn with_fetch(mut self, fetch: usize) -> Self {
        self.fetch = fetch;
        self
    }

    /// Lets a buffered task go when its lease has less than `left` left.
    #[must_use]
    pub fn with_min_lease_left(mut self, left: Duration) -> Self {
        self.min_lease_left = left;
        self
    }
}

/// What [`Worker::next`] came to.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerNext {
    /// A task to work on, its lease live for at least the worker's
    /// [`min_lease_left`](WorkerOptions::min_lease_left).
    Task(Box<Claimed>),
    /// Nothing claimable: the buffer is empty and the claim found nothing
    /// to take. Ask again after `retry_after` (the claim's `Retry-After`);
    /// `retry_after_ms` in serde.
    Empty {
        /// The idle-pacing hint.
        #[serde(rename = "retry_after_ms", with = "crate::model::millis")]
        retry_after: Duration,
        /// Why nothing was claimed: an empty, paused or limited queue.
        reason: EmptyReason,
    },
}

/// What a [`Worker`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Claims made (each one admission offer and one lease transaction).
    pub claims: u64,
    /// Tasks those claims leased.
    pub claimed: u64,
    /// Tasks handed out by [`next`](Worker::next).
    pub handed_out: u64,
    /// Buffered tasks let go, their lease too short to hand out.
    pub let_go: u64,
    /// Heartbeats of the buffer ([`heartbeat`](Worker::heartbeat)), each
    /// one transaction.
    pub heartbeats: u64,
}

/// A worker loop for one principal and one queue: it claims ahead in
/// batches, keeps the leases it has not handed out yet in a small local
/// buffer, heartbeats the buffer's leases at once, and acknowledges
/// through the store's completer.
///
/// Share it between threads (it is `Send + Sync` when its store handle
/// is, as `Arc<Store>` and `&Store` are), with an `Arc` or a scope: each
/// thread calls [`next`](Self::next), works, and calls
/// [`submit`](Self::submit) or [`fail`](Self::fail); the submits of all
/// threads are coalesced into one transaction by the completer
/// ([`AckBatching`](crate::AckBatching)). An async host awaits
/// [`next_async`](Self::next_async), which waits for admission through its
/// `Waker` as [`Store::claim_async`] does.
///
/// # Admission
///
/// A refill is one [`claim_batch`](Store::claim_batch): one offer to
/// admission, holding one unit of capacity for its lease transaction,
/// whatever its size. Admission shares the store's time between
/// principals, not tasks, so a worker that fetches ahead takes its fair
/// share of claim slots as one claimer, and the tasks it buffers are not
/// claims other principals wait behind. What the buffer does change is
/// who holds tasks: a buffered task is leased to this worker's principal
/// and no one else can claim it until its lease ends. Keep `fetch` near
/// the number of tasks the worker's threads finish within a lease.
///
/// # Leases
///
/// Buffered tasks hold live leases from the moment of their claim.
/// [`heartbeat`](Self::heartbeat) extends every buffered lease by the
/// store's lease duration in one transaction; a host calls it about once
/// per third of the lease while tasks wait in the buffer (the leases of
/// tasks handed out are the worker thread's to extend, with
/// [`Store::heartbeat`]). [`next`](Self::next) never hands out a task
/// whose lease has less than
/// [`min_lease_left`](WorkerOptions::min_lease_left) left: it lets it go
/// (counted in [`WorkerStats::let_go`]) and its lease lapses, so the task
/// comes back to the queue under the lease rules (the lapse ends that
/// try, as any lapse does). [`release`](Self::release) hands the whole
/// buffer back at once (a failure report with no backoff each, which ends
/// the try too), for a worker that stops.
#[derive(Debug)]
pub struct Worker<S = Arc<Store>>
where
    S: Deref<Target = Store>,
{
    store: S,
    caller: Caller,
    namespace: Namespace,
    queue: QueueName,
    options: WorkerOptions,
    buffer: Mutex<VecDeque<Claimed>>,
    stats: Mutex<WorkerStats>,
}

impl<S: Deref<Target = Store>> Worker<S> {
    /// A worker loop of `caller` on `queue` in `namespace`, on `store`: an
    /// `Arc<Store>` (the default), a `&Store`, or anything else that
    /// dereferences to one.
    ///
    /// `400 invalid_input` for a `fetch` outside 1 to
    /// [`MAX_CLAIM_BATCH`], or a `min_lease_left` not below the store's
    /// lease duration (every task would be let go).
    pub fn new(
        store: S,
        caller: Caller,
        namespace: Namespace,
        queue: QueueName,
        options: WorkerOptions,
    ) -> Result<Self, Error> {
        if options.fetch == 0 || options.fetch > MAX_CLAIM_BATCH {
            return Err(Error::InvalidInput {
                reason: format!(
                    "a worker fetches 1 to {MAX_CLAIM_BATCH} tasks at a time, not {}",
                    options.fetch
                ),
            });
        }
        if options.min_lease_left >= store.config.lease_duration() {
            return Err(Error::InvalidInput {
                reason: "a worker's min_lease_left must be below the lease duration".to_owned(),
            });
        }
        Ok(Self {
            store,
            caller,
            namespace,
            queue,
            options,
            buffer: Mutex::new(VecDeque::new()),
            stats: Mutex::new(WorkerStats::default()),
        })
    }

    /// The next task: the oldest buffered one whose lease has enough
    /// left, or, when the buffer is empty, the first of a new batch
    /// claimed now (blocking the thread while admission makes it wait, as
    /// [`Store::claim`] does). The errors are the claim's (`403`, `429`,
    /// storage).
    pub fn next(&self) -> Result<WorkerNext, Error> {
        if let Some(claimed) = self.take_buffered() {
            return Ok(WorkerNext::Task(Box::new(claimed)));
        }
        let batch = self.store.claim_batch(
            &self.caller,
            &self.namespace,
            &self.queue,
            self.options.fetch,
        )?;
        Ok(self.refilled(batch))
    }

    /// [`next`](Self::next) for async hosts: a buffered task at once;
    /// otherwise it waits for admission through its `Waker` (no thread
    /// parks), then runs the batch's lease transaction inline, as
    /// [`Store::claim_async`] does (see there for hosts that must not
    /// block a runtime thread at all).
    pub async fn next_async(&self) -> Result<WorkerNext, Error> {
        if let Some(claimed) = self.take_buffered() {
            return Ok(WorkerNext::Task(Box::new(claimed)));
        }
        let permit = self
            .store
            .batch_permit(
                &self.caller,
                &self.namespace,
                &self.queue,
                self.options.fetch,
            )
            .await?;
        let batch = self.store.finish_claim_batch(permit)?;
        Ok(self.refilled(batch))
    }

    /// Submits a handed-out task's output, through the completer, as
    /// [`Store::submit`] does.
    pub fn submit(
        &self,
        claimed: &Claimed,
        key: &IdempotencyKey,
        output: &Output,
    ) -> Result<Submitted, Error> {
        self.store.submit(
            &self.caller,
            &claimed.task,
            claimed.lease.token(),
            key,
            output,
        )
    }

    /// Reports a handed-out task's failure, through the completer, as
    /// [`Store::fail`] does.
    pub fn fail(&self, claimed: &Claimed, failure: impl Into<Failure>) -> Result<TaskState, Error> {
        self.store
            .fail(&self.caller, &claimed.task, claimed.lease.token(), failure)
    }

    /// Extends every buffered lease by the store's lease duration, in one
    /// transaction with one audit row per lease, and returns how many it
    /// extended. A lease that can no longer be extended (cancelled,
    /// lapsed) leaves the buffer. Nothing buffered: nothing written.
    pub fn heartbeat(&self) -> Result<usize, Error> {
        let held: Vec<(TaskRef, FencingToken)> = self
            .buffer
            .lock()
            .iter()
            .map(|claimed| (claimed.task.clone(), claimed.lease.token()))
            .collect();
        if held.is_empty() {
            return Ok(0);
        }
        let answers = self.store.heartbeat_many(&self.caller, &held)?;
        self.stats.lock().heartbeats += 1;
        let mut extended = 0;
        let mut buffer = self.buffer.lock();
        for ((task, token), answer) in held.iter().zip(answers) {
            let place = buffer
                .iter()
                .position(|claimed| claimed.task == *task && claimed.lease.token() == *token);
            // Handed out meanwhile: that thread's lease now.
            let Some(place) = place else { continue };
            match answer {
                Ok(lease) => {
                    buffer[place].lease = lease;
                    extended += 1;
                }
                Err(_) => {
                    buffer.remove(place);
                }
            }
        }
        Ok(extended)
    }

    /// Hands every buffered task back to the queue at once: a failure
    /// report with no backoff each (through the completer, one
    /// transaction), which ends its try as a lapse would, without waiting
    /// for the lease to run out. Returns how many went back.
    pub fn release(&self) -> Result<usize, Error> {
        let held: Vec<Claimed> = self.buffer.lock().drain(..).collect();
        let mut acks = Vec::with_capacity(held.len());
        for claimed in &held {
            let failure = Failure::from(Retry::After(Duration::ZERO));
            if let Ok(ack) = self.store.failure_report(
                &self.caller,
                &claimed.task,
                claimed.lease.token(),
                failure,
            ) {
                acks.push(ack);
            }
        }
        let answers = self.store.acknowledge(acks);
        if let Some(Err(error)) = answers.first() {
            return Err(error.clone());
        }
        Ok(answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Ok(_))))
            .count())
    }

    /// How many tasks wait in the buffer.
    pub fn buffered(&self) -> usize {
        self.buffer.lock().len()
    }

    /// What the worker did so far.
    pub fn stats(&self) -> WorkerStats {
        *self.stats.lock()
    }

    /// The oldest buffered task with enough lease left; those before it
    /// with too little are let go.
    fn take_buffered(&self) -> Option<Claimed> {
        let now = self.store.now_utc();
        let mut buffer = self.buffer.lock();
        while let Some(claimed) = buffer.pop_front() {
            if self.has_time_left(&claimed.lease, now) {
                drop(buffer);
                self.stats.lock().handed_out += 1;
                return Some(claimed);
            }
            self.stats.lock().let_go += 1;
        }
        None
    }

    fn has_time_left(&self, lease: &Lease, now: DateTime<Utc>) -> bool {
        let left = TimeDelta::from_std(self.options.min_lease_left).unwrap_or(TimeDelta::MAX);
        now.checked_add_signed(left)
            .is_some_and(|needed| lease.expires_at() > needed)
    }

    /// The first of a new batch handed out, the rest buffered.
    fn refilled(&self, batch: ClaimedBatch) -> WorkerNext {
        let claimed = batch.claimed;
        {
            let mut stats = self.stats.lock();
            stats.claims += 1;
            stats.claimed += claimed.len() as u64;
        }
        let mut claimed = claimed.into_iter();
        let Some(first) = claimed.next() else {
            return WorkerNext::Empty {
                retry_after: batch.retry_after.unwrap_or_default(),
                reason: batch.reason.unwrap_or_default(),
            };
        };
        self.buffer.lock().extend(claimed);
        self.stats.lock().handed_out += 1;
        WorkerNext::Task(Box::new(first))
    }
}

/// One task of a heartbeat batch, as loaded and as the rules leave it.
struct Held {
    handle: TaskHandle,
    before: TaskRecord,
    rules: Task,
}

impl Store {
    /// Extends many leases `caller` holds at once, as
    /// [`heartbeat`](Self::heartbeat) extends one: one transaction, the
    /// tasks locked at once, one audit row per extended lease. Each
    /// lease's own answer in order (`403`, `404`, `409` as a heartbeat's);
    /// the outer error is the transaction's, which then extended none.
    pub(crate) fn heartbeat_many(
        &self,
        caller: &Caller,
        held: &[(TaskRef, FencingToken)],
    ) -> Result<Vec<Result<Lease, Error>>, Error> {
        let now = self.now_utc();
        let holder = caller.lease_principal();
        let extension = self.config.lease_duration();
        let scopes: Vec<Result<ActionScope, Error>> = held
            .iter()
            .map(|(task, _)| self.admit(caller, &task.namespace, Scope::Claim, Action::Heartbeat))
            .collect();
        let mut refs: Vec<&TaskRef> = held
            .iter()
            .zip(&scopes)
            .filter(|(_, scope)| scope.is_ok())
            .map(|((task, _), _)| task)
            .collect();
        refs.sort_unstable();
        refs.dedup();
        if refs.is_empty() {
            return Ok(scopes
                .into_iter()
                .map(|scope| Err(scope.expect_err("every scope was refused")))
                .collect());
        }
        let result = self.write(|writer| {
            let loaded = writer.lock_tasks(&refs)?;
            let mut tasks: HashMap<&TaskRef, Result<Held, Error>> = HashMap::new();
            for (task, loaded) in refs.iter().zip(loaded) {
                let entry = match loaded {
                    None => Err(not_found(task)),
                    Some(loaded) => Task::restore(loaded.record.clone())
                        .map(|rules| Held {
                            handle: loaded.handle,
                            before: loaded.record,
                            rules,
                        })
                        .map_err(Error::from),
                };
                tasks.insert(task, entry);
            }
            let mut answers = Vec::with_capacity(held.len());
            let mut events = Vec::new();
            for ((task, token), scope) in held.iter().zip(&scopes) {
                let scope = match scope {
                    Ok(scope) => scope,
                    Err(error) => {
                        answers.push(Err(error.clone()));
                        continue;
                    }
                };
                let answer = match tasks.get_mut(task) {
                    Some(Ok(loaded)) => loaded
                        .rules
                        .heartbeat(&holder, *token, now, extension)
                        .map_err(Error::from),
                    Some(Err(error)) => Err(error.clone()),
                    None => unreachable!("every admitted reference was looked up"),
                };
                if let Ok(lease) = &answer {
                    events.push(
                        scope.event(now, task.grant_resource(lease.attempt(), lease.token())),
                    );
                }
                answers.push(answer);
            }
            let changes: Vec<TaskChange<'_>> = tasks
                .values()
                .filter_map(|task| task.as_ref().ok())
                .filter(|task| task.before != *task.rules.record())
                .map(|task| TaskChange {
                    handle: task.handle,
                    before: &task.before,
                    after: task.rules.record(),
                    at: now,
                })
                .collect();
            writer.write_acknowledged(&changes, &[], &events)?;
            Ok(answers)
        });
        match result {
            Ok(answers) => {
                let mut wrote = false;
                for (answer, scope) in answers.iter().zip(&scopes) {
                    match (answer, scope) {
                        (Ok(_), _) => wrote = true,
                        (Err(error), Ok(scope)) => self.count(scope, error.outcome()),
                        // Counted when it was refused.
                        (Err(_), Err(_)) => {}
                    }
                }
                if wrote {
                    let mut changed: Vec<&Namespace> = refs.iter().map(|t| &t.namespace).collect();
                    changed.dedup();
                    for namespace in changed {
                        self.namespace_changed(namespace);
                    }
                    self.after_write();
                }
                Ok(answers)
            }
            Err(error) => {
                for scope in scopes.iter().flatten() {
                    self.count(scope, error.outcome());
                }
                Err(error)
            }
        }
    }
}
