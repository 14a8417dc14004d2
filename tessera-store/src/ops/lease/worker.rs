//! The worker loop: claims ahead in batches, holds a small buffer that
//! each submission tops up with a claim it carries, heartbeats what it
//! holds at once, and acknowledges through the completer.

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use tessera_lease::{
    Failure, FencingToken, IdempotencyKey, Lease, Namespace, QueueName, Retry, Submitted, TaskState,
};

use crate::error::Error;
use crate::model::access::Caller;
use crate::model::ack::{Ack, AckAnswer, Acked};
use crate::model::claim::{ClaimOutcome, Claimed, ClaimedBatch, EmptyReason, MAX_CLAIM_BATCH};
use crate::model::task::{Output, SubmitRequest, TaskRef};
use crate::ops::lease::complete::Checked;
use crate::store::Store;

/// How a [`Worker`] claims ahead and when it lets a buffered task go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerOptions {
    /// The most tasks one refill claims (one
    /// [`claim_batch`](Store::claim_batch), one admission offer), 1 to
    /// [`MAX_CLAIM_BATCH`]. A refill claims what the buffer has room for
    /// beside the claims submissions carry, and a submission carries one
    /// only while the buffer has room; threads whose `next` each find the
    /// buffer empty each refill. Default 10.
    pub fetch: usize,
    /// A buffered task is handed out only while its lease has at least
    /// this long left, or half its lease's length if that is less (a task
    /// with a short lease of its own,
    /// [`EnqueueOptions::with_lease_duration`](crate::EnqueueOptions::with_lease_duration));
    /// one with less is let go (its lease lapses and the task comes back
    /// to the queue). `min_lease_left_ms` in serde. Default 10 seconds;
    /// below the store's lease duration.
    #[serde(rename = "min_lease_left_ms", with = "crate::model::millis")]
    pub min_lease_left: Duration,
    /// How long the worker holds an acknowledgement made with
    /// [`submit_later`](Worker::submit_later) or
    /// [`fail_later`](Worker::fail_later) before the next call of
    /// [`next`](Worker::next) commits it (see [`Worker`], "Held
    /// acknowledgements"). `max_hold_ms` in serde. Default 50
    /// milliseconds; below `min_lease_left`.
    #[serde(
        rename = "max_hold_ms",
        with = "crate::model::millis",
        default = "default_max_hold"
    )]
    pub max_hold: Duration,
}

fn default_max_hold() -> Duration {
    Duration::from_millis(50)
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            fetch: 10,
            min_lease_left: Duration::from_secs(10),
            max_hold: default_max_hold(),
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

    /// Holds a later acknowledgement for at most `hold` before the next
    /// call of [`next`](Worker::next) commits it.
    #[must_use]
    pub fn with_max_hold(mut self, hold: Duration) -> Self {
        self.max_hold = hold;
        self
    }
}

/// What [`Worker::next`] came to.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerNext {
    /// A task to work on, its lease live for at least the worker's
    /// [`min_lease_left`](WorkerOptions::min_lease_left), or half its
    /// lease's length if that is less.
    Task(Box<Claimed>),
    /// Nothing claimable: the buffer is empty and the claim found nothing
    /// to take. Ask again after `retry_after` (the claim's `Retry-After`,
    /// or the time left of it for the answer of a claim a submission
    /// carried); `retry_after_ms` in serde.
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
    /// Acknowledgements held by [`submit_later`](Worker::submit_later)
    /// and [`fail_later`](Worker::fail_later).
    #[serde(default)]
    pub held: u64,
    /// Flushes of held acknowledgements, each one transaction of the
    /// completer's.
    #[serde(default)]
    pub flushes: u64,
    /// Claims carried by a [`submit`](Worker::submit) (counted in
    /// `claims` too), each in the submission's transaction.
    #[serde(default)]
    pub carried: u64,
}

/// A worker loop for one principal and one queue: it claims ahead in
/// batches, keeps the leases it has not handed out yet in a small local
/// buffer, heartbeats the buffer's leases at once, and acknowledges
/// through the store's completer.
///
/// Share it between threads (it is `Send + Sync` when its store handle
/// is, as `Arc<Store>` and `&Store` are), with an `Arc` or a scope: each
/// thread calls [`next`](Self::next), works, and calls
/// [`submit`](Self::submit) or [`fail`](Self::fail); the acknowledgements
/// threads make at the same moment are coalesced into one transaction
/// ([`AckBatching`](crate::AckBatching)), and a submission carries the
/// next claim while the buffer has room (see [`submit`](Self::submit)). An async host awaits
/// [`next_async`](Self::next_async), which waits for admission through its
/// `Waker` as [`Store::claim_async`] does.
///
/// # Admission
///
/// A refill is one [`claim_batch`](Store::claim_batch): one offer to
/// admission, holding one unit of capacity for its lease transaction,
/// whatever its size. A claim a submission carries (see
/// [`submit`](Self::submit)) is one offer too, made only if admission
/// takes it at once. Admission shares the store's time between
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
/// task's own lease length or else the store's in one transaction; a host calls it about once
/// per third of the lease while tasks wait in the buffer (the leases of
/// tasks handed out are the worker thread's to extend, with
/// [`Store::heartbeat`]). [`next`](Self::next) never hands out a task
/// whose lease has less than
/// [`min_lease_left`](WorkerOptions::min_lease_left) left: it lets it go
/// (counted in [`WorkerStats::let_go`]) and its lease lapses, so the task
/// comes back to the queue under the lease rules (the lapse ends that
/// try, as any lapse does). [`release`](Self::release) hands the whole
/// buffer back at once (a snooze of zero each, which gives the try back,
/// since those tasks never ran), for a worker that stops.
///
/// # Held acknowledgements
///
/// [`submit`](Self::submit) and [`fail`](Self::fail) wait for their
/// commit, so the completer's transactions carry at most one
/// acknowledgement per thread. [`submit_later`](Self::submit_later) and
/// [`fail_later`](Self::fail_later) check theirs at once and hand back a
/// [`PendingAck`]; the worker holds them and commits them together, in one
/// transaction through the completer, when `fetch` are held, when a
/// thread's [`next`](Self::next) finds the buffer empty (before the
/// refill's claim) or the oldest held for
/// [`max_hold`](WorkerOptions::max_hold), at [`flush`](Self::flush),
/// [`release`](Self::release) and [`answer`](Self::answer) of one still
/// held, and when the worker drops. Each gets its own answer, and only
/// after that commit. A held acknowledgement is not made: if the process
/// ends first, its lease lapses and the task comes back under the lease
/// rules, as if the work had not been done. Its lease must still be live
/// when it commits (a stale token is a `409` then), which `max_hold`
/// below `min_lease_left` leaves time for as long as the threads keep
/// calling `next`.
///
/// ```
/// # use tessera_store::{Brief, EnqueueOptions, Grant, KeySpec, Namespace, QueueName, Scope};
/// # use std::sync::Arc;
/// use tessera_store::{IdempotencyKey, ManualClock, Output, Store, StoreConfig, Submitted};
/// use tessera_store::{Worker, WorkerNext, WorkerOptions};
///
/// // A clock that stands still: no acknowledgement is held past `max_hold`.
/// let clock = Arc::new(ManualClock::new("2026-12-06T12:00:00Z".parse()?));
/// let store = Store::open_in_memory(StoreConfig::default().with_clock(clock))?;
/// # let admin_key = store.create_admin_key("operators")?;
/// # let admin = store.authenticate(Some(admin_key.secret.expose()))?;
/// # let (ns, queue) = (Namespace::parse("renders")?, QueueName::parse("frames")?);
/// # let key = store.create_key(&admin, &KeySpec::keyed("acme")
/// #     .with_scopes([Scope::Enqueue, Scope::Claim])
/// #     .with_grant(Grant::Namespace(ns.clone())))?;
/// # let caller = store.authenticate(Some(key.secret.expose()))?;
/// # for frame in 0..3 {
/// #     store.enqueue(&caller, &ns, &queue, &Brief::Bytes(vec![frame]), &EnqueueOptions::default())?;
/// # }
/// // Three tasks wait in `queue`.
/// let worker = Worker::new(&store, caller, ns, queue, WorkerOptions::default())?;
/// let done = IdempotencyKey::parse("done")?;
/// let mut pending = Vec::new();
/// while let WorkerNext::Task(claimed) = worker.next()? {
///     pending.push(worker.submit_later(&claimed, &done, &Output::bytes("ok"))?);
/// }
/// // The `next` that found the queue empty committed all three at once.
/// assert_eq!((worker.stats().held, worker.stats().flushes), (3, 1));
/// for answer in pending {
///     assert!(matches!(worker.answer(answer)?, Submitted::Accepted(_)));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    buffer: Mutex<Buffer>,
    held: Mutex<HeldAcks>,
    stats: Mutex<WorkerStats>,
}

/// The tasks a [`Worker`] leased and has not handed out, and what it
/// knows about claiming more.
#[derive(Debug, Default)]
struct Buffer {
    /// In the order they were leased.
    tasks: VecDeque<Claimed>,
    /// Claims submissions carry, under way: a submission carries one
    /// only while `tasks.len() + carrying` is below `fetch`.
    carrying: usize,
    /// Set by [`Worker::release`], cleared by the next
    /// [`Worker::next`]: a worker handing its tasks back carries no claim.
    released: bool,
    /// What a carried claim answered when it found the queue empty or
    /// paused, and until when its `Retry-After` holds.
    found_empty: Option<(DateTime<Utc>, EmptyReason)>,
}

impl Buffer {
    /// Adds `claimed` after every task leased no later than it.
    fn insert(&mut self, claimed: Claimed) {
        let at = claimed.lease.granted_at();
        let place = self
            .tasks
            .iter()
            .rposition(|other| other.lease.granted_at() <= at)
            .map_or(0, |place| place + 1);
        self.tasks.insert(place, claimed);
    }
}

/// The acknowledgements a [`Worker`] holds, oldest first, and where each
/// one's answer goes.
#[derive(Debug, Default)]
struct HeldAcks {
    acks: Vec<Ack>,
    slots: Vec<Arc<Slot>>,
    /// When the oldest was held.
    since: Option<DateTime<Utc>>,
}

/// Where one held acknowledgement's answer arrives.
#[derive(Debug, Default)]
struct Slot {
    answer: Mutex<Option<AckAnswer>>,
    answered: Condvar,
}

impl Slot {
    fn answered(answer: AckAnswer) -> Arc<Self> {
        Arc::new(Self {
            answer: Mutex::new(Some(answer)),
            answered: Condvar::new(),
        })
    }

    fn fill(&self, answer: AckAnswer) {
        *self.answer.lock() = Some(answer);
        self.answered.notify_all();
    }
}

/// A submission or failure report a [`Worker`] holds, to be committed
/// with others in one transaction: its answer, a [`Submitted`] or the
/// attempt's [`TaskState`], comes from [`Worker::answer`] once that
/// transaction committed. Dropping it gives up on the answer, not the
/// acknowledgement.
#[derive(Debug)]
#[must_use = "the answer says whether the acknowledgement was accepted"]
pub struct PendingAck<T> {
    slot: Arc<Slot>,
    answer: fn(Acked) -> T,
}

impl<T> PendingAck<T> {
    /// The answer if the acknowledgement's transaction is over, as
    /// [`Worker::answer`] gives it; the pending acknowledgement back if it
    /// is still held or committing. For answers read after the worker
    /// dropped (its drop commits what it held).
    pub fn try_answer(self) -> Result<Result<T, Error>, Self> {
        let answer = self.slot.answer.lock().take();
        match answer {
            Some(answer) => Ok(answer.and_then(|answer| answer.map(self.answer))),
            None => Err(self),
        }
    }
}

/// A submission's answer as the completer gives it.
fn submitted(acked: Acked) -> Submitted {
    match acked {
        Acked::Submitted(submitted) => submitted,
        Acked::Failed(_) => unreachable!("a submission is answered as one"),
    }
}

/// A failure report's answer as the completer gives it.
fn failed(acked: Acked) -> TaskState {
    match acked {
        Acked::Failed(state) => state,
        Acked::Submitted(_) => unreachable!("a failure report is answered as one"),
    }
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
        if options.max_hold >= options.min_lease_left {
            return Err(Error::InvalidInput {
                reason: "a worker's max_hold must be below its min_lease_left".to_owned(),
            });
        }
        Ok(Self {
            store,
            caller,
            namespace,
            queue,
            options,
            buffer: Mutex::new(Buffer::default()),
            held: Mutex::new(HeldAcks::default()),
            stats: Mutex::new(WorkerStats::default()),
        })
    }

    /// The next task: the oldest buffered one whose lease has enough
    /// left, or, when the buffer is empty, the first of a new batch
    /// claimed now (blocking the thread while admission makes it wait, as
    /// [`Store::claim`] does), of as many tasks as the buffer has room
    /// for beside the claims submissions carry meanwhile. While a carried
    /// claim's empty answer holds (see [`submit`](Self::submit)), an
    /// empty buffer answers it instead of claiming. Held acknowledgements commit first when
    /// the buffer is empty or the oldest is due (see "Held
    /// acknowledgements"). The errors are the claim's (`403`, `429`,
    /// storage).
    pub fn next(&self) -> Result<WorkerNext, Error> {
        let count = match self.next_step() {
            NextStep::Answer(answer) => return Ok(answer),
            NextStep::Claim(count) => count,
        };
        let batch = self
            .store
            .claim_batch(&self.caller, &self.namespace, &self.queue, count)?;
        Ok(self.refilled(batch))
    }

    /// [`next`](Self::next) for async hosts: a buffered task at once;
    /// otherwise it waits for admission through its `Waker` (no thread
    /// parks), then runs the batch's lease transaction inline, as
    /// [`Store::claim_async`] does (see there for hosts that must not
    /// block a runtime thread at all).
    pub async fn next_async(&self) -> Result<WorkerNext, Error> {
        let count = match self.next_step() {
            NextStep::Answer(answer) => return Ok(answer),
            NextStep::Claim(count) => count,
        };
        let permit = self
            .store
            .batch_permit(&self.caller, &self.namespace, &self.queue, count)
            .await?;
        let batch = self.store.finish_claim_batch(permit)?;
        Ok(self.refilled(batch))
    }

    /// Submits a handed-out task's output, through the completer, as
    /// [`Store::submit`] does, with the same answers.
    ///
    /// On PostgreSQL, while the buffer holds fewer than `fetch` tasks,
    /// the submission carries the next claim, as
    /// [`Store::submit_and_claim`] does (one transaction for both, and
    /// one statement for the submissions several threads carry at once),
    /// if admission takes that claim at once: the task it leases joins
    /// the buffer. On SQLite a commit costs no round trip and the writer
    /// takes one transaction at a time, so a submission carries none: a
    /// refill of `fetch` costs less than as many carried claims. A claim admission would make wait
    /// is not carried; the submission commits alone, without waiting.
    /// Once a carried claim finds the queue empty (or paused, or at its
    /// limit), submissions carry none, and the [`next`](Self::next) that
    /// finds the buffer empty answers that claim's
    /// [`WorkerNext::Empty`] rather than asking again.
    pub fn submit(
        &self,
        claimed: &Claimed,
        key: &IdempotencyKey,
        output: &Output,
    ) -> Result<Submitted, Error> {
        let Some(reserved) = self.reserve_carried() else {
            return self.store.submit(
                &self.caller,
                &claimed.task,
                claimed.lease.token(),
                key,
                output,
            );
        };
        let request = SubmitRequest {
            task: claimed.task.clone(),
            token: claimed.lease.token(),
            key: key.clone(),
            output: output.clone(),
        };
        let (submitted, carried) = self.store.submit_carrying(
            &self.caller,
            &request,
            &self.namespace,
            &self.queue,
            false,
        )?;
        let Some(Ok(outcome)) = carried else {
            // Not carried, or the claim's own error (`429`, `403`): the
            // next claim meets it; nothing to hand out.
            return Ok(submitted);
        };
        {
            let mut stats = self.stats.lock();
            stats.claims += 1;
            stats.carried += 1;
            stats.claimed += u64::from(matches!(outcome, ClaimOutcome::Granted(_)));
        }
        match outcome {
            ClaimOutcome::Granted(next) => {
                let unwanted = reserved.fill(vec![next]);
                // Released meanwhile: handed back at once, as the rest was.
                if !unwanted.is_empty() {
                    let _ = self.hand_back(&unwanted);
                }
            }
            ClaimOutcome::Empty {
                retry_after,
                reason,
                ..
            } => reserved.found_empty(self.store.now_utc(), retry_after, reason),
        }
        Ok(submitted)
    }

    /// Reports a handed-out task's failure, through the completer, as
    /// [`Store::fail`] does.
    pub fn fail(&self, claimed: &Claimed, failure: impl Into<Failure>) -> Result<TaskState, Error> {
        self.store
            .fail(&self.caller, &claimed.task, claimed.lease.token(), failure)
    }

    /// Submits a handed-out task's output without waiting for the
    /// commit: the submission is checked now (`403`, an output too large)
    /// and held with the worker's other later acknowledgements, which
    /// commit together, through the completer, in one transaction (see
    /// [`Worker`], "Held acknowledgements"). [`answer`](Self::answer)
    /// gives what [`submit`](Self::submit) would have: the receipt, a
    /// replay, `409` for a stale token or a conflicting key.
    pub fn submit_later(
        &self,
        claimed: &Claimed,
        key: &IdempotencyKey,
        output: &Output,
    ) -> Result<PendingAck<Submitted>, Error> {
        let request = SubmitRequest {
            task: claimed.task.clone(),
            token: claimed.lease.token(),
            key: key.clone(),
            output: output.clone(),
        };
        match self.store.submission(&self.caller, &request)? {
            Checked::Ack(ack) => Ok(self.hold(ack, submitted)),
            Checked::Answered(answer) => Ok(PendingAck {
                slot: Slot::answered(Ok(Ok(Acked::Submitted(answer)))),
                answer: submitted,
            }),
        }
    }

    /// Reports a handed-out task's failure without waiting for the
    /// commit, held as [`submit_later`](Self::submit_later) holds a
    /// submission; [`answer`](Self::answer) gives the attempt's new state
    /// or what [`fail`](Self::fail) would have refused.
    pub fn fail_later(
        &self,
        claimed: &Claimed,
        failure: impl Into<Failure>,
    ) -> Result<PendingAck<TaskState>, Error> {
        let ack = self.store.failure_report(
            &self.caller,
            &claimed.task,
            claimed.lease.token(),
            failure.into(),
        )?;
        Ok(self.hold(ack, failed))
    }

    /// The answer to a held acknowledgement, once its transaction
    /// committed: at once if it has, after committing the worker's held
    /// acknowledgements if it is still held, or after the thread
    /// committing it is done. The error of a failed commit is every
    /// acknowledgement's of that transaction, none of them made.
    pub fn answer<T>(&self, pending: PendingAck<T>) -> Result<T, Error> {
        let slot = &pending.slot;
        if slot.answer.lock().is_none() {
            self.flush();
        }
        let mut answer = slot.answer.lock();
        while answer.is_none() {
            // Another thread took it into its flush and answers it when
            // that commits.
            slot.answered.wait(&mut answer);
        }
        let answer = answer.take().expect("answered");
        Ok((pending.answer)(answer??))
    }

    /// Commits every held acknowledgement now, in one transaction
    /// through the completer, and answers them; returns how many. A
    /// failed commit is each one's answer, as [`answer`](Self::answer)
    /// gives it.
    pub fn flush(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock());
        if held.acks.is_empty() {
            return 0;
        }
        let count = held.acks.len();
        let answers = self.store.acknowledge(held.acks);
        for (slot, answer) in held.slots.iter().zip(answers) {
            slot.fill(answer);
        }
        self.stats.lock().flushes += 1;
        count
    }

    /// How many acknowledgements the worker holds.
    pub fn held(&self) -> usize {
        self.held.lock().acks.len()
    }

    /// Holds `ack`, and commits what is held once `fetch` are.
    fn hold<T>(&self, ack: Ack, answer: fn(Acked) -> T) -> PendingAck<T> {
        let slot = Arc::new(Slot::default());
        let full = {
            let mut held = self.held.lock();
            held.acks.push(ack);
            held.slots.push(Arc::clone(&slot));
            held.since.get_or_insert_with(|| self.store.now_utc());
            held.acks.len() >= self.options.fetch
        };
        self.stats.lock().held += 1;
        if full {
            self.flush();
        }
        PendingAck { slot, answer }
    }

    /// Commits the held acknowledgements if the oldest was held
    /// `max_hold` ago.
    fn flush_if_due(&self) {
        let since = self.held.lock().since;
        let Some(since) = since else { return };
        let hold = TimeDelta::from_std(self.options.max_hold).unwrap_or(TimeDelta::MAX);
        if since
            .checked_add_signed(hold)
            .is_none_or(|due| self.store.now_utc() >= due)
        {
            self.flush();
        }
    }

    /// Extends every buffered lease by its task's own lease length or else
    /// the store's (never past a task's deadline), in one
    /// transaction with one audit row per lease, and returns how many it
    /// extended. A lease that can no longer be extended (cancelled,
    /// lapsed) leaves the buffer. Nothing buffered: nothing written.
    pub fn heartbeat(&self) -> Result<usize, Error> {
        let held: Vec<(TaskRef, FencingToken)> = self
            .buffer
            .lock()
            .tasks
            .iter()
            .map(|claimed| (claimed.task.clone(), claimed.lease.token()))
            .collect();
        if held.is_empty() {
            return Ok(0);
        }
        let answers = self.store.heartbeat_many(&self.caller, &held)?;
        self.stats.lock().heartbeats += 1;
        let mut extended = 0;
        let mut guard = self.buffer.lock();
        let buffer = &mut guard.tasks;
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

    /// Hands every buffered task back to the queue at once, claimable at
    /// once and with the try its lease took given back, since it never
    /// ran: a [`Retry::Snooze`] of zero each, through the completer in one
    /// transaction, without waiting for the leases to run out. A task on
    /// its last try goes back as any other. Returns how many went back.
    pub fn release(&self) -> Result<usize, Error> {
        self.flush();
        let held: Vec<Claimed> = {
            let mut buffer = self.buffer.lock();
            buffer.released = true;
            buffer.tasks.drain(..).collect()
        };
        self.hand_back(&held)
    }

    /// Hands `held` back to the queue in one transaction, each a snooze
    /// of zero; how many went back.
    fn hand_back(&self, held: &[Claimed]) -> Result<usize, Error> {
        let mut acks = Vec::with_capacity(held.len());
        for claimed in held {
            let failure = Failure::from(Retry::Snooze(Duration::ZERO));
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
        self.buffer.lock().tasks.len()
    }

    /// What the worker did so far.
    pub fn stats(&self) -> WorkerStats {
        *self.stats.lock()
    }

    /// [`take_buffered`](Self::take_buffered), with the held
    /// acknowledgements committed first if due, and after it if the
    /// buffer is empty (before the refill's claim).
    fn buffered_or_flush(&self) -> Option<Claimed> {
        self.flush_if_due();
        let claimed = self.take_buffered();
        if claimed.is_none() {
            self.flush();
        }
        claimed
    }

    /// What [`next`](Self::next) does once no buffered task is left: it
    /// answers a carried claim's empty answer while that holds, or claims
    /// as many tasks as the buffer has room for beside the claims
    /// submissions carry (at least one).
    fn next_step(&self) -> NextStep {
        if let Some(claimed) = self.buffered_or_flush() {
            return NextStep::Answer(WorkerNext::Task(Box::new(claimed)));
        }
        let mut buffer = self.buffer.lock();
        buffer.released = false;
        if let Some((retry_after, reason)) = self.empty_in_force(&mut buffer) {
            buffer.found_empty = None;
            return NextStep::Answer(WorkerNext::Empty {
                retry_after,
                reason,
            });
        }
        let count = self
            .options
            .fetch
            .saturating_sub(buffer.tasks.len() + buffer.carrying)
            .max(1);
        NextStep::Claim(count)
    }

    /// A place reserved for a claim a submission carries, if it should
    /// carry one: the store is a server's (a commit is a round trip), the
    /// buffer has room, the worker is not handing its
    /// tasks back, and no carried claim's empty answer holds.
    fn reserve_carried(&self) -> Option<Reserved<'_>> {
        let mut buffer = self.buffer.lock();
        let room = buffer.tasks.len() + buffer.carrying < self.options.fetch;
        if !self.store.backend().capabilities().round_trips
            || !room
            || buffer.released
            || self.empty_in_force(&mut buffer).is_some()
        {
            return None;
        }
        buffer.carrying += 1;
        Some(Reserved {
            buffer: &self.buffer,
            count: 1,
        })
    }

    /// The time left of a carried claim's empty answer, and its reason,
    /// while it holds: before its `Retry-After` ends, and while the store
    /// still counts this key's last claim of the queue as finding it
    /// empty (no enqueue to it, no grant to the key since). Forgotten once
    /// it no longer holds.
    fn empty_in_force(&self, buffer: &mut Buffer) -> Option<(Duration, EmptyReason)> {
        let (until, reason) = buffer.found_empty?;
        let left = (until - self.store.now_utc())
            .to_std()
            .unwrap_or(Duration::ZERO);
        let key = (self.namespace.clone(), self.queue.clone());
        if left.is_zero() || !self.store.gate.found_empty(&self.caller.principal(), &key) {
            buffer.found_empty = None;
            return None;
        }
        Some((left, reason))
    }

    /// The oldest buffered task with enough lease left; those before it
    /// with too little are let go.
    fn take_buffered(&self) -> Option<Claimed> {
        let now = self.store.now_utc();
        let mut buffer = self.buffer.lock();
        while let Some(claimed) = buffer.tasks.pop_front() {
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
        let left = TimeDelta::from_std(self.options.min_lease_left)
            .unwrap_or(TimeDelta::MAX)
            .min((lease.expires_at() - lease.granted_at()) / 2);
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
        // A release meanwhile does not stop this `next`: its host asked
        // for a task, and the rest of the batch is buffered.
        let mut buffer = self.buffer.lock();
        for claimed in claimed {
            buffer.insert(claimed);
        }
        drop(buffer);
        self.stats.lock().handed_out += 1;
        WorkerNext::Task(Box::new(first))
    }
}

/// What [`Worker::next`] does next.
enum NextStep {
    /// Answers at once.
    Answer(WorkerNext),
    /// Claims this many tasks.
    Claim(usize),
}

/// A place in a worker's buffer for a claim a submission carries, given
/// back when it is dropped (a claim that failed) or filled.
struct Reserved<'b> {
    buffer: &'b Mutex<Buffer>,
    count: usize,
}

impl Reserved<'_> {
    /// Buffers what the claim leased, in place of the reservation; what
    /// it could not buffer because the worker was released meanwhile
    /// comes back, to be handed back.
    fn fill(mut self, claimed: Vec<Claimed>) -> Vec<Claimed> {
        let mut buffer = self.buffer.lock();
        buffer.carrying -= std::mem::take(&mut self.count);
        if buffer.released {
            return claimed;
        }
        for claimed in claimed {
            buffer.insert(claimed);
        }
        Vec::new()
    }

    /// Gives the reservation back, keeping a carried claim's answer
    /// that the queue was empty or paused, made at `now`, until its
    /// `retry_after` ends. A queue at its limit is not kept: this
    /// worker's own acknowledgements free its slots.
    fn found_empty(mut self, now: DateTime<Utc>, retry_after: Duration, reason: EmptyReason) {
        let mut buffer = self.buffer.lock();
        buffer.carrying -= std::mem::take(&mut self.count);
        if reason != EmptyReason::Limited {
            let until = now
                .checked_add_signed(TimeDelta::from_std(retry_after).unwrap_or(TimeDelta::MAX))
                .unwrap_or(DateTime::<Utc>::MAX_UTC);
            buffer.found_empty = Some((until, reason));
        }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.count > 0 {
            self.buffer.lock().carrying -= self.count;
        }
    }
}

impl<S: Deref<Target = Store>> Drop for Worker<S> {
    /// Commits what the worker still holds, as a `BufWriter` writes what
    /// it buffers when dropped; the answers go to their [`PendingAck`]s.
    fn drop(&mut self) {
        self.flush();
    }
}
