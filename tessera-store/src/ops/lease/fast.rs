//! The fast path: a claim, or an acknowledgement with the next claim, in
//! one statement where the backend makes it, each checked against the
//! lease rules.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_audit::Outcome;
use tessera_lease::{Namespace, Principal, QueueName};

use crate::backend::rows::EventRow;
use crate::backend::{QuickClaim, QuickClaimed, QuickSubmitted};
use crate::error::Error;
use crate::model::access::{Caller, PrincipalKind};
use crate::model::ack::{Ack, Acked};
use crate::model::audit::{ActionScope, Trail};
use crate::model::claim::EmptyReason;
use crate::ops::lease::complete::checked_acceptance;
use crate::state::waiting::ClaimRequest;
use crate::store::Store;
use crate::store::compose::carry_observation;

use super::grant::checked_grant;
use super::{LeaseGrant, LeaseResult};

/// How many times a claim asks again after it passed over a claimable
/// task that another statement held: with the pauses between them
/// ([`skipped_pause`]), about 0.2 s in all, past any statement or claim
/// transaction of this process.
pub(super) const SKIPPED_RETRIES: u32 = 64;

/// The pause before the `skipped`-th retry (from 0): 50 µs doubling to
/// 3.2 ms.
pub(super) fn skipped_pause(skipped: u32) {
    std::thread::sleep(Duration::from_micros(50 << skipped.min(6)));
}

impl Store {
    /// The transaction of [`submit_and_claim`](Self::submit_and_claim):
    /// the acknowledgement under the completer's rules, then, if they
    /// accepted or replayed it, the claim's lease work. Returns the
    /// acknowledgement's answer and the claim's (no grant when it was not
    /// made); a failed commit is both answers.
    pub(super) fn lease_carrying(
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
    pub(super) fn lease_carrying_quick(
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
        let decided = crate::ops::lease::complete::Decided::one(submitted.map(Acked::Submitted));
        self.acks_committed(std::slice::from_ref(ack), &decided);
        let claimed = match acceptance.claimed {
            QuickClaimed::Leased(grant) => checked_grant(&claim, duration, *grant)
                .map(|granted| (vec![granted], EmptyReason::Empty)),
            QuickClaimed::Empty => {
                self.count(scope, Outcome::Empty);
                Ok((Vec::new(), EmptyReason::Empty))
            }
            // The statement saw a claimable task only another statement
            // held: the claim is asked again on its own, after the
            // submission committed, so the caller does not hear "empty"
            // while that task waits.
            QuickClaimed::Skipped => self.lease_written(scope, caller, request, now),
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

    /// The claim of one task in one statement, where the backend makes it
    /// ([`Backend::claim_quick`](crate::backend::Backend::claim_quick)):
    /// `None` when it declined, and the general lease transaction claims.
    /// A due `last_used_at` rides with the general claim. The grant is
    /// checked against the lease rules, applied to the task as the
    /// statement found it.
    pub(super) fn lease_quick(
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
        let mut skipped = 0;
        let result = loop {
            match self.backend().claim_quick(&claim) {
                Ok(QuickClaimed::Declined) => return None,
                Ok(QuickClaimed::Empty) => {
                    self.count(scope, Outcome::Empty);
                    return Some(Ok((Vec::new(), EmptyReason::Empty)));
                }
                // A claimable task another statement holds: asked again
                // once that statement has had time to grant or release
                // it, and past the bound the general claim decides.
                Ok(QuickClaimed::Skipped) if skipped < SKIPPED_RETRIES => {
                    skipped_pause(skipped);
                    skipped += 1;
                }
                Ok(QuickClaimed::Skipped) => return None,
                Ok(QuickClaimed::Leased(grant)) => break checked_grant(&claim, duration, *grant),
                Err(error) => break Err(error.refusal_dated(now)),
            }
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
}
