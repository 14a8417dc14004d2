//! Claims: admission first, then one lease transaction.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tessera_admission::{Offer, Stats, Ticket};
use tessera_audit::{Action, Outcome, Resource};
use tessera_lease::{
    ConcurrencyLimit, Held, Lease, Namespace, PartitionKey, Principal, QueueName, Submitted, Task,
    TaskState,
};

use crate::backend::rows::{AttemptRow, EventRow, claimable_column};
use crate::backend::{QuickClaim, QuickClaimed, QuickGrant, QuickSubmitted, TaskHandle};
use crate::error::Error;
use crate::model::access::{Caller, PrincipalKind, Scope};
use crate::model::audit::{ActionScope, Trail};
use crate::model::claim::{ClaimOutcome, Claimed, ClaimedBatch, EmptyReason, MAX_CLAIM_BATCH};
use crate::model::queue::QueueSettings;
use crate::model::task::SubmitRequest;
use crate::model::task::{Brief, TaskRef};
use crate::ops::ack::{Ack, AckWrites, Acked, Checked, checked_acceptance};
use crate::ops::task::apply;
use crate::state::gate::{
    CancelToken, ClaimEvent, ClaimPermit, ClaimStart, ClaimWaker, rate_limited,
};
use crate::state::waiting::{ClaimRequest, Decided, QueueKey, WaitedBy};
use crate::store::Store;
use crate::store::compose::carry_observation;

/// What an admitted claim's lease transaction came to.
struct Leased {
    /// The leases granted, in claim order; empty for an empty queue.
    granted: Vec<Claimed>,
    /// The idle-pacing hint of an empty claim.
    retry_after: Option<Duration>,
    waited: Duration,
    limit: u32,
    /// Why nothing was granted.
    reason: EmptyReason,
}

impl Leased {
    /// A claim of one task's outcome: its lease, or why there was none.
    fn outcome(self) -> ClaimOutcome {
        match self.granted.into_iter().next() {
            Some(claimed) => ClaimOutcome::Granted(claimed),
            None => ClaimOutcome::Empty {
                retry_after: self.retry_after.unwrap_or_default(),
                waited: self.waited,
                concurrency_limit: self.limit,
                reason: self.reason,
            },
        }
    }
}

/// One lease a claim granted: the task, the lease and the brief.
type LeaseGrant = (TaskRef, Lease, Brief);
/// What a lease transaction came to: its grants and, with none, why.
type LeaseResult = Result<(Vec<LeaseGrant>, EmptyReason), Error>;

/// A grant inside the lease transaction, with the task's place.
type Placed = (TaskHandle, TaskRef, Lease, Brief);

/// How often the lease transaction skips a task whose stored claim times
/// turned out stale before it reports the queue empty (a lease that lapsed
/// on its last try is discarded and not counted).
const MAX_PICKS: usize = 4;

/// The `Retry-After` of a claim that found its queue at its concurrency
/// limit: a slot frees when a lease ends, so it is not paced like an idle
/// queue.
pub const LIMITED_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most lapsed leases a claim of a full queue records before it counts
/// again.
const MAX_LAPSES_RECORDED: usize = 100;

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
        let ack = match self.submission(caller, submission)? {
            Checked::Ack(ack) => ack,
            Checked::Answered(submitted) => {
                return Ok((submitted, self.claim(caller, namespace, queue)));
            }
        };
        let permit = match self.admit_blocking(caller, namespace, queue, 1, None) {
            Ok(permit) => permit,
            Err(error) => return Ok((self.submit_alone(ack)?, Err(error))),
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
        Ok((submitted, leased.map(Leased::outcome)))
    }

    /// The transaction of [`submit_and_claim`](Self::submit_and_claim):
    /// the acknowledgement under the completer's rules, then, if they
    /// accepted or replayed it, the claim's lease work. Returns the
    /// acknowledgement's answer and the claim's (no grant when it was not
    /// made); a failed commit is both answers.
    fn lease_carrying(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        ack: &Ack,
        now: DateTime<Utc>,
    ) -> (Result<Acked, Error>, LeaseResult) {
        let _span = crate::observe::operation(scope);
        if let Some(answers) = self.lease_carrying_quick(scope, caller, request, ack, now) {
            return answers;
        }
        let acks = std::slice::from_ref(ack);
        let due = self.due_observation(scope, now);
        let result = self.write_with_tail(|writer| {
            // The clock again, now the transaction has begun (see `lease`).
            let now = self.now_utc().max(now);
            let (decided, writes) = self.decide_unwritten(writer, acks, now)?;
            if decided.answers.iter().any(Result::is_err) {
                writes.write_with(writer, &[], &[])?;
                return Ok((decided, None));
            }
            // The submission's writes ride with the claim's.
            let (claimed, trail) =
                self.lease_in(writer, scope, caller, request, Some(writes), now)?;
            if let Trail::Row(resource) = &trail {
                writer.insert_event(&scope.event(now, resource.clone()))?;
            }
            if decided.audited.iter().any(|audited| *audited) || !matches!(trail, Trail::Count(_)) {
                carry_observation(writer, due, now);
            }
            Ok((decided, Some((claimed, trail))))
        });
        match result {
            Ok(((decided, claimed), carried)) => {
                self.acks_committed(acks, &decided);
                let wrote = decided.audited.iter().any(|audited| *audited);
                let claimed = match claimed {
                    None => Ok((Vec::new(), EmptyReason::Empty)),
                    Some((claimed, Trail::Row(_) | Trail::Written)) => {
                        self.observed(due, carried, now);
                        self.after_write();
                        Ok(claimed)
                    }
                    Some((claimed, Trail::Count(outcome))) => {
                        if wrote {
                            self.observed(due, carried, now);
                        }
                        self.count(scope, outcome);
                        Ok(claimed)
                    }
                };
                let answer = decided
                    .answers
                    .into_iter()
                    .next()
                    .expect("one answer per acknowledgement");
                (answer, claimed)
            }
            Err(error) => {
                self.count(&ack.scope, error.outcome());
                self.count(scope, error.outcome());
                (Err(error.clone()), Err(error))
            }
        }
    }

    /// [`lease_carrying`](Self::lease_carrying) in one statement, where
    /// the backend makes it
    /// ([`Backend::submit_and_claim_quick`](crate::backend::Backend::submit_and_claim_quick)):
    /// `None` when it declined, and the general transaction runs. A due
    /// `last_used_at` and a session's claim (which may create its
    /// namespace) ride with the general one. The acceptance and the grant
    /// are checked against the lease rules, applied to the tasks as the
    /// statement found them.
    fn lease_carrying_quick(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        ack: &Ack,
        now: DateTime<Utc>,
    ) -> Option<(Result<Acked, Error>, LeaseResult)> {
        if request.count != 1
            || caller.kind() == PrincipalKind::Anonymous
            || self.injects_faults()
            || self.due_observation(scope, now).is_some()
            || self.due_observation(&ack.scope, now).is_some()
        {
            return None;
        }
        let submit = ack.quick_submit(now)?;
        let holder = caller.lease_principal();
        let duration = self.config.lease_duration();
        let expires_at = now.checked_add_signed(TimeDelta::from_std(duration).ok()?)?;
        let claim = QuickClaim {
            namespace: &request.namespace,
            queue: &request.queue,
            holder: &holder,
            now,
            expires_at,
            event: EventRow::from_event(&scope.event(now, None)),
        };
        let acceptance = match self.backend().submit_and_claim_quick(&submit, &claim) {
            Ok(QuickSubmitted::Declined) => return None,
            Ok(QuickSubmitted::Accepted(acceptance)) => acceptance,
            Err(error) => {
                let error = error.refusal_dated(now);
                self.count(&ack.scope, error.outcome());
                self.count(scope, error.outcome());
                return Some((Err(error.clone()), Err(error)));
            }
        };
        let submitted = checked_acceptance(&submit, &acceptance, now);
        let decided = crate::ops::ack::Decided::one(submitted.map(Acked::Submitted));
        self.acks_committed(std::slice::from_ref(ack), &decided);
        let claimed = match acceptance.claimed {
            QuickClaimed::Leased(grant) => checked_grant(&claim, duration, *grant)
                .map(|granted| (vec![granted], EmptyReason::Empty)),
            QuickClaimed::Empty => {
                self.count(scope, Outcome::Empty);
                Ok((Vec::new(), EmptyReason::Empty))
            }
            QuickClaimed::Declined => Err(crate::error::corrupt(
                "a one-statement submission with a declined claim",
            )),
        };
        let answer = decided
            .answers
            .into_iter()
            .next()
            .expect("one answer per acknowledgement");
        Some((answer, claimed))
    }

    /// Runs an admitted claim of one or a batch: see
    /// [`finish_claim`](Self::finish_claim).
    fn run_claim(&self, permit: ClaimPermit) -> Result<Leased, Error> {
        self.run_claim_with(permit, |scope, caller, request, idle_queue, now| {
            self.lease(scope, caller, request, idle_queue, now)
        })
    }

    /// [`run_claim`](Self::run_claim) with `lease` as its lease
    /// transaction; `None` from it when no claim was made.
    fn run_claim_with(
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
    fn admit_blocking(
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
        let offer = shared.offer(&request, by);
        match offer {
            Offer::Admitted(permit) => Ok(ClaimStart::Admitted(ClaimPermit {
                permit: Some(permit),
                shared: Arc::clone(shared),
                request,
                waited: None,
            })),
            Offer::Queued(ticket) => {
                crate::observe::claim_queued(&scope, queue.as_str());
                Ok(ClaimStart::Queued(ticket))
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
    fn park(&self, ticket: Ticket, cancel: Option<&CancelToken>) -> Result<ClaimPermit, Error> {
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

    /// The lease transaction: the first claimable tasks of the queue, up
    /// to the request's count, each leased under the task's next token and
    /// with its audit row; none (counted) when nothing is claimable.
    fn lease(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        idle_queue: &QueueKey,
        now: DateTime<Utc>,
    ) -> Result<(Vec<LeaseGrant>, EmptyReason), Error> {
        let (namespace, queue) = (&request.namespace, &request.queue);
        let session = caller.kind() == PrincipalKind::Anonymous;
        // A key that found this queue empty, with no grant or enqueue
        // since, likely finds it empty again: that claim is answered from a
        // read connection, with no write lock and nothing written, as is
        // every claim while writes are refused. Any other claim goes
        // straight to the lease transaction, which finds the queue's first
        // claimable task (or none, writing nothing) on pages it reads
        // anyway. A session's first use goes on to create its namespace.
        if self.is_refusing_writes() || self.gate.found_empty(&caller.principal(), idle_queue) {
            let (claimable, opened, paused) = self
                .read(|reader| {
                    let claimable = reader.has_claimable(namespace, queue, now)?;
                    let opened = !session || reader.namespace_exists(namespace)?;
                    let paused = reader
                        .queue_settings(namespace, queue)?
                        .is_some_and(|settings| settings.is_paused());
                    Ok((claimable, opened, paused))
                })
                .inspect_err(|error| self.count(scope, error.outcome()))?;
            if opened && (paused || !claimable) {
                self.count(scope, Outcome::Empty);
                let reason = if paused {
                    EmptyReason::Paused
                } else {
                    EmptyReason::Empty
                };
                return Ok((Vec::new(), reason));
            }
        }
        let holder = caller.lease_principal();
        let duration = self.config.lease_duration();
        if request.count == 1 && !session {
            if let Some(result) = self.lease_quick(scope, namespace, queue, &holder, duration, now)
            {
                return result;
            }
        }
        self.perform_or_count(scope, now, |writer| {
            // The clock again, now the transaction has begun: a claim that
            // waited for a connection or the writer would otherwise stamp
            // its lease with the time it began waiting, before the end of a
            // lease whose lapse another process recorded meanwhile.
            let now = self.now_utc().max(now);
            self.lease_in(writer, scope, caller, request, None, now)
        })
    }

    /// The lease transaction's work, in `writer`: see [`lease`](Self::lease).
    /// Its trail is the last grant's audit row, or the empty claim's count.
    /// The `carried` writes of acknowledgements decided earlier in the
    /// transaction are made with the grants' where the claim leases
    /// set-based, and first otherwise.
    fn lease_in(
        &self,
        writer: &dyn crate::backend::WriteTransaction,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        mut carried: Option<AckWrites<'_>>,
        now: DateTime<Utc>,
    ) -> Result<((Vec<LeaseGrant>, EmptyReason), Trail), Error> {
        let (namespace, queue) = (&request.namespace, &request.queue);
        let session = caller.kind() == PrincipalKind::Anonymous;
        let holder = caller.lease_principal();
        let duration = self.config.lease_duration();
        let mut audited = 0;
        if session {
            self.open_namespace(writer, caller, namespace, now)?;
        }
        // A queue without a settings row (running, no limit): its
        // claimable tasks locked in one statement, where the backend can,
        // which also tells that the queue has no settings. Otherwise the
        // settings are read, and the claim takes its tasks one at a time.
        let mut locked = writer.lock_claimable(namespace, queue, now, request.count)?;
        if let (Some(writes), Some(tasks)) = (&carried, &locked)
            && tasks.iter().any(|task| writes.changes_task(task.handle))
        {
            // The claim found a task the carried writes change: they are
            // made first, and the claim looks again at the tasks as they
            // now are.
            writes.write_with(writer, &[], &[])?;
            carried = None;
            locked = writer.lock_claimable(namespace, queue, now, request.count)?;
        }
        if locked.is_none()
            && let Some(writes) = carried.take()
        {
            writes.write_with(writer, &[], &[])?;
        }
        let settings = match locked {
            Some(_) => None,
            None => writer.queue_settings(namespace, queue)?,
        };
        if settings.as_ref().is_some_and(QueueSettings::is_paused) {
            return Ok((
                (Vec::new(), EmptyReason::Paused),
                Trail::Count(Outcome::Empty),
            ));
        }
        let limit = settings.map_or(ConcurrencyLimit::NONE, |settings| settings.limit);
        let (granted, reason) = if limit.per_partition.is_some() {
            let wanted = Wanted {
                count: request.count,
                limit,
                holder: &holder,
                duration,
            };
            grant_by_partition(writer, namespace, queue, &wanted, now)?
        } else {
            let mut reason = EmptyReason::Empty;
            let mut lapses_recorded = false;
            let mut granted: Vec<(TaskHandle, TaskRef, Lease, Brief)> = Vec::new();
            let mut stale = 0;
            let mut exhausted = false;
            if let Some(locked) = locked {
                // Plain tasks, leased set-based.
                let found = locked.len();
                let terms = LeaseTerms {
                    holder: &holder,
                    duration,
                    now,
                };
                granted = grant_locked(writer, scope, namespace, locked, &terms, carried.as_ref())?;
                audited = granted.len();
                exhausted = granted.len() == found && found < request.count;
            }
            while !exhausted && granted.len() < request.count && stale < MAX_PICKS {
                let Some(loaded) = writer.next_claimable(namespace, queue, now)? else {
                    break;
                };
                if granted.iter().any(|(handle, ..)| *handle == loaded.handle) {
                    // Another attempt of a task this batch leased: no worker
                    // holds two competing attempts of one brief at once.
                    break;
                }
                let mut rules = Task::restore(loaded.record)?;
                if rules.next_claimable_at(now) != Some(now) {
                    // A lease lapsed on its last try: discard its attempt
                    // and look again (each pass takes one lapse out of the
                    // index, so this ends). Otherwise the stored claim
                    // times were stale: correct them and look again.
                    if apply(
                        writer,
                        loaded.handle,
                        loaded.unique_held,
                        &mut rules,
                        now,
                        |rules| Ok(rules.expire(now)),
                    )?
                    .is_empty()
                    {
                        writer.resync_task(loaded.handle, rules.record())?;
                        stale += 1;
                    }
                    continue;
                }
                if limit.is_limited() {
                    let held = held_slots(writer, namespace, queue, &rules, None, &holder, now)?;
                    if !limit.admits(held) {
                        if !lapses_recorded {
                            // The queue is full: record the lapses of its
                            // expired leases, which frees their slots, and
                            // look again.
                            lapses_recorded = true;
                            record_lapses(writer, namespace, queue, now)?;
                            continue;
                        }
                        reason = EmptyReason::Limited;
                        break;
                    }
                }
                let lease = apply(
                    writer,
                    loaded.handle,
                    loaded.unique_held,
                    &mut rules,
                    now,
                    |rules| rules.claim(&holder, now, duration),
                )?;
                let task = TaskRef::new(
                    namespace.clone(),
                    lease.task().clone(),
                    rules.record().version,
                );
                let brief = loaded
                    .brief
                    .ok_or_else(|| crate::error::corrupt("task brief"))?;
                granted.push((loaded.handle, task, lease, brief));
            }
            (granted, reason)
        };
        // One audit row per lease; the last rides on the trail. The
        // first `audited` were written with their leases.
        let trail = match granted.split_last() {
            None => Trail::Count(Outcome::Empty),
            Some(_) if audited == granted.len() => Trail::Written,
            Some((last, earlier)) => {
                for lease in earlier.get(audited..).unwrap_or_default() {
                    writer.insert_event(&scope.event(now, resource(lease)))?;
                }
                Trail::Row(resource(last))
            }
        };
        let granted = granted
            .into_iter()
            .map(|(_, task, lease, brief)| (task, lease, brief))
            .collect();
        Ok(((granted, reason), trail))
    }

    /// The claim of one task in one statement, where the backend makes it
    /// ([`Backend::claim_quick`](crate::backend::Backend::claim_quick)):
    /// `None` when it declined, and the general lease transaction claims.
    /// A due `last_used_at` rides with the general claim. The grant is
    /// checked against the lease rules, applied to the task as the
    /// statement found it.
    fn lease_quick(
        &self,
        scope: &ActionScope,
        namespace: &Namespace,
        queue: &QueueName,
        holder: &Principal,
        duration: Duration,
        now: DateTime<Utc>,
    ) -> Option<Result<(Vec<LeaseGrant>, EmptyReason), Error>> {
        if self.due_observation(scope, now).is_some() {
            return None;
        }
        let expires_at = now.checked_add_signed(TimeDelta::from_std(duration).ok()?)?;
        let claim = QuickClaim {
            namespace,
            queue,
            holder,
            now,
            expires_at,
            event: EventRow::from_event(&scope.event(now, None)),
        };
        let _span = crate::observe::operation(scope);
        let result = match self.backend().claim_quick(&claim) {
            Ok(QuickClaimed::Declined) => return None,
            Ok(QuickClaimed::Empty) => {
                self.count(scope, Outcome::Empty);
                return Some(Ok((Vec::new(), EmptyReason::Empty)));
            }
            Ok(QuickClaimed::Leased(grant)) => checked_grant(&claim, duration, *grant),
            Err(error) => Err(error.refusal_dated(now)),
        };
        Some(match result {
            Ok(granted) => {
                self.after_write();
                Ok((vec![granted], EmptyReason::Empty))
            }
            Err(error) => {
                self.count(scope, error.outcome());
                Err(error)
            }
        })
    }

    /// A queue received work: idle pacing restarts and long-polls wake.
    /// Also called when a queue is resumed or its limits change.
    pub(crate) fn queue_received_work(&self, namespace: &Namespace, queue: &QueueName) {
        let key = (namespace.clone(), queue.clone());
        self.gate.enqueued(&key);
        self.signals.notify(&key);
    }
}

/// The slots [`ConcurrencyLimit::admits`] weighs for granting the next
/// attempt of `rules`: the queue's attempts stored as leased, and those of
/// its `partition` (`None`: not counted), each less the
/// attempt the grant takes over if its lease lapsed (it gives up its own
/// slot as it takes the new one).
fn held_slots(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    rules: &Task,
    partition: Option<&PartitionKey>,
    holder: &Principal,
    now: DateTime<Utc>,
) -> Result<Held, Error> {
    let leased = writer.leased_in_queue(namespace, queue)?;
    let in_partition = match partition {
        Some(key) => Some(writer.leased_in_partition(namespace, queue, key)?),
        None => None,
    };
    // The attempt a grant would take, found by the rule itself on a copy.
    let mut trial = rules.clone();
    let retaken = trial
        .claim(holder, now, Duration::from_secs(1))
        .ok()
        .and_then(|lease| rules.attempt(lease.attempt()))
        .is_some_and(|attempt| attempt.state == TaskState::Leased);
    Ok(Held {
        queue: leased.saturating_sub(u32::from(retaken)),
        partition: in_partition.map(|held| held.saturating_sub(u32::from(retaken))),
    })
}

/// Records the lapses of `queue`'s expired leases, the longest expired
/// first (at most [`MAX_LAPSES_RECORDED`] tasks): each attempt leaves
/// `leased`, which frees its slot, and its old holder's token changes
/// nothing from then on.
fn record_lapses(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    for loaded in writer.lapsed_tasks(namespace, Some(queue), now, MAX_LAPSES_RECORDED)? {
        let mut rules = Task::restore(loaded.record)?;
        apply(
            writer,
            loaded.handle,
            loaded.unique_held,
            &mut rules,
            now,
            |rules| Ok(rules.expire(now)),
        )?;
    }
    Ok(())
}

/// What a claim of a partition-limited queue asks for.
struct Wanted<'a> {
    count: usize,
    limit: ConcurrencyLimit,
    holder: &'a Principal,
    duration: Duration,
}

/// The most candidates a claim of a partition-limited queue walks through
/// before it answers `limited`.
const MAX_CANDIDATES: usize = 64;

/// The grants of a claim of a queue with a per-partition limit: the lapses
/// of its expired leases recorded first (freeing their slots), then its
/// claimable tasks in claim order, skipping those whose partition is full,
/// each granted while [`ConcurrencyLimit::admits`] the slots held. Empty
/// with [`EmptyReason::Limited`] when it skipped any and granted none.
fn grant_by_partition(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    wanted: &Wanted<'_>,
    now: DateTime<Utc>,
) -> Result<(Vec<Placed>, EmptyReason), Error> {
    record_lapses(writer, namespace, queue, now)?;
    let mut granted: Vec<Placed> = Vec::new();
    let mut full: Vec<PartitionKey> = Vec::new();
    let mut skipped = false;
    for handle in writer.claim_candidates(namespace, queue, now, MAX_CANDIDATES)? {
        if granted.len() >= wanted.count {
            break;
        }
        if granted.iter().any(|(granted, ..)| *granted == handle) {
            continue;
        }
        // Another claim holds it (PostgreSQL), or it is gone.
        let Some(loaded) = writer.task_by_handle(handle)? else {
            continue;
        };
        let partition = loaded.partition_key.clone();
        let unique_held = loaded.unique_held;
        if partition.as_ref().is_some_and(|key| full.contains(key)) {
            skipped = true;
            continue;
        }
        let mut rules = Task::restore(loaded.record)?;
        if rules.next_claimable_at(now) != Some(now) {
            // A lapse on the last try or a passed deadline is recorded;
            // otherwise the stored claim times the rules disagree with
            // are corrected. Either way it is left for a later claim.
            if apply(writer, handle, unique_held, &mut rules, now, |rules| {
                Ok(rules.expire(now))
            })?
            .is_empty()
            {
                writer.resync_task(handle, rules.record())?;
            }
            continue;
        }
        let held = held_slots(
            writer,
            namespace,
            queue,
            &rules,
            partition.as_ref(),
            wanted.holder,
            now,
        )?;
        if !wanted.limit.admits(held) {
            skipped = true;
            let queue_full = ConcurrencyLimit {
                per_partition: None,
                ..wanted.limit
            };
            match partition {
                Some(key) if queue_full.admits(held) => full.push(key),
                // The queue itself is full: nothing else can be granted.
                _ => break,
            }
            continue;
        }
        let lease = apply(writer, handle, unique_held, &mut rules, now, |rules| {
            rules.claim(wanted.holder, now, wanted.duration)
        })?;
        let task = TaskRef::new(
            namespace.clone(),
            lease.task().clone(),
            rules.record().version,
        );
        let brief = loaded
            .brief
            .ok_or_else(|| crate::error::corrupt("task brief"))?;
        granted.push((handle, task, lease, brief));
    }
    let reason = if skipped {
        EmptyReason::Limited
    } else {
        EmptyReason::Empty
    };
    Ok((granted, reason))
}

/// The grant of a one-statement claim, as the lease rules make it from the
/// task the statement found; the statement's writes must be theirs.
fn checked_grant(
    claim: &QuickClaim<'_>,
    duration: Duration,
    grant: QuickGrant,
) -> Result<LeaseGrant, Error> {
    let QuickGrant {
        before,
        after,
        resource,
    } = grant;
    let brief = before
        .brief
        .ok_or_else(|| crate::error::corrupt("task brief"))?;
    let mut rules = Task::restore(before.record)?;
    let lease = rules.claim(claim.holder, claim.now, duration)?;
    let record = rules.record();
    let task = TaskRef::new(
        claim.namespace.clone(),
        lease.task().clone(),
        record.version,
    );
    let expected = record
        .attempts
        .iter()
        .find(|attempt| attempt.number == lease.attempt())
        .map(|attempt| AttemptRow::from_record(attempt, record.lapse_backoff));
    let named = task.grant_resource(lease.attempt(), lease.token());
    if lease.expires_at() != claim.expires_at
        || expected.as_ref() != Some(&after)
        || claimable_column(record).is_some()
        || named.as_ref().map(Resource::as_str) != resource.as_deref()
    {
        return Err(crate::error::corrupt(
            "a one-statement claim that differs from the lease rules",
        ));
    }
    Ok((task, lease, brief))
}

/// A grant's audit resource.
fn resource((_, task, lease, _): &(TaskHandle, TaskRef, Lease, Brief)) -> Option<Resource> {
    task.grant_resource(lease.attempt(), lease.token())
}

/// Whom a claim leases to, for how long, and when.
struct LeaseTerms<'a> {
    holder: &'a Principal,
    duration: Duration,
    now: DateTime<Utc>,
}

/// Leases the tasks [`lock_claimable`](crate::backend::WriteTransaction::lock_claimable)
/// locked, in claim order, each under the lease rules as the one-at-a-time
/// claim leases it, and writes them set-based with their audit rows. It
/// stops before
/// the first task whose stored claim times are stale, which the
/// one-at-a-time claim corrects, and after one with another attempt still
/// claimable. The `carried` writes of acknowledgements are made in the
/// same statement.
fn grant_locked(
    writer: &dyn crate::backend::WriteTransaction,
    scope: &ActionScope,
    namespace: &Namespace,
    locked: Vec<crate::backend::LoadedTask>,
    terms: &LeaseTerms<'_>,
    carried: Option<&AckWrites<'_>>,
) -> Result<Vec<(TaskHandle, TaskRef, Lease, Brief)>, Error> {
    let &LeaseTerms {
        holder,
        duration,
        now,
    } = terms;
    let mut leased = Vec::with_capacity(locked.len());
    for loaded in locked {
        let mut rules = Task::restore(loaded.record.clone())?;
        if rules.next_claimable_at(now) != Some(now) {
            break;
        }
        let lease = rules.claim(holder, now, duration)?;
        let brief = loaded
            .brief
            .clone()
            .ok_or_else(|| crate::error::corrupt("task brief"))?;
        // A task with another attempt still claimable comes next in claim
        // order, and a batch never takes two attempts of one task: the
        // batch ends with it, as the one-at-a-time claim's does.
        let again = rules.next_claimable_at(now) == Some(now);
        leased.push((loaded, rules, lease, brief));
        if again {
            break;
        }
    }
    let changes: Vec<crate::backend::TaskChange<'_>> = leased
        .iter()
        .map(|(loaded, rules, ..)| crate::backend::TaskChange {
            handle: loaded.handle,
            before: &loaded.record,
            after: rules.record(),
            at: now,
        })
        .collect();
    let mut granted: Vec<(TaskHandle, TaskRef, Lease, Brief)> = Vec::with_capacity(leased.len());
    for (loaded, rules, lease, brief) in &leased {
        let task = TaskRef::new(
            namespace.clone(),
            lease.task().clone(),
            rules.record().version,
        );
        granted.push((loaded.handle, task, lease.clone(), brief.clone()));
    }
    let events: Vec<_> = granted
        .iter()
        .map(|grant| scope.event(now, resource(grant)))
        .collect();
    match carried {
        Some(writes) => writes.write_with(writer, &changes, &events)?,
        None => writer.write_acknowledged(&changes, &[], &events)?,
    }
    for (loaded, rules, ..) in &leased {
        if crate::ops::task::leaves_slot(loaded.unique_held, rules.record()) {
            writer.release_unique_slot(loaded.handle)?;
        }
    }
    Ok(granted)
}
