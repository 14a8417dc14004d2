//! The claim gate's state machine: admission, idle pacing, and the
//! outcomes of waiting claims until their claimers pick them up. Pure:
//! every call takes `now`, and waking whoever waits is the caller's job
//! ([`Wake`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use tessera_admission::{Admission, Event, IdlePacing, Permit, Rejection, Ticket};
use tessera_lease::{Namespace, QueueName};

use crate::model::access::{Caller, PrincipalId};

/// A queue, as idle pacing and long-polls key it.
pub(crate) type QueueKey = (Namespace, QueueName);

/// Who claims where.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRequest {
    pub(crate) caller: Caller,
    pub(crate) namespace: Namespace,
    pub(crate) queue: QueueName,
    /// How many leases the one lease transaction may grant (1, or a
    /// batch's size).
    pub(crate) count: usize,
}

/// The outcome of a waiting claim, decided but not yet picked up.
pub(crate) enum Decided {
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

pub(crate) struct Waiter {
    pub(crate) request: Arc<ClaimRequest>,
    pub(crate) by: WaitedBy,
}

/// Who waits for a claim's outcome, and so who is told when it comes.
#[derive(Debug)]
pub(crate) enum WaitedBy {
    /// A thread parked on the gate's condvar.
    Thread,
    /// An async host pulling [`ClaimEvent`](crate::ClaimEvent)s.
    Host,
    /// A future, through the waker of its latest poll (none before it).
    Task(Option<Waker>),
}

/// What the gate's mutex guards.
pub(crate) struct GateState {
    pub(crate) admission: Admission<PrincipalId>,
    pub(crate) idle: IdlePacing<PrincipalId, QueueKey>,
    /// Claims waiting in admission, by ticket.
    pub(crate) waiting: HashMap<Ticket, Waiter>,
    /// Outcomes decided and not yet picked up, by ticket.
    pub(crate) decided: HashMap<Ticket, Decided>,
    /// Async claims' outcomes in the order they were decided; a ticket
    /// whose outcome was withdrawn meanwhile is skipped.
    pub(crate) async_order: VecDeque<Ticket>,
}

/// Who needs telling after the gate changed.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    pub(crate) parked: bool,
    pub(crate) host: bool,
    /// The wakers of futures whose claims were decided.
    pub(crate) tasks: Vec<Waker>,
}

impl GateState {
    /// Pulls every admission event at `now` into `decided`. Must run after
    /// every admission input: grants happen only here.
    pub(crate) fn drain(&mut self, now: Instant) -> Wake {
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
            match waiter.by {
                WaitedBy::Thread => wake.parked = true,
                WaitedBy::Host => {
                    self.async_order.push_back(ticket);
                    wake.host = true;
                }
                WaitedBy::Task(waker) => wake.tasks.extend(waker),
            }
        }
        wake
    }
}
