//! Acknowledgements: submits and failure reports, coalesced by the
//! store's completer into one transaction per batch.
//!
//! A batch is one write transaction of a fixed number of statements,
//! whatever its size: its tasks locked and loaded at once (in reference
//! order, so batches never deadlock one another), the receipts its keys
//! name read at once, then `tessera-lease`'s rules applied to each
//! acknowledgement in memory, in arrival order (two on one task see each
//! other's effect), and what they changed written set-based: task and
//! attempt rows, receipts and one audit row per accepted action. A rule
//! that refuses one acknowledgement (a stale token, a conflict) answers
//! that caller alone; nothing was written for it. A commit that fails
//! answers every caller of the batch with its error, and none is
//! acknowledged.

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tessera_audit::{Action, AuditEvent, Outcome};
use tessera_lease::{
    AttemptNumber, Failure, FencingToken, Idempotency, IdempotencyKey, LeaseError, Principal,
    Receipt, Retry, Submission, Submitted, Task, TaskRecord, UniqueStates, check_output_size,
    decide_idempotency,
};

use crate::backend::rows::{AttemptRow, EventRow, claimable_column};
use crate::backend::{
    NewReceipt, QuickAcceptance, QuickSubmit, ReceiptKey, TaskChange, TaskHandle, WriteTransaction,
};
use crate::error::{Error, StorageError, StorageErrorKind};
use crate::model::access::{Caller, PrincipalId, Scope};
use crate::model::ack::{Ack, AckAnswer, AckKind, Acked};
use crate::model::task::{SubmitRequest, TaskRef, purged, whole_millis};
use crate::ops::dependency;
use crate::store::Store;

/// One task of a batch, as loaded and as the rules leave it.
struct Held {
    handle: TaskHandle,
    before: TaskRecord,
    rules: Task,
    /// The states in which it holds a unique slot, if it holds one.
    unique: Option<UniqueStates>,
}

/// What a batch's transaction decided, before its commit.
pub(crate) struct Decided {
    /// Each acknowledgement's answer, in order.
    pub(crate) answers: Vec<Result<Acked, Error>>,
    /// Which acknowledgements wrote an audit row.
    pub(crate) audited: Vec<bool>,
}

/// A batch's writes, decided and not yet made: the changed tasks (handle,
/// record as loaded, record now), the accepted receipts with their
/// outputs, the audit rows, and the tasks whose unique slot is released.
/// A claim in the same transaction makes them with its own leases, in one
/// statement ([`write_with`](Self::write_with)).
pub(crate) struct AckWrites<'a> {
    changes: Vec<(TaskHandle, TaskRecord, TaskRecord)>,
    receipts: Vec<(TaskHandle, Receipt, Option<&'a [u8]>)>,
    events: Vec<AuditEvent>,
    released: Vec<TaskHandle>,
    at: DateTime<Utc>,
}

impl AckWrites<'_> {
    /// Whether the batch changed the task `handle` names.
    pub(crate) fn changes_task(&self, handle: TaskHandle) -> bool {
        self.changes.iter().any(|(changed, ..)| *changed == handle)
    }

    /// Makes the batch's writes, with `changes` and `events` of other
    /// tasks after its own, in one set-based write.
    pub(crate) fn write_with(
        &self,
        writer: &dyn WriteTransaction,
        changes: &[TaskChange<'_>],
        events: &[AuditEvent],
    ) -> Result<(), Error> {
        let mut all: Vec<TaskChange<'_>> = self
            .changes
            .iter()
            .map(|(handle, before, after)| TaskChange {
                handle: *handle,
                before,
                after,
                at: self.at,
            })
            .collect();
        all.extend_from_slice(changes);
        let receipts: Vec<NewReceipt<'_>> = self
            .receipts
            .iter()
            .map(|(handle, receipt, output)| NewReceipt {
                handle: *handle,
                receipt,
                output: *output,
            })
            .collect();
        // The batch's own audit rows are copied only when others join
        // them: an acknowledgement alone writes them as they are.
        let audit: Cow<'_, [AuditEvent]> = if events.is_empty() {
            Cow::Borrowed(&self.events)
        } else {
            Cow::Owned([self.events.as_slice(), events].concat())
        };
        writer.write_acknowledged(&all, &receipts, &audit)?;
        for handle in &self.released {
            writer.release_unique_slot(*handle)?;
        }
        dependency::settle(writer, dependency::ended(&all), self.at)
    }
}

impl Store {
    /// A submission checked on the caller's thread: its permissions and
    /// size, and while writes are refused, its replay (read, not written).
    pub(crate) fn submission(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
    ) -> Result<Checked, Error> {
        let task = &request.task;
        let scope = self.admit(caller, &task.namespace, Scope::Claim, Action::Submit)?;
        if let Some(bytes) = &request.output.bytes {
            check_output_size(bytes.len())
                .map_err(Error::from)
                .inspect_err(|error| self.count(&scope, error.outcome()))?;
        }
        let submission = Submission {
            principal: caller.lease_principal(),
            token: request.token,
            key: request.key.clone(),
            digest: request.output.digest,
        };
        if self.is_refusing_writes() {
            // Reads keep working while writes are refused: a replay is
            // answered from a read connection.
            let stored = self
                .read(|reader| {
                    let handle = reader.find_task(task)?.ok_or_else(|| purged(task))?;
                    Ok(reader.receipt(task, handle, &submission.principal, &request.key)?)
                })
                .inspect_err(|error| self.count(&scope, error.outcome()))?;
            if let Some(stored) = stored {
                return match decide_idempotency(Some(&stored.receipt), &submission) {
                    Idempotency::Replay(receipt) => {
                        self.count(&scope, Outcome::Ok);
                        Ok(Checked::Answered(Submitted::Replayed(receipt)))
                    }
                    _ => {
                        let error = Error::from(LeaseError::IdempotencyConflict);
                        self.count(&scope, error.outcome());
                        Err(error)
                    }
                };
            }
        }
        Ok(Checked::Ack(Ack {
            scope,
            task: task.clone(),
            kind: AckKind::Submit {
                submission,
                output: request.output.bytes.clone(),
            },
        }))
    }

    /// A failure report checked on the caller's thread.
    pub(crate) fn failure_report(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        failure: Failure,
    ) -> Result<Ack, Error> {
        self.failure_report_as(caller, task, token, failure, Action::Fail)
    }

    /// [`failure_report`](Self::failure_report) audited as `action`.
    pub(crate) fn failure_report_as(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        failure: Failure,
        action: Action,
    ) -> Result<Ack, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Claim, action)?;
        let mut failure = failure;
        // Whole milliseconds from a whole-millisecond now.
        match failure.retry {
            Retry::After(backoff) => failure.retry = Retry::After(whole_millis(backoff)),
            Retry::Snooze(delay) => failure.retry = Retry::Snooze(whole_millis(delay)),
            Retry::Never | Retry::Backoff => {}
        }
        Ok(Ack {
            scope,
            task: task.clone(),
            kind: AckKind::Fail {
                holder: caller.lease_principal(),
                token,
                failure,
            },
        })
    }

    /// Hands `acks` to the completer and waits for their answers, in
    /// order.
    pub(crate) fn acknowledge(&self, acks: Vec<Ack>) -> Vec<AckAnswer> {
        if acks.is_empty() {
            return Vec::new();
        }
        self.completer
            .complete(acks, &|batch| self.commit_acks(batch), &|| {
                Err(Error::Storage(StorageError::new(
                    StorageErrorKind::Other,
                    None,
                    "the acknowledgement's commit was interrupted; its outcome is unknown",
                )))
            })
    }

    /// One batch: its transaction, then each caller's counting and the
    /// store's upkeep.
    fn commit_acks(&self, batch: Vec<Ack>) -> Vec<AckAnswer> {
        let now = self.now_utc();
        // Principals whose `last_used_at` is due, if their action writes.
        let mut due: Vec<PrincipalId> = Vec::new();
        for ack in &batch {
            if let Some(principal) = self.due_observation(&ack.scope, now) {
                if !due.contains(&principal) {
                    due.push(principal);
                }
            }
        }
        let mut carried_for = Vec::new();
        let result = self.write_with_tail(|writer| {
            let decided = self.decide(writer, &batch, now)?;
            carried_for =
                due.iter()
                    .copied()
                    .filter(|principal| {
                        batch.iter().zip(&decided.audited).any(|(ack, audited)| {
                            *audited && ack.scope.principal == Some(*principal)
                        })
                    })
                    .collect();
            if !carried_for.is_empty() {
                writer.optional(&mut |writer| {
                    carried_for
                        .iter()
                        .try_for_each(|principal| writer.touch_principal(*principal, now))
                });
            }
            Ok(decided)
        });
        match result {
            Ok((decided, carried)) => {
                for principal in &carried_for {
                    self.observed(Some(*principal), carried, now);
                }
                self.acks_committed(&batch, &decided);
                decided.answers.into_iter().map(Ok).collect()
            }
            Err(error) => {
                for ack in &batch {
                    self.count(&ack.scope, error.outcome());
                }
                vec![Err(error); batch.len()]
            }
        }
    }

    /// What follows a batch's commit: each unaudited acknowledgement's
    /// count (an audited one is counted by its row), the changed
    /// namespaces' signals and the store's upkeep.
    pub(crate) fn acks_committed(&self, batch: &[Ack], decided: &Decided) {
        let mut changed: Vec<&tessera_lease::Namespace> = Vec::new();
        for ((ack, answer), audited) in batch.iter().zip(&decided.answers).zip(&decided.audited) {
            match answer {
                _ if *audited => {
                    if !changed.contains(&&ack.task.namespace) {
                        changed.push(&ack.task.namespace);
                    }
                }
                Ok(_) => self.count(&ack.scope, Outcome::Ok),
                Err(error) => self.count(&ack.scope, error.outcome()),
            }
        }
        for namespace in &changed {
            self.namespace_changed(namespace);
        }
        if !changed.is_empty() {
            self.after_write();
        }
        crate::observe::acks_committed(batch.len());
    }

    /// The batch's reads, rules and writes inside its transaction.
    pub(crate) fn decide(
        &self,
        writer: &dyn WriteTransaction,
        batch: &[Ack],
        now: DateTime<Utc>,
    ) -> Result<Decided, Error> {
        let (decided, writes) = self.decide_unwritten(writer, batch, now)?;
        writes.write_with(writer, &[], &[])?;
        Ok(decided)
    }

    /// The batch's reads and rules inside its transaction, and the writes
    /// they decided, not yet made.
    pub(crate) fn decide_unwritten<'a>(
        &self,
        writer: &dyn WriteTransaction,
        batch: &'a [Ack],
        now: DateTime<Utc>,
    ) -> Result<(Decided, AckWrites<'a>), Error> {
        let mut refs: Vec<&TaskRef> = batch.iter().map(|ack| &ack.task).collect();
        refs.sort_unstable();
        refs.dedup();
        let loaded = writer.lock_tasks(&refs)?;
        let mut held: HashMap<&TaskRef, Result<Held, Error>> = HashMap::with_capacity(refs.len());
        for (task, loaded) in refs.iter().zip(loaded) {
            let entry = match loaded {
                // Every acknowledgement carries a fencing token.
                None => Err(purged(task)),
                Some(loaded) => Task::restore(loaded.record.clone())
                    .map(|rules| Held {
                        handle: loaded.handle,
                        before: loaded.record,
                        rules,
                        unique: loaded.unique_held,
                    })
                    .map_err(Error::from),
            };
            held.insert(task, entry);
        }
        // Every receipt the batch's keys name, read at once.
        let mut keys: Vec<ReceiptKey<'_>> = Vec::new();
        for ack in batch {
            if let (AckKind::Submit { submission, .. }, Some(Ok(task))) =
                (&ack.kind, held.get(&ack.task))
            {
                let key = ReceiptKey {
                    task: &ack.task,
                    handle: task.handle,
                    principal: &submission.principal,
                    key: &submission.key,
                };
                if !keys.iter().any(|k| same_key(k, &key)) {
                    keys.push(key);
                }
            }
        }
        let stored = writer.receipts_by_key(&keys)?;
        let mut receipts: HashMap<(TaskHandle, &Principal, &IdempotencyKey), Receipt> = keys
            .iter()
            .zip(stored)
            .filter_map(|(key, stored)| {
                stored.map(|stored| ((key.handle, key.principal, key.key), stored.receipt))
            })
            .collect();

        let mut answers = Vec::with_capacity(batch.len());
        let mut audited = Vec::with_capacity(batch.len());
        let mut accepted: Vec<(TaskHandle, Receipt, Option<&[u8]>)> = Vec::new();
        let mut events = Vec::new();
        for ack in batch {
            let task = match held.get_mut(&ack.task) {
                Some(Ok(task)) => task,
                Some(Err(error)) => {
                    answers.push(Err(error.clone()));
                    audited.push(false);
                    continue;
                }
                None => unreachable!("every reference was looked up"),
            };
            let (answer, resource) = match &ack.kind {
                AckKind::Submit { submission, output } => {
                    let lookup = (task.handle, &submission.principal, &submission.key);
                    match task.rules.submit(submission, receipts.get(&lookup), now) {
                        Ok(Submitted::Accepted(receipt)) => {
                            let resource = ack.task.grant_resource(receipt.attempt, receipt.token);
                            receipts.insert(lookup, receipt.clone());
                            accepted.push((task.handle, receipt.clone(), output.as_deref()));
                            (
                                Ok(Acked::Submitted(Submitted::Accepted(receipt))),
                                Some(resource),
                            )
                        }
                        Ok(replayed) => (Ok(Acked::Submitted(replayed)), None),
                        Err(error) => match self.stale_acceptance(
                            &ack.task,
                            &task.rules,
                            submission,
                            &error,
                            now,
                        ) {
                            Some(receipt) => {
                                (Ok(Acked::Submitted(Submitted::Accepted(receipt))), None)
                            }
                            None => (Err(Error::from(error)), None),
                        },
                    }
                }
                AckKind::Fail {
                    holder,
                    token,
                    failure,
                } => {
                    let failed = task.rules.fail(
                        holder,
                        *token,
                        now,
                        failure.clone(),
                        &mut self.jitter.lock(),
                    );
                    match failed {
                        Ok(state) => (
                            Ok(Acked::Failed(state)),
                            Some(ack.task.resource(&format!("/t{token}"))),
                        ),
                        Err(error) => (Err(Error::from(error)), None),
                    }
                }
            };
            audited.push(resource.is_some());
            if let Some(resource) = resource {
                events.push(ack.scope.event(now, resource));
            }
            answers.push(answer);
        }

        let held: Vec<Held> = held.into_values().filter_map(Result::ok).collect();
        let writes = AckWrites {
            // Tasks whose attempts left the states their unique slot
            // counts.
            released: held
                .iter()
                .filter(|task| task.rules.record().leaves_unique_slot(task.unique))
                .map(|task| task.handle)
                .collect(),
            changes: held
                .into_iter()
                .filter(|task| task.before != *task.rules.record())
                .map(|task| (task.handle, task.before, task.rules.into_record()))
                .collect(),
            receipts: accepted,
            events,
            at: now,
        };
        Ok((Decided { answers, audited }, writes))
    }
}

impl Ack {
    /// This submission as a backend may accept it in one statement, with
    /// the next claim: its audit row as an acceptance of the task's first
    /// attempt would write it. `None`
    /// for a failure report.
    pub(crate) fn quick_submit(&self, now: DateTime<Utc>) -> Option<QuickSubmit<'_>> {
        let AckKind::Submit { submission, output } = &self.kind else {
            return None;
        };
        let first = AttemptNumber::FIRST;
        let resource = self.task.grant_resource(first, submission.token);
        Some(QuickSubmit {
            task: &self.task,
            submission,
            output: output.as_deref(),
            event: EventRow::from_event(&self.scope.event(now, resource)),
        })
    }
}

/// The answer to a submission that `submit` (an [`Ack::quick_submit`])
/// put to a statement that accepted it, as the lease rules give it from
/// the task the statement found: an error if the statement's writes are
/// not theirs.
pub(crate) fn checked_acceptance(
    submit: &QuickSubmit<'_>,
    acceptance: &QuickAcceptance,
    now: DateTime<Utc>,
) -> Result<Submitted, Error> {
    let differs =
        || crate::error::corrupt("a one-statement submission that differs from the lease rules");
    let before = &acceptance.before;
    let mut rules = Task::restore(before.record.clone())?;
    let Submitted::Accepted(receipt) = rules.submit(submit.submission, None, now)? else {
        return Err(differs());
    };
    let after = rules.record();
    let expected = after
        .attempts
        .iter()
        .find(|attempt| attempt.number == receipt.attempt)
        .map(|attempt| AttemptRow::from_record(attempt, after.lapse_backoff));
    if expected.as_ref() != Some(&acceptance.after)
        || receipt.accepted_at != acceptance.accepted_at
        || submit.event.resource != acceptance.resource
        || claimable_column(&before.record) != claimable_column(after)
        || before.record.last_token != after.last_token
        || after.leaves_unique_slot(before.unique_held)
    {
        return Err(differs());
    }
    Ok(Submitted::Accepted(receipt))
}

impl Decided {
    /// One acknowledgement's: `answer`, audited if it is `Ok`.
    pub(crate) fn one(answer: Result<Acked, Error>) -> Self {
        Self {
            audited: vec![answer.is_ok()],
            answers: vec![answer],
        }
    }
}

/// What a submission checked on its caller's thread came to.
pub(crate) enum Checked {
    /// For the completer.
    Ack(Ack),
    /// Answered already (a replay read while writes are refused).
    Answered(Submitted),
}

fn same_key(a: &ReceiptKey<'_>, b: &ReceiptKey<'_>) -> bool {
    a.handle == b.handle && a.principal == b.principal && a.key == b.key
}

impl Store {
    /// The receipt a store with [`InjectedFault::AcceptStaleSubmits`]
    /// answers for a submission the lease rules refused for its lease:
    /// for the attempt that lease was on (or the first), stored nowhere.
    /// `None` without the fault, or for any other refusal.
    ///
    /// [`InjectedFault::AcceptStaleSubmits`]: crate::faults::InjectedFault::AcceptStaleSubmits
    #[cfg(feature = "fault-injection")]
    fn stale_acceptance(
        &self,
        task: &TaskRef,
        rules: &Task,
        submission: &Submission,
        error: &LeaseError,
        now: DateTime<Utc>,
    ) -> Option<Receipt> {
        use crate::faults::InjectedFault;
        if self.config.injected_fault() != Some(InjectedFault::AcceptStaleSubmits) {
            return None;
        }
        if !matches!(
            error,
            LeaseError::StaleToken { .. }
                | LeaseError::LeaseExpired { .. }
                | LeaseError::LeaseEnded { .. }
                | LeaseError::WrongHolder { .. }
        ) {
            return None;
        }
        let attempt = rules
            .attempts()
            .iter()
            .find(|attempt| {
                attempt
                    .lease
                    .as_ref()
                    .is_some_and(|lease| lease.token == submission.token)
            })
            .or_else(|| rules.attempts().first())?
            .number;
        Some(Receipt {
            task: task.id.clone(),
            version: task.version,
            attempt,
            token: submission.token,
            principal: submission.principal.clone(),
            idempotency_key: submission.key.clone(),
            artifact: tessera_lease::ArtifactKey::for_grant(&task.id, attempt, submission.token),
            digest: submission.digest,
            accepted_at: now,
        })
    }

    /// Whether a deliberate bug is switched on: the one-statement paths
    /// then step aside, so every acknowledgement meets it.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn injects_faults(&self) -> bool {
        self.config.injected_fault().is_some()
    }

    /// Without the `fault-injection` feature: never.
    #[cfg(not(feature = "fault-injection"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn injects_faults(&self) -> bool {
        false
    }

    /// Without the `fault-injection` feature: never.
    #[cfg(not(feature = "fault-injection"))]
    #[allow(clippy::unused_self)]
    fn stale_acceptance(
        &self,
        _task: &TaskRef,
        _rules: &Task,
        _submission: &Submission,
        _error: &LeaseError,
        _now: DateTime<Utc>,
    ) -> Option<Receipt> {
        None
    }
}
