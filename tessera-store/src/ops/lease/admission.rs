//! Admission: the claim API, permits and the waiting room, and how an
//! admitted claim runs its lease transaction.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use chrono::{DateTime, Utc};
use tessera_admission::{Offer, Stats, Ticket};
use tessera_audit::Action;
use tessera_lease::{Namespace, QueueName, Submitted};

use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::ack::Acked;
use crate::model::audit::ActionScope;
use crate::model::claim::{ClaimOutcome, Claimed, ClaimedBatch, EmptyReason, MAX_CLAIM_BATCH};
use crate::model::task::SubmitRequest;
use crate::ops::lease::complete::Checked;
use crate::state::gate::{
    CancelToken, ClaimEvent, ClaimPermit, ClaimStart, ClaimWaker, rate_limited,
};
use crate::state::waiting::{ClaimRequest, Decided, QueueKey, WaitedBy};
use crate::store::Store;

use super::{LIMITED_RETRY_AFTER, LeaseResult, Leased};

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
    /// A key that found the queue empty, with no lease granted to it and
    /// no enqueue to the queue since, has its next claim there answered
    /// from a read connection first, without the write lock, as is every
    /// claim while writes are refused; other claims search the queue in
    /// the lease transaction itself.
    ///
    /// The deadline is kept on the store's clock: a thread parks in real
    /// time, for at most [`Clock::max_park`](crate::Clock::max_park) at a time, and re-reads the
    /// clock when it wakes. The admission capacity is handed back on every
    /// path, a panic included.
    pub fn claim(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimOutcome, Error> {
        let permit = self.admit_blocking(caller, namespace, queue, 1, None)?;
        self.finish_claim(permit)
    }

    /// Claims up to `count` tasks of `queue` at once (1 to
    /// [`MAX_CLAIM_BATCH`](crate::limits::MAX_CLAIM_BATCH)), in claim
    /// order, each under its own lease and fencing token and with its own
    /// audit row, all in one lease transaction. Fewer, or none, if fewer
    /// are claimable; it stops early rather than lease a second attempt of
    /// a task it already leased.
    ///
    /// Admission sees one claim: a batch is one offer, holding one unit of
    /// capacity, and its service time is its whole lease transaction.
    /// Admission shares the store's time between principals, not tasks:
    /// a batch that takes longer shows in the latency average and lowers
    /// the limit for everyone, and it waits its turn as one claim does, so
    /// a key that batches cannot take more than its share of slots. The
    /// rest is as [`claim`](Self::claim): permissions, waiting, `429`,
    /// and the idle-pacing hint when nothing was claimable.
    pub fn claim_batch(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        count: usize,
    ) -> Result<ClaimedBatch, Error> {
        let permit = self.admit_blocking(caller, namespace, queue, count, None)?;
        self.finish_claim_batch(permit)
    }

    /// Runs an admitted claim of a batch (see
    /// [`claim_batch`](Self::claim_batch)).
    pub(crate) fn finish_claim_batch(&self, permit: ClaimPermit) -> Result<ClaimedBatch, Error> {
        let leased = self.run_claim(permit)?;
        let leased_reason = leased.reason;
        Ok(ClaimedBatch {
            claimed: leased.granted,
            retry_after: leased.retry_after,
            waited: leased.waited,
            concurrency_limit: leased.limit,
            reason: None,
        })
        .map(|mut batch| {
            if batch.claimed.is_empty() {
                batch.reason = Some(leased_reason);
            }
            batch
        })
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
        let permit = self.admit_blocking(caller, namespace, queue, 1, Some(cancel))?;
        self.finish_claim(permit)
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
        self.offer_claim(caller, namespace, queue, 1, WaitedBy::Host)
    }

    /// The next outcome of a claim that [`begin_claim`](Self::begin_claim)
    /// queued: a grant to run with [`finish_claim`](Self::finish_claim), or
    /// a `429` rejection (counted). Also moves admission to the store
    /// clock's now, rejecting claims past their deadline; spurious calls
    /// are harmless.
    pub fn poll_claim_event(&self) -> Option<ClaimEvent> {
        let (ticket, decided) = self.gate.shared.next_for_host()?;
        Some(self.deliver(ticket, decided))
    }

    /// When the oldest waiting claim's deadline comes, on the store's
    /// [`clock`](Self::clock): the host calls
    /// [`poll_claim_event`](Self::poll_claim_event) then. `None` when no
    /// claim waits.
    pub fn poll_claim_timeout(&self) -> Option<Instant> {
        self.gate.shared.poll_timeout()
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
        self.gate.shared.set_waker(waker);
    }

    /// The admission controller's limit, in-flight and waiting counts and
    /// latency average.
    pub fn claim_stats(&self) -> Stats {
        self.gate.shared.stats()
    }

    /// Runs an admitted claim: re-checks the key if the claim waited, runs
    /// the lease transaction, then hands the capacity back (the service
    /// time admission measures is this call's). See [`claim`](Self::claim)
    /// for what it decides.
    pub fn finish_claim(&self, permit: ClaimPermit) -> Result<ClaimOutcome, Error> {
        Ok(self.run_claim(permit)?.outcome())
    }

    /// Submits the output of a lease and claims the next task of
    /// `namespace`/`queue` in one transaction: the acknowledgement that
    /// carries the next claim, so a worker that takes one task at a time
    /// commits once per task. On PostgreSQL, calls from several threads
    /// of one process at the same moment share one statement and one
    /// commit (grouped by the [`AckBatching`](crate::AckBatching) rule),
    /// each still with its own answer and its own task.
    ///
    /// The submission is checked as [`submit`](Self::submit) checks it
    /// (the same answers, receipts and audit row); the claim is offered to
    /// admission as [`claim`](Self::claim) is and takes the task a claim
    /// would, with its own audit row. The claim is made only once the
    /// submission is accepted or replayed, in the same transaction, so
    /// both commit or neither does.
    ///
    /// The outer `Err` is the submission's (`409` for a stale token or an
    /// idempotency conflict, `404`, `403`, or a failed commit): nothing was
    /// written and nothing claimed. Inside `Ok`, the submission's answer
    /// and the claim's outcome, or the claim's own error (`429` when
    /// admission rejects it, after which the submission was committed
    /// alone, as [`submit`](Self::submit) commits it).
    ///
    /// ```
    /// # use tessera_store::*;
    /// # let store = Store::open_in_memory(StoreConfig::default()).unwrap();
    /// # let admin_key = store.create_admin_key("ops").unwrap();
    /// # let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    /// # let ns = Namespace::parse("farm").unwrap();
    /// # let queue = QueueName::parse("frames").unwrap();
    /// # let spec = KeySpec::keyed("worker").with_scopes(Scope::ALL.iter().copied()).with_grant(Grant::Namespace(ns.clone()));
    /// # let key = store.create_key(&admin, &spec).unwrap();
    /// # let worker = store.authenticate(Some(key.secret.expose())).unwrap();
    /// # for n in 0..2 { store.enqueue(&worker, &ns, &queue, &Brief::Bytes(vec![n]), &EnqueueOptions::default()).unwrap(); }
    /// let ClaimOutcome::Granted(mut claimed) = store.claim(&worker, &ns, &queue)? else { panic!() };
    /// loop {
    ///     let done = SubmitRequest {
    ///         task: claimed.task.clone(),
    ///         token: claimed.lease.token(),
    ///         key: IdempotencyKey::parse("done")?,
    ///         output: Output::bytes("ok"),
    ///     };
    ///     let (submitted, next) = store.submit_and_claim(&worker, &done, &ns, &queue)?;
    ///     assert!(matches!(submitted, Submitted::Accepted(_)));
    ///     match next? {
    ///         ClaimOutcome::Granted(next) => claimed = next,
    ///         _ => break,
    ///     }
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn submit_and_claim(
        &self,
        caller: &Caller,
        submission: &SubmitRequest,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<(Submitted, Result<ClaimOutcome, Error>), Error> {
        self.submit_carrying(caller, submission, namespace, queue, true)
            .map(|(submitted, claimed)| {
                (
                    submitted,
                    claimed.expect("a carried claim that waits is made"),
                )
            })
    }

    /// [`submit_and_claim`](Self::submit_and_claim); with `wait` false, a
    /// claim that admission would make wait is not made (`None`: nothing
    /// queued, charged or counted, see
    /// [`try_claim_permit`](Self::try_claim_permit)), and the submission
    /// commits alone at once.
    pub(crate) fn submit_carrying(
        &self,
        caller: &Caller,
        submission: &SubmitRequest,
        namespace: &Namespace,
        queue: &QueueName,
        wait: bool,
    ) -> Result<(Submitted, Option<Result<ClaimOutcome, Error>>), Error> {
        let ack = match self.submission(caller, submission)? {
            Checked::Ack(ack) => ack,
            Checked::Answered(submitted) if wait => {
                return Ok((submitted, Some(self.claim(caller, namespace, queue))));
            }
            Checked::Answered(submitted) => return Ok((submitted, None)),
        };
        let admitted = if wait {
            self.admit_blocking(caller, namespace, queue, 1, None)
        } else {
            match self.try_claim_permit(caller, namespace, queue) {
                Ok(Some(permit)) => Ok(permit),
                Ok(None) => return Ok((self.submit_alone(ack)?, None)),
                Err(error) => Err(error),
            }
        };
        let permit = match admitted {
            Ok(permit) => permit,
            Err(error) => return Ok((self.submit_alone(ack)?, Some(Err(error)))),
        };
        let mut answer = None;
        let leased = self.run_claim_with(permit, |scope, caller, request, _, now| {
            let (acked, claimed) = self.lease_carrying(scope, caller, request, &ack, now);
            // A refused submission made no claim: nothing to pace by.
            let refused = acked.as_ref().err().cloned();
            answer = Some(acked);
            match refused {
                Some(error) => Err(error),
                None => claimed,
            }
        });
        let submitted = match answer {
            // The claim failed before its transaction: the submission
            // commits alone.
            None => self.submit_alone(ack)?,
            Some(acked) => match acked? {
                Acked::Submitted(submitted) => submitted,
                Acked::Failed(_) => unreachable!("a submission is answered as one"),
            },
        };
        Ok((submitted, Some(leased.map(Leased::outcome))))
    }

    /// Runs an admitted claim of one or a batch: see
    /// [`finish_claim`](Self::finish_claim).
    pub(super) fn run_claim(&self, permit: ClaimPermit) -> Result<Leased, Error> {
        self.run_claim_with(permit, |scope, caller, request, idle_queue, now| {
            self.lease(scope, caller, request, idle_queue, now)
        })
    }

    /// [`run_claim`](Self::run_claim) with `lease` as its lease
    /// transaction; `None` from it when no claim was made.
    pub(super) fn run_claim_with(
        &self,
        permit: ClaimPermit,
        lease: impl FnOnce(
            &ActionScope,
            &Caller,
            &ClaimRequest,
            &QueueKey,
            DateTime<Utc>,
        ) -> LeaseResult,
    ) -> Result<Leased, Error> {
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
        let timer = crate::observe::Timer::start();
        // The queue's key in idle pacing, built before the gate is taken,
        // so the lock covers no allocation.
        let idle_queue = (request.namespace.clone(), request.queue.clone());
        let result = lease(&scope, &caller, &request, &idle_queue, now);
        let service = timer.elapsed();
        let principal = caller.principal();
        // Only an empty claim moves its queue's pacing; a claim that found
        // the queue at its limit does not (a slot frees when a lease ends).
        let empty_queue = matches!(
            &result,
            Ok((granted, reason)) if granted.is_empty() && *reason != EmptyReason::Limited
        )
        .then_some(idle_queue);
        let raw = permit.permit.take().expect("a permit is finished once");
        let granted = matches!(&result, Ok((granted, _)) if !granted.is_empty());
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
        let (granted, reason) = result?;
        crate::observe::claim_finished(
            &scope,
            request.queue.as_str(),
            granted.len(),
            waited,
            service,
        );
        let retry_after = match reason {
            _ if !granted.is_empty() => None,
            EmptyReason::Limited => Some(LIMITED_RETRY_AFTER),
            EmptyReason::Empty | EmptyReason::Paused => hint,
        };
        Ok(Leased {
            reason,
            retry_after,
            granted: granted
                .into_iter()
                .map(|(task, lease, brief)| Claimed {
                    task,
                    queue: request.queue.clone(),
                    lease,
                    brief,
                    waited,
                    concurrency_limit: limit,
                })
                .collect(),
            waited,
            limit,
        })
    }

    /// Offers a claim of `count` to admission and parks the thread until
    /// its turn, or until `cancel` fires.
    pub(super) fn admit_blocking(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        count: usize,
        cancel: Option<&CancelToken>,
    ) -> Result<ClaimPermit, Error> {
        match self.offer_claim(caller, namespace, queue, count, WaitedBy::Thread)? {
            ClaimStart::Admitted(permit) => Ok(permit),
            ClaimStart::Queued(ticket) => {
                let scope = ActionScope::of(caller, Some(namespace), Action::Claim);
                self.park(ticket, cancel)
                    .inspect_err(|error| self.count(&scope, error.outcome()))
            }
        }
    }

    pub(crate) fn offer_claim(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        count: usize,
        by: WaitedBy,
    ) -> Result<ClaimStart, Error> {
        Ok(self
            .offer_or_try(caller, namespace, queue, count, Some(by))?
            .expect("an offer is admitted, queued or rejected"))
    }

    /// A claim of one task admitted only if admission takes it at once
    /// ([`Admission::try_admit`](tessera_admission::Admission::try_admit)):
    /// `None`, with nothing queued, charged or counted, when it would
    /// wait; the key's refusals (`403`) as [`offer_claim`](Self::offer_claim)
    /// gives them.
    pub(crate) fn try_claim_permit(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<Option<ClaimPermit>, Error> {
        Ok(
            match self.offer_or_try(caller, namespace, queue, 1, None)? {
                Some(ClaimStart::Admitted(permit)) => Some(permit),
                Some(ClaimStart::Queued(ticket)) => {
                    unreachable!("a claim tried at once is never queued: {ticket:?}")
                }
                None => None,
            },
        )
    }

    /// [`offer_claim`](Self::offer_claim) waited for `by`, or, with
    /// `None`, [`try_claim_permit`](Self::try_claim_permit).
    fn offer_or_try(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        count: usize,
        by: Option<WaitedBy>,
    ) -> Result<Option<ClaimStart>, Error> {
        let scope = self.admit(caller, namespace, Scope::Claim, Action::Claim)?;
        // Checked after the key, so a key without the scope is 403 first.
        if count == 0 || count > MAX_CLAIM_BATCH {
            let error = Error::InvalidInput {
                reason: format!("a batch claims 1 to {MAX_CLAIM_BATCH} tasks, not {count}"),
            };
            self.count(&scope, error.outcome());
            return Err(error);
        }
        let request = Arc::new(ClaimRequest {
            caller: caller.clone(),
            namespace: namespace.clone(),
            queue: queue.clone(),
            count,
        });
        let shared = &self.gate.shared;
        let offer = match by {
            Some(by) => shared.offer(&request, by),
            None => match shared.try_offer(&request) {
                Some(permit) => Offer::Admitted(permit),
                None => return Ok(None),
            },
        };
        match offer {
            Offer::Admitted(permit) => Ok(Some(ClaimStart::Admitted(ClaimPermit {
                permit: Some(permit),
                shared: Arc::clone(shared),
                request,
                waited: None,
            }))),
            Offer::Queued(ticket) => {
                crate::observe::claim_queued(&scope, queue.as_str());
                Ok(Some(ClaimStart::Queued(ticket)))
            }
            Offer::Rejected(rejection) => {
                let error = rate_limited(&rejection);
                self.count(&scope, error.outcome());
                Err(error)
            }
        }
    }

    /// Parks the calling thread until `ticket` is decided or `cancel`
    /// fires; a rejection is a counted `429`.
    pub(super) fn park(
        &self,
        ticket: Ticket,
        cancel: Option<&CancelToken>,
    ) -> Result<ClaimPermit, Error> {
        let decided = self.gate.shared.park(ticket, cancel)?;
        match self.deliver(ticket, decided) {
            ClaimEvent::Granted { permit, .. } => Ok(permit),
            ClaimEvent::Rejected { error, .. } => Err(error),
        }
    }

    /// Turns a decided outcome into what the claimer receives; a rejection
    /// is a counted `429`.
    pub(crate) fn deliver(&self, ticket: Ticket, decided: Decided) -> ClaimEvent {
        let shared = &self.gate.shared;
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

    /// A queue received work: idle pacing restarts and long-polls wake.
    /// Also called when a queue is resumed or its limits change.
    pub(crate) fn queue_received_work(&self, namespace: &Namespace, queue: &QueueName) {
        let key = (namespace.clone(), queue.clone());
        self.gate.enqueued(&key);
        self.signals.notify(&key);
    }
}
