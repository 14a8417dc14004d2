//! Claims for async hosts: admission awaited through a `Waker`, on any
//! executor.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tessera_admission::Ticket;
use tessera_audit::Action;
use tessera_lease::{Namespace, QueueName};

use crate::error::Error;
use crate::model::access::Caller;
use crate::model::audit::ActionScope;
use crate::model::claim::ClaimOutcome;
use crate::state::gate::{ClaimEvent, ClaimPermit, ClaimStart, GateShared, Polled};
use crate::state::waiting::WaitedBy;
use crate::store::Store;

impl Store {
    /// Claims as [`claim`](Self::claim) does, as a future: it waits for
    /// admission through its `Waker`, never a thread, so it runs on any
    /// executor (it uses `std::task` alone), then runs the lease
    /// transaction inline, on the thread that polls it.
    ///
    /// The lease transaction is short on SQLite: about a tenth of a
    /// millisecond on this machine (`store_1_thread/claim` in `docs/performance.md`),
    /// longer while other writes share its commit. It runs inline because
    /// a hop to a blocking pool costs about as much as the transaction and
    /// ties the store to one runtime. A host that must not block at all, or
    /// that runs the PostgreSQL backend on tokio (whose synchronous client
    /// may not run inside a runtime's thread), awaits
    /// [`claim_permit`](Self::claim_permit) instead and hands the permit to
    /// [`finish_claim`](Self::finish_claim) on its blocking pool.
    ///
    /// Dropping the future withdraws its claim from the waiting room, or
    /// hands back a turn that came meanwhile. A claim past the admission's
    /// `max_wait` is `429` at its deadline, kept by one small thread in the
    /// store, without a timer of the host's.
    pub async fn claim_async(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<ClaimOutcome, Error> {
        let permit = self.claim_permit(caller, namespace, queue).await?;
        self.finish_claim(permit)
    }

    /// Waits for admission without a thread: the first part of
    /// [`claim_async`](Self::claim_async). Resolves to the claim's permit,
    /// to run with [`finish_claim`](Self::finish_claim) (on a blocking
    /// pool, if the host likes), or to the `403` or `429`
    /// [`begin_claim`](Self::begin_claim) and a waiting claim can meet.
    /// Nothing is offered to admission before the first poll.
    pub fn claim_permit(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> PermitFuture<'_> {
        self.batch_permit(caller, namespace, queue, 1)
    }

    /// [`claim_permit`](Self::claim_permit) for a batch of `count`: one
    /// offer to admission, as [`claim_batch`](Self::claim_batch) makes.
    pub(crate) fn batch_permit(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        count: usize,
    ) -> PermitFuture<'_> {
        PermitFuture {
            store: self,
            step: Step::Start {
                caller: caller.clone(),
                namespace: namespace.clone(),
                queue: queue.clone(),
                count,
            },
        }
    }
}

/// A claim waiting for admission ([`Store::claim_permit`]). Dropped while
/// it waits, it withdraws the claim; a turn that came meanwhile is handed
/// back to admission.
#[must_use = "a claim is offered to admission only when the future is polled"]
pub struct PermitFuture<'a> {
    store: &'a Store,
    step: Step,
}

enum Step {
    Start {
        caller: Caller,
        namespace: Namespace,
        queue: QueueName,
        count: usize,
    },
    Waiting {
        ticket: Ticket,
        shared: Arc<GateShared>,
        scope: ActionScope,
    },
    Done,
}

impl Future for PermitFuture<'_> {
    type Output = Result<ClaimPermit, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match std::mem::replace(&mut this.step, Step::Done) {
                Step::Start {
                    caller,
                    namespace,
                    queue,
                    count,
                } => {
                    let start = this.store.offer_claim(
                        &caller,
                        &namespace,
                        &queue,
                        count,
                        WaitedBy::Task(None),
                    );
                    match start {
                        Err(error) => return Poll::Ready(Err(error)),
                        Ok(ClaimStart::Admitted(permit)) => return Poll::Ready(Ok(permit)),
                        Ok(ClaimStart::Queued(ticket)) => {
                            let shared = Arc::clone(&this.store.gate.shared);
                            shared.watch_deadlines();
                            let scope = ActionScope::of(&caller, Some(&namespace), Action::Claim);
                            this.step = Step::Waiting {
                                ticket,
                                shared,
                                scope,
                            };
                        }
                    }
                }
                Step::Waiting {
                    ticket,
                    shared,
                    scope,
                } => match shared.poll_ticket(ticket, cx.waker()) {
                    Polled::Waiting => {
                        this.step = Step::Waiting {
                            ticket,
                            shared,
                            scope,
                        };
                        return Poll::Pending;
                    }
                    Polled::Decided(decided) => {
                        return Poll::Ready(match this.store.deliver(ticket, decided) {
                            ClaimEvent::Granted { permit, .. } => Ok(permit),
                            ClaimEvent::Rejected { error, .. } => Err(error),
                        });
                    }
                    Polled::Gone => {
                        let error = Error::Cancelled;
                        this.store.count(&scope, error.outcome());
                        return Poll::Ready(Err(error));
                    }
                },
                Step::Done => panic!("a PermitFuture polled after it completed"),
            }
        }
    }
}

impl Drop for PermitFuture<'_> {
    fn drop(&mut self) {
        if let Step::Waiting { ticket, shared, .. } = &self.step {
            shared.withdraw(*ticket);
        }
    }
}

impl fmt::Debug for PermitFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match &self.step {
            Step::Start { .. } => "not yet offered",
            Step::Waiting { .. } => "waiting for admission",
            Step::Done => "done",
        };
        f.debug_struct("PermitFuture")
            .field("step", &step)
            .finish_non_exhaustive()
    }
}
