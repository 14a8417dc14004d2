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
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tessera_admission::{
    Admission, AdmissionConfig, IdleConfig, IdlePacing, Offer, Permit, Rejection, Stats, Ticket,
};
use tessera_lease::{Namespace, QueueName};

use crate::clock::Clock;
use crate::error::Error;
use crate::model::access::{Caller, PrincipalId};
use crate::state::waiting::{ClaimRequest, Decided, GateState, QueueKey, WaitedBy, Waiter, Wake};

/// Called when an outcome for a claim begun with [`Store::begin_claim`](crate::Store::begin_claim) is
/// ready to pull with [`Store::poll_claim_event`](crate::Store::poll_claim_event) (see
/// [`Store::set_claim_waker`](crate::Store::set_claim_waker)). It runs on whichever thread produced the
/// outcome, outside the store's locks; it should only wake the host's
/// driver (e.g. `tokio::sync::Notify::notify_one`).
pub type ClaimWaker = Arc<dyn Fn() + Send + Sync>;

/// How [`Store::begin_claim`](crate::Store::begin_claim) started a claim.
#[derive(Debug)]
#[must_use]
pub enum ClaimStart {
    /// Admitted at once: run it with [`Store::finish_claim`](crate::Store::finish_claim).
    Admitted(ClaimPermit),
    /// Waiting its turn; its [`ClaimEvent`] comes from
    /// [`Store::poll_claim_event`](crate::Store::poll_claim_event).
    Queued(Ticket),
}

/// The end of a waiting claim, pulled with [`Store::poll_claim_event`](crate::Store::poll_claim_event).
#[derive(Debug)]
#[must_use]
pub enum ClaimEvent {
    /// Its turn came: run it with [`Store::finish_claim`](crate::Store::finish_claim).
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

/// One admitted unit of claim capacity, for one claim.
///
/// Pass it to [`Store::finish_claim`](crate::Store::finish_claim). Dropped instead (an error, a panic,
/// a client that left), it hands its capacity back to admission, which may
/// grant the next waiting claim. It is not `Clone`.
#[must_use = "a claim permit holds admission capacity until it is finished or dropped"]
pub struct ClaimPermit {
    pub(crate) permit: Option<Permit>,
    pub(crate) shared: Arc<GateShared>,
    pub(crate) request: Arc<ClaimRequest>,
    /// `None` when admitted at once; how long it waited otherwise.
    pub(crate) waited: Option<Duration>,
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

/// Lets a thread blocked in [`Store::claim_cancellable`](crate::Store::claim_cancellable) give up its place.
///
/// Made by [`Store::cancel_token`](crate::Store::cancel_token); clones share one flag. Cancelling wakes
/// the blocked claim, which withdraws from the queue (or hands back a grant
/// that raced the cancellation) and returns [`Error::Cancelled`].
#[derive(Clone)]
pub struct CancelToken {
    pub(crate) flag: Arc<AtomicBool>,
    pub(crate) shared: Arc<GateShared>,
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

/// The gate's state and what waits on it, shared with permits and tokens.
pub(crate) struct GateShared {
    clock: Arc<dyn Clock>,
    state: Mutex<GateState>,
    changed: Condvar,
    waker: Mutex<Option<ClaimWaker>>,
    /// Whether the deadline thread runs ([`GateShared::watch_deadlines`]).
    watching: AtomicBool,
}

/// The longest the deadline thread sleeps between looks at the gate.
const DEADLINE_NAP: Duration = Duration::from_secs(1);

/// What a future found of its waiting claim.
pub(crate) enum Polled {
    /// Its outcome.
    Decided(Decided),
    /// Still waiting; the future's waker is kept.
    Waiting,
    /// Withdrawn by someone else.
    Gone,
}

impl GateShared {
    /// Offers `request`'s claim to admission at the clock's now; a queued
    /// one waits under its ticket, for a parked thread, the host or a
    /// future (`by`) to pick up.
    pub(crate) fn offer(&self, request: &Arc<ClaimRequest>, by: WaitedBy) -> Offer {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let offer = state.admission.offer(request.caller.principal(), now);
        if let Offer::Queued(ticket) = &offer {
            let waiter = Waiter {
                request: Arc::clone(request),
                by,
            };
            state.waiting.insert(*ticket, waiter);
        }
        // A fair-share eviction queues a rejection for another claim.
        let wake = state.drain(now);
        drop(state);
        self.wake(wake);
        offer
    }

    /// `request` admitted only if admission takes it at once
    /// ([`Admission::try_admit`](tessera_admission::Admission::try_admit));
    /// `None`, with no ticket, otherwise.
    pub(crate) fn try_offer(&self, request: &ClaimRequest) -> Option<Permit> {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let permit = state.admission.try_admit(request.caller.principal(), now);
        // Time moving on may have ended waiters: their answers go out.
        let wake = state.drain(now);
        drop(state);
        self.wake(wake);
        permit
    }

    /// The next outcome decided for the host, in the order they were
    /// decided; moves admission to the clock's now first.
    pub(crate) fn next_for_host(&self) -> Option<(Ticket, Decided)> {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let wake = state.drain(now);
        let mut next = None;
        while let Some(ticket) = state.async_order.pop_front() {
            if let Some(decided) = state.decided.remove(&ticket) {
                next = Some((ticket, decided));
                break;
            }
        }
        drop(state);
        // Not the host: it is pulling already.
        self.wake(Wake {
            host: false,
            ..wake
        });
        next
    }

    /// A future's look at its claim `ticket`: the outcome if one was
    /// decided (moving admission to the clock's now first), else `waker` is
    /// kept to wake it when one is.
    pub(crate) fn poll_ticket(&self, ticket: Ticket, waker: &Waker) -> Polled {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let wake = state.drain(now);
        let polled = match state.decided.remove(&ticket) {
            Some(decided) => Polled::Decided(decided),
            None => match state.waiting.get_mut(&ticket) {
                Some(waiter) => {
                    match &mut waiter.by {
                        WaitedBy::Task(Some(kept)) if kept.will_wake(waker) => {}
                        by => *by = WaitedBy::Task(Some(waker.clone())),
                    }
                    Polled::Waiting
                }
                None => Polled::Gone,
            },
        };
        drop(state);
        self.wake(wake);
        polled
    }

    /// Starts, once per store, the thread that rejects waiting claims at
    /// their deadlines when nothing else moves the gate, so a future
    /// needs no timer of its host's. It sleeps until the oldest waiter's
    /// deadline, at most a second at a time, and ends within a second of
    /// the store's last handle going.
    pub(crate) fn watch_deadlines(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("tessera-claim-deadlines".to_owned())
            .spawn(move || {
                while let Some(shared) = shared.upgrade() {
                    shared.wait_for_a_deadline();
                }
            });
        if spawned.is_err() {
            // No thread: waiting futures are still decided whenever the
            // gate moves; let the next one try again.
            self.watching.store(false, Ordering::SeqCst);
        }
    }

    /// One turn of the deadline thread: decides what is due, tells whoever
    /// waits, then sleeps until the next deadline or a change.
    fn wait_for_a_deadline(&self) {
        let mut state = self.state.lock();
        let now = self.clock.now();
        let wake = state.drain(now);
        let until_deadline = state
            .admission
            .poll_timeout()
            .map(|deadline| deadline.saturating_duration_since(now));
        let nap = [until_deadline, self.clock.max_park(), Some(DEADLINE_NAP)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(DEADLINE_NAP);
        MutexGuard::unlocked(&mut state, || self.wake(wake));
        self.changed.wait_for(&mut state, nap);
    }

    /// Parks the calling thread until `ticket` is decided, or `cancel`
    /// fires ([`Error::Cancelled`]). On every exit the ticket is settled:
    /// withdrawn if it still waits, its grant released if one raced the
    /// exit. The deadline is kept on the store's clock: a thread parks in
    /// real time, for at most [`Clock::max_park`] at a time.
    pub(crate) fn park(
        &self,
        ticket: Ticket,
        cancel: Option<&CancelToken>,
    ) -> Result<Decided, Error> {
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
        let mut settle = Settle {
            shared: self,
            ticket,
            settled: false,
        };
        let mut state = self.state.lock();
        loop {
            if let Some(decided) = state.decided.remove(&ticket) {
                settle.settled = true;
                return Ok(decided);
            }
            if cancel.is_some_and(CancelToken::is_cancelled) {
                drop(state);
                // `settle` withdraws the ticket.
                return Err(Error::Cancelled);
            }
            let now = self.clock.now();
            let wake = state.drain(now);
            if wake.parked {
                self.changed.notify_all();
            }
            if wake.host || !wake.tasks.is_empty() {
                MutexGuard::unlocked(&mut state, || {
                    self.wake(Wake {
                        parked: false,
                        ..wake
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
            let park = match (until_deadline, self.clock.max_park()) {
                (Some(wait), Some(slice)) => Some(wait.min(slice)),
                (wait, slice) => wait.or(slice),
            };
            match park {
                Some(wait) => {
                    self.changed.wait_for(&mut state, wait);
                }
                None => self.changed.wait(&mut state),
            }
        }
    }

    /// When the oldest waiting claim's deadline comes.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.state.lock().admission.poll_timeout()
    }

    /// The controller's limit, in-flight and waiting counts.
    pub(crate) fn stats(&self) -> Stats {
        self.state.lock().admission.stats()
    }

    /// Sets (or clears) the host's waker.
    pub(crate) fn set_waker(&self, waker: Option<ClaimWaker>) {
        *self.waker.lock() = waker;
    }
}

impl GateShared {
    /// Releases `permit`, lets `also` update the pacing under the same lock,
    /// and hands freed capacity on.
    pub(crate) fn release<T>(
        &self,
        permit: Permit,
        also: impl FnOnce(&mut IdlePacing<PrincipalId, QueueKey>, Instant) -> T,
    ) -> (T, u32) {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let before = state.admission.stats().limit;
        state.admission.release(permit, now);
        let value = also(&mut state.idle, now);
        let wake = state.drain(now);
        let stats = state.admission.stats();
        drop(state);
        crate::observe::gate(before, &stats);
        let limit = stats.limit;
        self.wake(wake);
        (value, limit)
    }

    /// Tells whoever `wake` names, outside the gate's lock.
    pub(crate) fn wake(&self, wake: Wake) {
        if wake.parked {
            self.changed.notify_all();
        }
        if wake.host {
            let waker = self.waker.lock().clone();
            if let Some(waker) = waker {
                waker();
            }
        }
        for task in wake.tasks {
            task.wake();
        }
    }

    /// Withdraws `ticket`: from the queue if it still waits, or its outcome
    /// if one was decided and not picked up (a grant is released). Returns
    /// whether anything was withdrawn.
    pub(crate) fn withdraw(&self, ticket: Ticket) -> bool {
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
#[derive(Clone)]
pub(crate) struct Gate {
    pub(crate) shared: Arc<GateShared>,
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
                watching: AtomicBool::new(false),
            }),
        })
    }

    /// A queue received work: its idle pacing starts again at 5 s.
    pub(crate) fn enqueued(&self, key: &QueueKey) {
        self.shared.state.lock().idle.enqueued(key);
    }

    /// Whether `principal`'s last claim on the queue found it empty, with
    /// no lease granted to it and no enqueue to the queue since
    /// ([`IdlePacing::found_empty`]).
    pub(crate) fn found_empty(&self, principal: &PrincipalId, key: &QueueKey) -> bool {
        self.shared.state.lock().idle.found_empty(principal, key)
    }
}

pub(crate) fn rate_limited(rejection: &Rejection) -> Error {
    crate::observe::claim_rejected(rejection.reason());
    Error::RateLimited {
        retry_after: rejection.retry_after(),
        reason: rejection.reason().to_string(),
    }
}
