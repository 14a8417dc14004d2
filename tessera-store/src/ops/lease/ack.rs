//! Acknowledgements: a holder submits its result, reports a failure, or
//! snoozes its task; each answer comes from the completer's batch.

use tessera_audit::Action;
use tessera_lease::{Failure, FencingToken, IdempotencyKey, Submitted, TaskState};

use crate::error::{ConflictKind, Error};
use crate::model::access::Caller;
use crate::model::ack::{Ack, Acked};
use crate::model::audit::ActionScope;
use crate::model::task::MAX_SUBMIT_BATCH;
use crate::model::task::{Output, SubmitRequest, TaskRef};
use crate::ops::lease::complete::Checked;
use crate::ops::task::load;
use crate::store::Store;

impl Store {
    /// Submits the output of the lease `token` on `task` under an
    /// idempotency key, and returns the receipt.
    ///
    /// Needs the `claim` scope and the namespace grant. The key is scoped to
    /// the caller's principal and the task. The same key with the same
    /// output digest returns the stored receipt as
    /// [`Submitted::Replayed`] and writes nothing (not even an audit row: a
    /// replay is counted), even after the lease ended; the same key with a
    /// different digest is `409 conflict`. A fresh submission needs the live
    /// lease (`409` for a stale, foreign or expired token) and writes the
    /// receipt, the attempt's state and the audit row in one transaction.
    ///
    /// The submission goes through the store's completer: submissions and
    /// failure reports that threads of this store make at about the same
    /// time share one transaction ([`AckBatching`](crate::AckBatching)),
    /// each with its own checks, receipt and audit row, and each answered
    /// only after that transaction committed. The replay check is inside
    /// it; while writes are refused, a replay is answered from a read.
    pub fn submit(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        key: &IdempotencyKey,
        output: &Output,
    ) -> Result<Submitted, Error> {
        let request = SubmitRequest {
            task: task.clone(),
            token,
            key: key.clone(),
            output: output.clone(),
        };
        match self.submission(caller, &request)? {
            Checked::Ack(ack) => self.submit_alone(ack),
            Checked::Answered(submitted) => Ok(submitted),
        }
    }

    /// One submission through the completer.
    pub(crate) fn submit_alone(&self, ack: Ack) -> Result<Submitted, Error> {
        match self.acknowledge(vec![ack]).pop() {
            Some(answer) => match answer?? {
                Acked::Submitted(submitted) => Ok(submitted),
                Acked::Failed(_) => unreachable!("a submission is answered as one"),
            },
            None => unreachable!("one answer per acknowledgement"),
        }
    }

    /// Ends the lease `token` on `task` with a failure report (a [`Retry`](tessera_lease::Retry)
    /// alone, or a [`Failure`] with an error text):
    /// [`Retry::Never`](tessera_lease::Retry::Never) fails its attempt for good;
    /// [`Retry::After`](tessera_lease::Retry::After) makes
    /// it claimable again after the backoff (counted in whole
    /// milliseconds, as times are stored), and
    /// [`Retry::Backoff`](tessera_lease::Retry::Backoff) after the
    /// default exponential backoff with jitter
    /// ([`retry_backoff`](tessera_lease::retry_backoff)). A retry asked for
    /// on the attempt's last try discards it instead
    /// ([`TaskState::Discarded`]).
    /// [`Retry::Snooze`](tessera_lease::Retry::Snooze) steps back without
    /// spending the try, on any try: claimable again after its delay.
    /// Returns the attempt's new state. Same
    /// permissions and token rules as [`heartbeat`](Self::heartbeat);
    /// committed through the completer, as [`submit`](Self::submit) is.
    pub fn fail(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        failure: impl Into<Failure>,
    ) -> Result<TaskState, Error> {
        let ack = self.failure_report(caller, task, token, failure.into())?;
        match self.acknowledge(vec![ack]).pop() {
            Some(answer) => match answer?? {
                Acked::Failed(state) => Ok(state),
                Acked::Submitted(_) => unreachable!("a failure report is answered as one"),
            },
            None => unreachable!("one answer per acknowledgement"),
        }
    }

    /// Hands the leased task back to its queue, claimable again after
    /// `delay` (whole milliseconds, at most
    /// [`MAX_BACKOFF`](tessera_lease::MAX_BACKOFF); zero: at once), without
    /// spending the try its lease took ([`Retry::Snooze`](tessera_lease::Retry::Snooze)):
    /// for a worker that cannot run it now (a rate limit upstream, a
    /// resource not ready). Returns the attempt's new state.
    ///
    /// Fenced as a submission is: only the live lease `token`, held by
    /// the caller, is snoozed (`409 stale_token`, `lease_expired`, …
    /// otherwise, and nothing changes). Idempotent: the same snooze (token
    /// and delay) retried after its first call took effect (a lost
    /// answer) answers the state the attempt waits in, as long as it was
    /// not granted again, and changes nothing; a lease a failure report
    /// ended is not snoozed after the fact. The snooze ends the lease at
    /// its time: a heartbeat under it then is `409`. Needs the `claim` scope; audited as `snooze`.
    pub fn snooze(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        delay: std::time::Duration,
    ) -> Result<TaskState, Error> {
        let snooze = tessera_lease::Retry::Snooze(delay);
        let ack = self.failure_report_as(caller, task, token, snooze.into(), Action::Snooze)?;
        let answer = match self.acknowledge(vec![ack]).pop() {
            Some(answer) => answer,
            None => unreachable!("one answer per acknowledgement"),
        };
        match answer? {
            Ok(Acked::Failed(state)) => Ok(state),
            Ok(Acked::Submitted(_)) => unreachable!("a snooze is answered as a failure report"),
            Err(Error::Conflict {
                kind: kind @ (ConflictKind::LeaseEnded | ConflictKind::LeaseExpired),
                reason,
            }) => {
                let holder = caller.lease_principal();
                let now = self.now_utc();
                let delay = crate::model::task::whole_millis(delay);
                let replayed = self.read(|reader| {
                    let (_, rules, _) = load(reader, task)?;
                    Ok(rules.snoozed(&holder, token, delay, now))
                })?;
                replayed.ok_or(Error::Conflict { kind, reason })
            }
            Err(error) => Err(error),
        }
    }

    /// Submits many outputs of `caller`'s leases at once, each as
    /// [`submit`](Self::submit) would, and returns each one's answer in
    /// order: its receipt ([`Submitted::Accepted`]), its replay, or its
    /// own error (`409` for a stale token or an idempotency conflict,
    /// `404`, `403` for a namespace the key has no grant for).
    ///
    /// The submissions go through the store's completer with those of
    /// other threads: one transaction, set-based statements, one receipt
    /// and one audit row per accepted submission, and each answer only
    /// after the commit that holds it. The outer `Err` is for the batch
    /// as a whole, which then acknowledged nothing: empty or above
    /// [`MAX_SUBMIT_BATCH`](crate::limits::MAX_SUBMIT_BATCH) (`400`), or
    /// a commit that failed (a storage error, `503` for a quota).
    pub fn submit_batch(
        &self,
        caller: &Caller,
        submissions: &[SubmitRequest],
    ) -> Result<Vec<Result<Submitted, Error>>, Error> {
        if submissions.is_empty() || submissions.len() > MAX_SUBMIT_BATCH {
            let error = Error::InvalidInput {
                reason: format!(
                    "a batch holds 1 to {MAX_SUBMIT_BATCH} submissions, not {}",
                    submissions.len()
                ),
            };
            let scope = ActionScope::of(caller, None, Action::Submit);
            self.count(&scope, error.outcome());
            return Err(error);
        }
        let mut answers: Vec<Option<Result<Submitted, Error>>> = Vec::new();
        let mut acks = Vec::new();
        let mut places = Vec::new();
        for (index, request) in submissions.iter().enumerate() {
            match self.submission(caller, request) {
                Ok(Checked::Ack(ack)) => {
                    answers.push(None);
                    acks.push(ack);
                    places.push(index);
                }
                Ok(Checked::Answered(submitted)) => answers.push(Some(Ok(submitted))),
                Err(error) => answers.push(Some(Err(error))),
            }
        }
        let results = self
            .acknowledge(acks)
            .into_iter()
            .collect::<Result<Vec<_>, Error>>()?;
        for (place, result) in places.into_iter().zip(results) {
            answers[place] = Some(result.map(|acked| match acked {
                Acked::Submitted(submitted) => submitted,
                Acked::Failed(_) => unreachable!("a submission is answered as one"),
            }));
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.expect("every submission is answered"))
            .collect())
    }
}
