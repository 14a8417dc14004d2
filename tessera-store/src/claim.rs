//! Claims: admission first, then one lease transaction.
//!
//! Only new claims enter [`Admission`]. The store keeps one controller, its
//! idle pacing and the outcomes of waiting claims behind one
//! `parking_lot::Mutex` ([`Gate`]); threads that wait park on its condvar,
//! async hosts pull the same outcomes as [`ClaimEvent`]s. Every
//! [`ClaimPermit`] releases its capacity when it is dropped, so no path
//! (an error, a panic, a client that left) leaks a unit of capacity.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use tessera_admission::{
    Admission, AdmissionConfig, Event, IdleConfig, IdlePacing, Offer, Permit, Rejection, Stats,
    Ticket,
};
use tessera_audit::{Action, Outcome};
use tessera_lease::{Lease, Namespace, QueueName};

use crate::access::{Caller, PrincipalId, PrincipalKind, Scope};
use crate::audit::{ActionScope, Trail};
use crate::clock::Clock;
use crate::db::Reader;
use crate::error::Error;
use crate::sql::millis;
use crate::sql::tasks::{self as sql, TaskRow};
use crate::store::Store;
use crate::task::{Brief, TaskRef, apply, load, resync};

/// A queue, as idle pacing and long-polls key it.
pub(crate) type QueueKey = (Namespace, QueueName);

/// Called when an outcome for a claim begun with [`Store::begin_claim`] is
/// ready to pull with [`Store::poll_claim_event`] (see
/// [`Store::set_claim_waker`]). It runs on whichever thread produced the
/// outcome, outside the store's locks; it should only wake the host's
/// driver (e.g. `tokio::sync::Notify::notify_one`).
pub type ClaimWaker = Arc<dyn Fn() + Send + Sync>;

/// How often the lease transaction skips a task whose stored claim times
/// turned out stale before it reports the queue empty.
const MAX_PICKS: usize = 4;

/// A claim granted a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claimed {
    /// The task.
    pub task: TaskRef,
    /// The queue it came from.
    pub queue: QueueName,
    /// The lease: attempt, fencing token, holder, expiry and the
    /// [`artifact`](Lease::artifact) key the output goes under.
    pub lease: Lease,
    /// The task's input.
    pub brief: Brief,
    /// How long the claim waited for admission (`X-Claim-Wait-Ms`).
    pub waited: Duration,
    /// The admission limit when the claim finished (`X-Claim-Concurrency`).
    pub concurrency_limit: u32,
}

/// What a claim came to.
#[must_use]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum ClaimOutcome {
    /// A lease on the oldest claimable task (`200`).
    Granted(Claimed),
    /// The queue had nothing claimable (`204`): counted, not audited, and
    /// nothing written.
    Empty {
        /// The idle-pacing hint (`Retry-After`): 5, 10, 20, 40, then 60 s
        /// while this key keeps finding this queue empty.
        retry_after: Duration,
        /// How long the claim waited for admission.
        waited: Duration,
        /// The admission limit when the claim finished.
        concurrency_limit: u32,
    },
}

impl ClaimOutcome {
    /// The lease, if one was granted.
    pub fn claimed(&self) -> Option<&Claimed> {
        match self {
            Self::Granted(claimed) => Some(claimed),
            Self::Empty { .. } => None,
        }
    }

    /// How long the claim waited for admission.
    pub fn waited(&self) -> Duration {
        match self {
            Self::Granted(claimed) => claimed.waited,
            Self::Empty { waited, .. } => *waited,
        }
    }

    /// The `X-Claim-Wait-Ms` header value.
    pub fn wait_ms(&self) -> u64 {
        u64::try_from(self.waited().as_millis()).unwrap_or(u64::MAX)
    }

    /// The `X-Claim-Concurrency` header value.
    pub fn concurrency_limit(&self) -> u32 {
        match self {
            Self::Granted(claimed) => claimed.concurrency_limit,
            Self::Empty {
                concurrency_limit, ..
            } => *concurrency_limit,
        }
    }

    /// The `Retry-After` of an empty claim.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Granted(_) => None,
            Self::Empty { retry_after, .. } => Some(*retry_after),
        }
    }
}

/// How [`Store::begin_claim`] started a claim.
#[derive(Debug)]
#[must_use]
pub enum ClaimStart {
    /// Admitted at once: run it with [`Store::finish_claim`].
    Admitted(ClaimPermit),
    /// Waiting its turn; its [`ClaimEvent`] comes from
    /// [`Store::poll_claim_event`].
    Queued(Ticket),
}

/// The end of a waiting claim, pulled with [`Store::poll_claim_event`].
#[derive(Debug)]
#[must_use]
pub enum ClaimEvent {
    /// Its turn came: run it with [`Store::finish_claim`].
    Granted {
        /// The claim.
        ticket: Ticket,
        /// Its capacity; released by `finish_claim` or when dropped.
        permit: ClaimPermit,
    },
    /// It was turned away: `429 rate_limited` (the wait limit passed, or
    /// it gave up its slot to a principal below its fair share).
    Rejected {
        /// The claim.
        ticket: Ticket,
        /// The `429`, with its `Retry-After` and reason.
        error: Error,
    },
}

impl ClaimEvent {
    /// The claim this event ends.
    pub fn ticket(&self) -> Ticket {
        match self {
            Self::Granted { ticket, .. } | Self::Rejected { ticket, .. } => *ticket,
        }
    }
}

/// Who claims where.
#[derive(Debug, Clone)]
struct ClaimRequest {
    caller: Caller,
    namespace: Namespace,
    queue: QueueName,
}

/// One admitted unit of claim capacity, for one claim.
///
/// Pass it to [`Store::finish_claim`]. Dropped instead (an error, a panic,
/// a client that left), it hands its capacity back to admission, which may
/// grant the next waiting claim. It is not `Clone`.
#[must_use = "a claim permit holds admission capacity until it is finished or dropped"]
pub struct ClaimPermit {
    permit: Option<Permit>,
    shared: Arc<GateShared>,
    request: Arc<ClaimRequest>,
    /// `None` when admitted at once; how long it waited otherwise.
    waited: Option<Duration>,
}

impl ClaimPermit {
    /// The caller the claim was begun for.
    pub fn caller(&self) -> &Caller {
        &self.request.caller
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.request.namespace
    }

    /// The queue.
    pub fn queue(&self) -> &QueueName {
        &self.request.queue
    }

    /// How long the claim waited for admission (zero if admitted at once).
    pub fn waited(&self) -> Duration {
        self.waited.unwrap_or_default()
    }
}

impl fmt::Debug for ClaimPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimPermit")
            .field("principal", &self.request.caller.principal())
            .field("namespace", &self.request.namespace)
            .field("queue", &self.request.queue)
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

impl Drop for ClaimPermit {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.shared.release(permit, |_, _| {});
        }
    }
}

/// Lets a thread blocked in [`Store::claim_cancellable`] give up its place.
///
/// Made by [`Store::cancel_token`]; clones share one flag. Cancelling wakes
/// the blocked claim, which withdraws from the queue (or hands back a grant
/// that raced the cancellation) and returns [`Error::Cancelled`].
#[derive(Clone)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    shared: Arc<GateShared>,
}

impl CancelToken {
    /// Cancels every claim waiting with this token, now and later.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // Taken so a claim between its check and its park cannot miss it.
        let _state = self.shared.state.lock();
        self.shared.changed.notify_all();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// The outcome of a waiting claim, decided but not yet picked up.
enum Decided {
    Granted {
        permit: Permit,
        waited: Duration,
        request: Arc<ClaimRequest>,
    },
    Rejected {
        rejection: Rejection,
        request: Arc<ClaimRequest>,
    },
}

struct Waiter {
    request: Arc<ClaimRequest>,
    /// Whether a thread is parked for it (else an async host pulls it).
    blocking: bool,
}

/// What the gate's mutex guards.
struct GateState {
    admission: Admission<PrincipalId>,
    idle: IdlePacing<PrincipalId, QueueKey>,
    /// Claims waiting in admission, by ticket.
    waiting: HashMap<Ticket, Waiter>,
    /// Outcomes decided and not yet picked up, by ticket.
    decided: HashMap<Ticket, Decided>,
    /// Async claims' outcomes in the order they were decided; a ticket
    /// whose outcome was withdrawn meanwhile is skipped.
    async_order: VecDeque<Ticket>,
}

/// Who needs telling after the gate changed.
#[derive(Debug, Clone, Copy, Default)]
struct Wake {
    parked: bool,
    host: bool,
}

impl GateState {
    /// Pulls every admission event at `now` into `decided`. Must run after
    /// every admission input: grants happen only here.
    fn drain(&mut self, now: Instant) -> Wake {
        let mut wake = Wake::default();
        while let Some(event) = self.admission.poll_event(now) {
            let ticket = event.ticket();
            let Some(waiter) = self.waiting.remove(&ticket) else {
                // Every queued ticket is in `waiting` until its event; a
                // stray grant is handed straight back.
                if let Event::Granted { permit, .. } = event {
                    self.admission.release(permit, now);
                }
                continue;
            };
            let request = waiter.request;
            let decided = match event {
                Event::Granted { permit, waited, .. } => Decided::Granted {
                    permit,
                    waited,
                    request,
                },
                Event::Rejected { rejection, .. } => Decided::Rejected { rejection, request },
            };
            self.decided.insert(ticket, decided);
            if waiter.blocking {
                wake.parked = true;
            } else {
                self.async_order.push_back(ticket);
                wake.host = true;
            }
        }
        wake
    }
}

/// The gate's state and what waits on it, shared with permits and tokens.
pub(crate) struct GateShared {
    clock: Arc<dyn Clock>,
    state: Mutex<GateState>,
    changed: Condvar,
    waker: Mutex<Option<ClaimWaker>>,
}

impl GateShared {
    /// Releases `permit`, lets `also` update the pacing under the same lock,
    /// and hands freed capacity on.
    fn release<T>(
        &self,
        permit: Permit,
        also: impl FnOnce(&mut IdlePacing<PrincipalId, QueueKey>, Instant) -> T,
    ) -> (T, u32) {
        let now = self.clock.now();
        let mut state = self.state.lock();
        state.admission.release(permit, now);
        let value = also(&mut state.idle, now);
        let wake = state.drain(now);
        let limit = state.admission.stats().limit;
        drop(state);
        self.wake(wake);
        (value, limit)
    }

    fn wake(&self, wake: Wake) {
        if wake.parked {
            self.changed.notify_all();
        }
        if wake.host {
            let waker = self.waker.lock().clone();
            if let Some(waker) = waker {
                waker();
            }
        }
    }

    /// Withdraws `ticket`: from the queue if it still waits, or its outcome
    /// if one was decided and not picked up (a grant is released). Returns
    /// whether anything was withdrawn.
    fn withdraw(&self, ticket: Ticket) -> bool {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let queued = state.admission.cancel(ticket);
        state.waiting.remove(&ticket);
        let decided = state.decided.remove(&ticket);
        let wake = state.drain(now);
        drop(state);
        self.wake(wake);
        match decided {
            Some(Decided::Granted { permit, .. }) => {
                self.release(permit, |_, _| {});
                true
            }
            Some(Decided::Rejected { .. }) => true,
            None => queued,
        }
    }
}

/// The claim gate of one store.
pub(crate) struct Gate {
    shared: Arc<GateShared>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("stats", &self.shared.state.lock().admission.stats())
            .finish_non_exhaustive()
    }
}

impl Gate {
    pub(crate) fn new(
        clock: Arc<dyn Clock>,
        admission: &AdmissionConfig,
        idle: &IdleConfig,
    ) -> Result<Self, Error> {
        let admission = Admission::new(admission.clone(), clock.now()).map_err(|error| {
            Error::InvalidInput {
                reason: format!("admission settings: {error}"),
            }
        })?;
        let idle = IdlePacing::new(idle.clone()).map_err(|error| Error::InvalidInput {
            reason: format!("idle pacing settings: {error}"),
        })?;
        let state = GateState {
            admission,
            idle,
            waiting: HashMap::new(),
            decided: HashMap::new(),
            async_order: VecDeque::new(),
        };
        Ok(Self {
            shared: Arc::new(GateShared {
                clock,
                state: Mutex::new(state),
                changed: Condvar::new(),
                waker: Mutex::new(None),
            }),
        })
    }

    /// A queue received work: its idle pacing starts again at 5 s.
    pub(crate) fn enqueued(&self, key: &QueueKey) {
        self.shared.state.lock().idle.enqueued(key);
    }
}

fn rate_limited(rejection: &Rejection) -> Error {
    Error::RateLimited {
        retry_after: rejection.retry_after(),
        reason: rejection.reason().to_string(),
    }
}

/// The task a claim of `queue` takes at `now` (Unix milliseconds), with its
/// brief: the oldest ready one; otherwise whichever became claimable first,
/// a lapsed lease or an ended backoff (ties to the older task). Two index
/// searches, `tasks_claimable` and `attempts_leased`, and the row.
fn next_claimable(
    reader: &Reader<'_>,
    namespace: &Namespace,
    queue: &QueueName,
    now: i64,
) -> Result<Option<TaskRow>, Error> {
    let (namespace, queue) = (namespace.as_str(), queue.as_str());
    let indexed = sql::oldest_claimable(reader, namespace, queue, now)?;
    let indexed_at = indexed
        .as_ref()
        .map(|row| (row.claimable_at.unwrap_or(0), row.id));
    if indexed_at.is_some_and(|(at, _)| at == 0) {
        return Ok(indexed);
    }
    let lapsed = sql::oldest_lapsed(reader, namespace, queue, now)?;
    match (indexed_at, lapsed) {
        (Some(first), Some((task, at))) if (at, task) >= first => Ok(indexed),
        (_, Some((task, _))) => Ok(sql::task_by_id(reader, task, true)?),
        (_, None) => Ok(indexed),
    }
}

impl Store {
    /// Claims the oldest claimable task of `queue` in `namespace`, waiting
    /// for admission if it must: the blocking gate for thread-per-request
    /// hosts.
    ///
    /// Needs the `claim` scope and the namespace grant (`403`, counted,
    /// before admission). Admitted at once while capacity is free;
    /// otherwise the thread parks until its turn (principals take turns)
    /// and then re-checks its key (`401` if it was revoked or expired
    /// meanwhile, `403` if re-scoped; the task stays ready). Waiting past
    /// the admission's `max_wait`, or a full waiting room, is
    /// `429 rate_limited` with `Retry-After` and the reason. Then one
    /// `BEGIN IMMEDIATE` transaction takes the oldest claimable task (ready
    /// ones first, then lapsed leases and ended backoffs by when each
    /// became claimable), grants its lease
    /// under the next fencing token and writes the audit row. An empty
    /// queue writes nothing and returns the idle-pacing `Retry-After`.
    ///
    /// The deadline is kept on the store's clock: a thread parks in real
    /// time, for at most [`Clock::max_park`] at a time, and re-reads the
    /// clock when it wakes. The admission capacity is handed back on every
    /// path, a panic included.
    pub fn claim(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimOutcome, Error> {
        self.claim_blocking(caller, namespace, queue, None)
    }

    /// [`claim`](Self::claim) that gives up with [`Error::Cancelled`]
    /// (counted, nothing written) when `cancel` is cancelled while it
    /// waits for admission. A claim already admitted runs to its end.
    pub fn claim_cancellable(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        cancel: &CancelToken,
    ) -> Result<ClaimOutcome, Error> {
        self.claim_blocking(caller, namespace, queue, Some(cancel))
    }

    /// A token that cancels blocked claims (see
    /// [`claim_cancellable`](Self::claim_cancellable)).
    pub fn cancel_token(&self) -> CancelToken {
        CancelToken {
            flag: Arc::new(AtomicBool::new(false)),
            shared: Arc::clone(&self.gate.shared),
        }
    }

    /// Starts a claim without blocking, for async hosts: checks the scope
    /// and grant (`403`), then offers it to admission.
    ///
    /// [`ClaimStart::Admitted`] runs now through
    /// [`finish_claim`](Self::finish_claim). [`ClaimStart::Queued`] waits;
    /// its outcome comes from [`poll_claim_event`](Self::poll_claim_event).
    /// An overload is `Err(`[`Error::RateLimited`]`)` (`429`, counted).
    ///
    /// # The driver loop
    ///
    /// ```no_run
    /// # use std::collections::HashMap;
    /// # use tessera_store::{Caller, ClaimEvent, ClaimOutcome, ClaimStart, Error, Namespace, QueueName, Store};
    /// # fn respond(_: Result<ClaimOutcome, Error>) {}
    /// # fn drive(store: &Store, caller: &Caller, ns: &Namespace, queue: &QueueName) -> Result<(), Error> {
    /// // A request arrives.
    /// let mut parked = HashMap::new(); // ticket -> the request's reply channel
    /// match store.begin_claim(caller, ns, queue)? {
    ///     ClaimStart::Admitted(permit) => respond(store.finish_claim(permit)),
    ///     ClaimStart::Queued(ticket) => { parked.insert(ticket, "reply channel"); }
    /// }
    /// // After every begin, finish and cancel, when the store's waker fires
    /// // (`set_claim_waker`) and when `poll_claim_timeout` passes:
    /// while let Some(event) = store.poll_claim_event() {
    ///     parked.remove(&event.ticket());
    ///     match event {
    ///         // Run the lease transaction off the async runtime's threads.
    ///         ClaimEvent::Granted { permit, .. } => respond(store.finish_claim(permit)),
    ///         ClaimEvent::Rejected { error, .. } => respond(Err(error)),
    ///     }
    /// }
    /// // A client that left: `store.cancel_claim(ticket)`.
    /// // Sleep until `store.poll_claim_timeout()` (an Instant on
    /// // `store.clock()`), or until the waker fires.
    /// # Ok(()) }
    /// ```
    pub fn begin_claim(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimStart, Error> {
        self.offer_claim(caller, namespace, queue, false)
    }

    /// The next outcome of a claim that [`begin_claim`](Self::begin_claim)
    /// queued: a grant to run with [`finish_claim`](Self::finish_claim), or
    /// a `429` rejection (counted). Also moves admission to the store
    /// clock's now, rejecting claims past their deadline; spurious calls
    /// are harmless.
    pub fn poll_claim_event(&self) -> Option<ClaimEvent> {
        let shared = &self.gate.shared;
        let now = shared.clock.now();
        let mut state = shared.state.lock();
        let wake = state.drain(now);
        let mut next = None;
        while let Some(ticket) = state.async_order.pop_front() {
            if let Some(decided) = state.decided.remove(&ticket) {
                next = Some((ticket, decided));
                break;
            }
        }
        drop(state);
        // Only parked threads: the host is pulling already.
        shared.wake(Wake {
            parked: wake.parked,
            host: false,
        });
        let (ticket, decided) = next?;
        Some(self.deliver(ticket, decided, shared))
    }

    /// When the oldest waiting claim's deadline comes, on the store's
    /// [`clock`](Self::clock): the host calls
    /// [`poll_claim_event`](Self::poll_claim_event) then. `None` when no
    /// claim waits.
    pub fn poll_claim_timeout(&self) -> Option<Instant> {
        self.gate.shared.state.lock().admission.poll_timeout()
    }

    /// Withdraws a claim whose client left, waiting or decided but not yet
    /// pulled (a grant is handed back). Returns `false` if the ticket had
    /// already ended or was never queued.
    pub fn cancel_claim(&self, ticket: Ticket) -> bool {
        self.gate.shared.withdraw(ticket)
    }

    /// Sets (or clears) the function called when a claim outcome is ready
    /// for [`poll_claim_event`](Self::poll_claim_event) without the host
    /// having asked: a permit dropped or finished on another thread granted
    /// the next waiter.
    pub fn set_claim_waker(&self, waker: Option<ClaimWaker>) {
        *self.gate.shared.waker.lock() = waker;
    }

    /// The admission controller's limit, in-flight and waiting counts and
    /// latency average.
    pub fn claim_stats(&self) -> Stats {
        self.gate.shared.state.lock().admission.stats()
    }

    /// Runs an admitted claim: re-checks the key if the claim waited, runs
    /// the lease transaction, then hands the capacity back (the service
    /// time admission measures is this call's). See [`claim`](Self::claim)
    /// for what it decides.
    pub fn finish_claim(&self, permit: ClaimPermit) -> Result<ClaimOutcome, Error> {
        let mut permit = permit;
        let request = Arc::clone(&permit.request);
        let scope = ActionScope::of(&request.caller, Some(&request.namespace), Action::Claim);
        let waited = permit.waited();
        // On an error return the permit is dropped, which releases it.
        let caller = match permit.waited {
            None => request.caller.clone(),
            Some(_) => {
                let current = self
                    .recheck(&request.caller)
                    .inspect_err(|error| self.count(&scope, error.outcome()))?;
                self.authorize(&current, &request.namespace, Scope::Claim, Action::Claim)?;
                current
            }
        };
        let now = self.now_utc();
        let result = self.lease(&scope, &caller, &request.namespace, &request.queue, now);
        let principal = caller.principal();
        // Only an empty claim moves its queue's pacing; built before the
        // gate is taken, so the lock covers no allocation.
        let empty_queue =
            matches!(result, Ok(None)).then(|| (request.namespace.clone(), request.queue.clone()));
        let raw = permit.permit.take().expect("a permit is finished once");
        let granted = matches!(result, Ok(Some(_)));
        let (hint, limit) = self.gate.shared.release(raw, |idle, at| {
            if granted {
                idle.granted(&principal);
            }
            empty_queue
                .as_ref()
                .map(|queue| idle.empty(&principal, queue, at))
        });
        if granted {
            self.namespace_changed(&request.namespace);
        }
        Ok(match result? {
            Some((task, lease, brief)) => ClaimOutcome::Granted(Claimed {
                task,
                queue: request.queue.clone(),
                lease,
                brief,
                waited,
                concurrency_limit: limit,
            }),
            None => ClaimOutcome::Empty {
                retry_after: hint.unwrap_or_default(),
                waited,
                concurrency_limit: limit,
            },
        })
    }

    fn claim_blocking(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        cancel: Option<&CancelToken>,
    ) -> Result<ClaimOutcome, Error> {
        let permit = match self.offer_claim(caller, namespace, queue, true)? {
            ClaimStart::Admitted(permit) => permit,
            ClaimStart::Queued(ticket) => {
                let scope = ActionScope::of(caller, Some(namespace), Action::Claim);
                self.park(ticket, cancel)
                    .inspect_err(|error| self.count(&scope, error.outcome()))?
            }
        };
        self.finish_claim(permit)
    }

    fn offer_claim(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        blocking: bool,
    ) -> Result<ClaimStart, Error> {
        let scope = self.admit(caller, namespace, Scope::Claim, Action::Claim)?;
        let request = Arc::new(ClaimRequest {
            caller: caller.clone(),
            namespace: namespace.clone(),
            queue: queue.clone(),
        });
        let shared = &self.gate.shared;
        let now = shared.clock.now();
        let mut state = shared.state.lock();
        let offer = state.admission.offer(caller.principal(), now);
        if let Offer::Queued(ticket) = &offer {
            let waiter = Waiter {
                request: Arc::clone(&request),
                blocking,
            };
            state.waiting.insert(*ticket, waiter);
        }
        // A fair-share eviction queues a rejection for another claim.
        let wake = state.drain(now);
        drop(state);
        shared.wake(wake);
        match offer {
            Offer::Admitted(permit) => Ok(ClaimStart::Admitted(ClaimPermit {
                permit: Some(permit),
                shared: Arc::clone(shared),
                request,
                waited: None,
            })),
            Offer::Queued(ticket) => Ok(ClaimStart::Queued(ticket)),
            Offer::Rejected(rejection) => {
                let error = rate_limited(&rejection);
                self.count(&scope, error.outcome());
                Err(error)
            }
        }
    }

    /// Parks the calling thread until `ticket` is decided or `cancel`
    /// fires. On every exit the ticket is settled: withdrawn if it still
    /// waits, its grant released if one raced the exit.
    fn park(&self, ticket: Ticket, cancel: Option<&CancelToken>) -> Result<ClaimPermit, Error> {
        struct Settle<'a> {
            shared: &'a GateShared,
            ticket: Ticket,
            settled: bool,
        }
        impl Drop for Settle<'_> {
            fn drop(&mut self) {
                if !self.settled {
                    self.shared.withdraw(self.ticket);
                }
            }
        }
        let shared = &self.gate.shared;
        let mut settle = Settle {
            shared,
            ticket,
            settled: false,
        };
        let mut state = shared.state.lock();
        loop {
            if let Some(decided) = state.decided.remove(&ticket) {
                settle.settled = true;
                drop(state);
                return match self.deliver(ticket, decided, shared) {
                    ClaimEvent::Granted { permit, .. } => Ok(permit),
                    ClaimEvent::Rejected { error, .. } => Err(error),
                };
            }
            if cancel.is_some_and(CancelToken::is_cancelled) {
                drop(state);
                // `settle` withdraws the ticket.
                return Err(Error::Cancelled);
            }
            let now = shared.clock.now();
            let wake = state.drain(now);
            if wake.parked {
                shared.changed.notify_all();
            }
            if wake.host {
                MutexGuard::unlocked(&mut state, || {
                    shared.wake(Wake {
                        parked: false,
                        host: true,
                    });
                });
            }
            if state.decided.contains_key(&ticket) {
                continue;
            }
            let until_deadline = state
                .admission
                .poll_timeout()
                .map(|deadline| deadline.saturating_duration_since(now));
            let park = match (until_deadline, shared.clock.max_park()) {
                (Some(wait), Some(slice)) => Some(wait.min(slice)),
                (wait, slice) => wait.or(slice),
            };
            match park {
                Some(wait) => {
                    shared.changed.wait_for(&mut state, wait);
                }
                None => shared.changed.wait(&mut state),
            }
        }
    }

    /// Turns a decided outcome into what the claimer receives; a rejection
    /// is a counted `429`.
    fn deliver(&self, ticket: Ticket, decided: Decided, shared: &Arc<GateShared>) -> ClaimEvent {
        match decided {
            Decided::Granted {
                permit,
                waited,
                request,
            } => ClaimEvent::Granted {
                ticket,
                permit: ClaimPermit {
                    permit: Some(permit),
                    shared: Arc::clone(shared),
                    request,
                    waited: Some(waited),
                },
            },
            Decided::Rejected { rejection, request } => {
                let error = rate_limited(&rejection);
                let scope =
                    ActionScope::of(&request.caller, Some(&request.namespace), Action::Claim);
                self.count(&scope, error.outcome());
                ClaimEvent::Rejected { ticket, error }
            }
        }
    }

    /// The lease transaction: the oldest claimable task of the queue, its
    /// lease under the next token and the audit row; `None` (counted) when
    /// nothing is claimable.
    fn lease(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<(TaskRef, Lease, Brief)>, Error> {
        let session = caller.kind() == PrincipalKind::Anonymous;
        // An empty queue is answered from a read connection: no write lock,
        // nothing written, and it answers while writes are refused. A
        // session's first use goes on to create its namespace.
        let (claimable, opened) = self
            .read(|reader| {
                let claimable =
                    sql::has_claimable(reader, namespace.as_str(), queue.as_str(), millis(now))?;
                let opened = !session || sql::namespace_exists(reader, namespace.as_str())?;
                Ok((claimable, opened))
            })
            .inspect_err(|error| self.count(scope, error.outcome()))?;
        if !claimable && opened {
            self.count(scope, Outcome::Empty);
            return Ok(None);
        }
        let holder = caller.lease_principal();
        let duration = self.config.lease_duration();
        self.perform_or_count(scope, now, |writer| {
            if session {
                self.open_namespace(writer, caller, namespace, now)?;
            }
            for _ in 0..MAX_PICKS {
                let Some(mut row) = next_claimable(writer, namespace, queue, millis(now))? else {
                    break;
                };
                let mut rules = load(writer, &row)?;
                if rules.next_claimable_at(now) != Some(now) {
                    // The stored claim times were stale; correct them and
                    // look again.
                    resync(writer, row.id, rules.record())?;
                    continue;
                }
                let lease = apply(writer, row.id, &mut rules, |rules| {
                    rules.claim(&holder, now, duration)
                })?;
                let task = TaskRef::new(
                    namespace.clone(),
                    lease.task().clone(),
                    rules.record().version,
                );
                let brief = row.take_brief()?;
                let resource = task.resource(&format!("/a{}/t{}", lease.attempt(), lease.token()));
                return Ok((Some((task, lease, brief)), Trail::Row(resource)));
            }
            Ok((None, Trail::Count(Outcome::Empty)))
        })
    }

    /// A queue received work: idle pacing restarts and long-polls wake.
    pub(crate) fn queue_received_work(&self, namespace: &Namespace, queue: &QueueName) {
        let key = (namespace.clone(), queue.clone());
        self.gate.enqueued(&key);
        self.signals.notify(&key);
    }
}
