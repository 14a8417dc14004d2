//! Task operations: enqueue, heartbeat, submit, fail, lease expiry and
//! the reads of tasks, receipts and alternatives, each applying
//! `tessera-lease`'s rules inside one transaction.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_audit::{Action, Outcome, Resource};
use tessera_lease::{
    AttemptNumber, BriefVersion, Duplicate, Failure, FencingToken, IdempotencyKey, Lease,
    LeaseError, MAX_ALTERNATIVES, Namespace, PartitionKey, QueueName, Receipt, Submitted, Task,
    TaskId, TaskRecord, TaskSpec, TaskState, UniqueKey, UniqueMode, UniqueSlot, UniqueStates,
    Uniqueness, check_progress_size, decide_duplicate,
};

use crate::backend::{
    LoadedTask, NamespaceKind, NewTask, NewUnique, ReadTransaction, TaskHandle, WriteTransaction,
};
use crate::error::{ConflictKind, Error, StorageError, StorageErrorKind};
use crate::model::access::{Caller, PrincipalKind, Scope};
use crate::model::audit::Trail;
use crate::model::bulk::AttemptProgress;
use crate::model::task::{
    Brief, EnqueueOptions, Enqueued, MAX_ENQUEUE_BATCH, MAX_TASKS_LISTED, Output, PRACTICE_QUEUE,
    StoredReceipt, SubmitRequest, TaskPage, TaskQuery, TaskRef, TaskView, not_found, purged,
};
use crate::ops::ack::{Ack, Acked, Checked};
use crate::store::Store;

/// A task loaded by reference, with its brief if asked; `404` if none.
fn load_task(
    reader: &dyn ReadTransaction,
    task: &TaskRef,
    with_brief: bool,
) -> Result<LoadedTask, Error> {
    reader
        .task(task, with_brief)?
        .ok_or_else(|| not_found(task))
}

/// A task loaded by reference: where it is, its lease rules, and the
/// states in which it holds a unique slot if it does; `404` if none.
fn load(
    reader: &dyn ReadTransaction,
    task: &TaskRef,
) -> Result<(TaskHandle, Task, Option<UniqueStates>), Error> {
    let loaded = load_task(reader, task, false)?;
    Ok((
        loaded.handle,
        Task::restore(loaded.record)?,
        loaded.unique_held,
    ))
}

/// `error`, a call under a fencing token's: a task not found was purged
/// (`410`), since a token names a task that once was.
fn under_token(error: Error, task: &TaskRef) -> Error {
    match error {
        Error::NotFound { .. } => purged(task),
        other => other,
    }
}

/// Where a task is, without its attempts; `404` if none.
fn find(reader: &dyn ReadTransaction, task: &TaskRef) -> Result<TaskHandle, Error> {
    reader.find_task(task)?.ok_or_else(|| not_found(task))
}

/// Applies one lease rule to `task`, stored at `handle`, and writes what it
/// changed; `held` is where it holds a unique slot ([`LoadedTask`]'s
/// `unique_held`), released here if its attempts left those states.
pub(crate) fn apply<T>(
    writer: &dyn WriteTransaction,
    handle: TaskHandle,
    held: Option<UniqueStates>,
    task: &mut Task,
    now: DateTime<Utc>,
    rule: impl FnOnce(&mut Task) -> Result<T, LeaseError>,
) -> Result<T, Error> {
    let before = task.record().clone();
    let value = rule(task)?;
    writer.save_task(handle, &before, task.record(), now)?;
    if leaves_slot(held, task.record()) {
        writer.release_unique_slot(handle)?;
    }
    Ok(value)
}

/// Whether a task that holds a unique slot in the states `held` lets it go,
/// its attempts now as `record` says ([`tessera_lease::holds`]).
pub(crate) fn leaves_slot(held: Option<UniqueStates>, record: &TaskRecord) -> bool {
    held.is_some_and(|counted| {
        !tessera_lease::holds(counted, record.attempts.iter().map(|a| a.state.name()))
    })
}

/// New task ids for one enqueue call: the time in milliseconds (12 hex
/// digits), then 64 bits, random for the call's first id and counting up
/// from there for the rest of a batch. Ids made later sort later, so a
/// batch's inserts into the id index fall on its last pages instead of one
/// random page each, and a batch asks the system for randomness once.
struct NewIds {
    millis: i64,
    next: Option<u64>,
}

impl NewIds {
    fn at(now: DateTime<Utc>) -> Self {
        Self {
            millis: now.timestamp_millis().max(0),
            next: None,
        }
    }

    fn next(&mut self) -> Result<TaskId, Error> {
        let bits = match self.next {
            Some(bits) => bits,
            None => {
                let mut bytes = [0_u8; 8];
                getrandom::fill(&mut bytes).map_err(|_| Error::RandomnessUnavailable)?;
                u64::from_be_bytes(bytes)
            }
        };
        self.next = Some(bits.wrapping_add(1));
        let id = format!("t-{:012x}{bits:016x}", self.millis);
        Ok(TaskId::parse(&id).expect("t-<hex> is a task id"))
    }
}

impl Store {
    /// Puts a task with a versioned brief into `queue` of `namespace` and
    /// returns its reference.
    ///
    /// Needs the `enqueue` scope and a grant for the namespace (`403`
    /// otherwise, counted). The brief is refused over
    /// [`MAX_BRIEF_BYTES`](tessera_lease::MAX_BRIEF_BYTES) (`400`); an id and
    /// version already enqueued in the namespace is `409`. One transaction:
    /// the namespace row on its first use, the task, one row per attempt and
    /// the audit row. Afterwards the queue's empty-claim pacing starts again
    /// at 5 s and long-polls on the queue wake.
    ///
    /// A unique enqueue ([`EnqueueOptions::with_unique`]) that duplicates a
    /// task returns that task; [`enqueue_one`](Self::enqueue_one) also says
    /// whether it created one.
    pub fn enqueue(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        brief: &Brief,
        options: &EnqueueOptions,
    ) -> Result<TaskRef, Error> {
        self.enqueue_one(caller, namespace, queue, brief, options)
            .map(|enqueued| enqueued.task)
    }

    /// [`enqueue`](Self::enqueue), answered as
    /// [`enqueue_batch`](Self::enqueue_batch) answers each task: its
    /// reference, and whether this call created it.
    ///
    /// Only a unique enqueue ([`EnqueueOptions::with_unique`]) answers
    /// `created: false`: its slot was held, and the answer names the task
    /// that holds it. Such a duplicate writes nothing (no task, no audit
    /// row; it is counted), unless its mode replaces or debounces a task
    /// still waiting ([`decide_duplicate`]): then that task takes the new
    /// brief and not-before time, audited as `enqueue` naming it. The slot
    /// is taken by an insert into a unique index, never a lock, so
    /// concurrent enqueues of one key create exactly one task.
    pub fn enqueue_one(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        brief: &Brief,
        options: &EnqueueOptions,
    ) -> Result<Enqueued, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::Enqueue)?;
        let now = self.now_utc();
        let prepared = prepare(namespace, brief, options, now, &mut NewIds::at(now))
            .inspect_err(|error| self.count(&scope, error.outcome()))?;
        let principal = caller.principal().to_string();
        let task = &prepared.task;
        let (enqueued, changed) = self.perform_or_count(&scope, now, |writer| {
            self.open_namespace(writer, caller, namespace, now)?;
            if let Some(unique) = &prepared.unique {
                if let Some((holder, replaced)) =
                    take_or_duplicate(writer, namespace, queue, &prepared, unique, now)?
                {
                    let trail = if replaced {
                        Trail::Row(holder.resource(""))
                    } else {
                        Trail::Count(Outcome::Ok)
                    };
                    let enqueued = Enqueued {
                        task: holder,
                        created: false,
                    };
                    return Ok(((enqueued, replaced), trail));
                }
            }
            let inserted = prepared.insert(writer, queue, now, &principal)?;
            if !inserted {
                return Err(Error::conflict(
                    ConflictKind::TaskExists,
                    format!("task {task} already exists"),
                ));
            }
            writer.signal_enqueued(namespace, queue)?;
            let enqueued = Enqueued {
                task: task.clone(),
                created: true,
            };
            Ok(((enqueued, true), Trail::Row(task.resource(""))))
        })?;
        if changed {
            self.namespace_changed(namespace);
            self.queue_received_work(namespace, queue);
        }
        Ok(enqueued)
    }

    /// Puts up to [`MAX_ENQUEUE_BATCH`](crate::limits::MAX_ENQUEUE_BATCH)
    /// tasks into `queue` of `namespace` in one transaction, and returns
    /// each one's reference in order, with whether it was created.
    ///
    /// Idempotent per task: a task whose id and version are already in the
    /// namespace (enqueued before, or earlier in the same batch) is left as
    /// it is and reported with `created: false`, so a batch sent again
    /// after a lost answer adds nothing twice. A unique task whose slot is
    /// held, by a stored task or by an earlier task of the same batch (the
    /// first of a slot wins), is reported with `created: false` and the
    /// holder's reference, as [`enqueue_one`](Self::enqueue_one) reports
    /// it, replacing or debouncing the holder if its mode says so. Each
    /// brief and spec is checked before anything is written; one bad task,
    /// or an empty or oversized batch, is a `400` that enqueues none. Same
    /// permissions as [`enqueue`](Self::enqueue). One audit row,
    /// `enqueue_batch`, names the queue and the count created.
    pub fn enqueue_batch(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        tasks: &[(Brief, EnqueueOptions)],
    ) -> Result<Vec<Enqueued>, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::EnqueueBatch)?;
        let now = self.now_utc();
        let prepared = (|| {
            if tasks.is_empty() || tasks.len() > MAX_ENQUEUE_BATCH {
                return Err(Error::InvalidInput {
                    reason: format!(
                        "a batch holds 1 to {MAX_ENQUEUE_BATCH} tasks, not {}",
                        tasks.len()
                    ),
                });
            }
            let mut ids = NewIds::at(now);
            tasks
                .iter()
                .map(|(brief, options)| prepare(namespace, brief, options, now, &mut ids))
                .collect::<Result<Vec<_>, Error>>()
        })()
        .inspect_err(|error| self.count(&scope, error.outcome()))?;
        let principal = caller.principal().to_string();
        let (enqueued, changed) = self.perform(&scope, now, |writer| {
            self.open_namespace(writer, caller, namespace, now)?;
            // Each unique task takes its slot, or finds who holds it: a
            // stored task, or the first task of the batch with that slot.
            // One whose reference is stored already is that task, as a
            // plain enqueue answers, and leaves the slot to the next.
            let mut plans = Vec::with_capacity(prepared.len());
            let mut first_of_slot: HashMap<&UniqueSlot, usize> = HashMap::new();
            for (place, task) in prepared.iter().enumerate() {
                let plan = match &task.unique {
                    None => Plan::Insert,
                    Some(_) if writer.find_task(&task.task)?.is_some() => Plan::Exists,
                    Some(unique) => match first_of_slot.get(&unique.slot) {
                        Some(&first) => Plan::Earlier(first),
                        None => {
                            first_of_slot.insert(&unique.slot, place);
                            // Taken below, in slot order.
                            Plan::Insert
                        }
                    },
                };
                plans.push(plan);
            }
            // Slots are taken in their own order, so two batches of the
            // same keys in other orders never wait on each other in a
            // circle (PostgreSQL would end one as a deadlock).
            let mut taking: Vec<(&UniqueSlot, usize)> = first_of_slot.into_iter().collect();
            taking.sort_unstable();
            for (slot, place) in taking {
                let ends_at = prepared[place].unique.as_ref().and_then(|u| u.ends_at);
                if let Some(holder) = writer.take_unique_slot(
                    namespace,
                    queue,
                    slot,
                    ends_at,
                    &prepared[place].task,
                )? {
                    plans[place] = Plan::Stored(holder);
                }
            }
            // The holders a duplicate reads (a replacing or debouncing one
            // changes them, and one past its deadline is ended) are locked
            // at once, in one order, for the same reason.
            let mut holders: Vec<&TaskRef> = plans
                .iter()
                .filter_map(|plan| match plan {
                    Plan::Stored(holder) => Some(holder),
                    _ => None,
                })
                .collect();
            holders.sort_unstable();
            holders.dedup();
            if !holders.is_empty() {
                writer.lock_tasks(&holders)?;
            }
            let new: Vec<NewTask<'_>> = prepared
                .iter()
                .zip(&plans)
                .filter(|(_, plan)| matches!(plan, Plan::Insert))
                .map(|(task, _)| task.new_task(queue, now, &principal))
                .collect();
            let mut inserted = writer.insert_tasks(&new)?.into_iter();
            let mut enqueued: Vec<Enqueued> = Vec::with_capacity(prepared.len());
            let mut replaced = false;
            for (task, plan) in prepared.iter().zip(&plans) {
                let answer = match plan {
                    Plan::Insert => {
                        let created = inserted.next().unwrap_or(false);
                        if let (false, Some(unique)) = (created, &task.unique) {
                            // Its reference was stored meanwhile (another
                            // process's enqueue): the slot goes back, and a
                            // later task of the batch would name a holder
                            // that holds nothing, so the batch is tried
                            // again.
                            writer.free_unique_slot(namespace, queue, &unique.slot)?;
                            if plans.contains(&Plan::Earlier(enqueued.len())) {
                                return Err(retryable(
                                    "a task of the batch was enqueued by another process meanwhile",
                                ));
                            }
                        }
                        Enqueued {
                            task: task.task.clone(),
                            created,
                        }
                    }
                    Plan::Exists => Enqueued {
                        task: task.task.clone(),
                        created: false,
                    },
                    Plan::Stored(holder) => Enqueued {
                        task: holder.clone(),
                        created: false,
                    },
                    Plan::Earlier(first) => Enqueued {
                        task: enqueued[*first].task.clone(),
                        created: false,
                    },
                };
                let mut answer = answer;
                if let (false, Some(unique)) = (answer.created, &task.unique) {
                    if matches!(plan, Plan::Stored(_) | Plan::Earlier(_)) {
                        match duplicate(writer, task, unique, &answer.task, now)? {
                            Some(changed) => replaced |= changed,
                            // Its holder was past its deadline and let the
                            // slot go: this task takes it and is inserted.
                            None if matches!(plan, Plan::Stored(_))
                                && writer
                                    .take_unique_slot(
                                        namespace,
                                        queue,
                                        &unique.slot,
                                        unique.ends_at,
                                        &task.task,
                                    )?
                                    .is_none()
                                && writer
                                    .insert_task(&task.new_task(queue, now, &principal))? =>
                            {
                                answer = Enqueued {
                                    task: task.task.clone(),
                                    created: true,
                                };
                            }
                            None => {
                                return Err(retryable(
                                    "a unique key's holder let go of it meanwhile",
                                ));
                            }
                        }
                    }
                }
                enqueued.push(answer);
            }
            let created = enqueued.iter().filter(|e| e.created).count();
            if created > 0 || replaced {
                writer.signal_enqueued(namespace, queue)?;
            }
            let resource = Resource::new(&format!("queue:{queue}/n{created}")).ok();
            Ok(((enqueued, created > 0 || replaced), resource))
        })?;
        if changed {
            self.namespace_changed(namespace);
            self.queue_received_work(namespace, queue);
        }
        Ok(enqueued)
    }

    /// Creates `namespace`'s row on its first use. A session's namespace
    /// also gets its practice tasks then, never when the session is minted.
    pub(crate) fn open_namespace(
        &self,
        writer: &dyn WriteTransaction,
        caller: &Caller,
        namespace: &Namespace,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let session = caller.kind() == PrincipalKind::Anonymous;
        let kind = if session {
            NamespaceKind::Session
        } else {
            NamespaceKind::Keyed
        };
        // A session's namespace goes with the session.
        let purge_at = if session { caller.expires_at() } else { None };
        let created = writer.insert_namespace(namespace, kind, now, purge_at)?;
        if created && session {
            let queue = QueueName::parse(PRACTICE_QUEUE).expect("a valid queue name");
            let principal = caller.principal().to_string();
            for n in 1..=self.config.session_practice_tasks() {
                let id = TaskId::parse(&format!("practice-{n}")).expect("a valid task id");
                let record =
                    Task::new(id.clone(), BriefVersion::FIRST, TaskSpec::default())?.into_record();
                let task = TaskRef::new(namespace.clone(), id, BriefVersion::FIRST);
                let brief = serde_json::json!({ "practice": n, "task": "return the brief" });
                let bytes = serde_json::to_vec(&brief).expect("a JSON value serializes");
                writer.insert_task(&NewTask {
                    task: &task,
                    queue: &queue,
                    brief: &bytes,
                    brief_format: "json",
                    record: &record,
                    created_at: now,
                    enqueued_by: &principal,
                    partition_key: None,
                    unique_key: None,
                    unique: None,
                    drawn_id: false,
                })?;
            }
        }
        Ok(())
    }

    /// Extends the lease `token` on `task` that `caller` holds, by the
    /// task's own lease length
    /// ([`EnqueueOptions::with_lease_duration`](crate::EnqueueOptions::with_lease_duration))
    /// or else the store's, from now (never shortening it, and never past
    /// the task's deadline).
    ///
    /// Needs the `claim` scope and the namespace grant. A stale, foreign or
    /// expired token, or a lease that ended, is `409 conflict`; a task that
    /// is not there is `410 task_purged` (under a token it was once made;
    /// a purged task and one never made look alike). Writes the attempt's expiry (its row and its entry in
    /// the leased-attempts index) and the audit row, never the task row: a
    /// leased task is out of the claim index, and its lapse is found
    /// through that entry. Never enters claim admission.
    pub fn heartbeat(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
    ) -> Result<Lease, Error> {
        self.beat(caller, task, token, None)
    }

    /// A [`heartbeat`](Self::heartbeat) that also reports progress: a
    /// small JSON value (at most
    /// [`MAX_PROGRESS_BYTES`](tessera_lease::MAX_PROGRESS_BYTES) as compact
    /// text) stored on the lease's attempt, in the statement that moves
    /// its expiry. Listings and [`read_task`](Self::read_task) show the
    /// attempt's last progress; a submission's output is kept apart, as
    /// ever.
    ///
    /// A value over the cap is `400 invalid_input` before anything is
    /// read; a stale, foreign or expired token is `409`, as for a plain
    /// heartbeat, and its progress is not stored.
    pub fn heartbeat_with_progress(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        progress: &serde_json::Value,
    ) -> Result<Lease, Error> {
        self.beat(caller, task, token, Some(progress))
    }

    fn beat(
        &self,
        caller: &Caller,
        task: &TaskRef,
        token: FencingToken,
        progress: Option<&serde_json::Value>,
    ) -> Result<Lease, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Claim, Action::Heartbeat)?;
        let progress = progress
            .map(|value| {
                let text = serde_json::to_string(value).expect("a JSON value serializes");
                check_progress_size(text.len()).map(|()| text)
            })
            .transpose()
            .map_err(Error::from)
            .inspect_err(|error| self.count(&scope, error.outcome()))?;
        let now = self.now_utc();
        let holder = caller.lease_principal();
        let extension = self.config.lease_duration();
        let lease = self.perform(&scope, now, |writer| {
            let (handle, mut rules, held) =
                load(writer.reads(), task).map_err(|error| under_token(error, task))?;
            let before = rules.record().clone();
            let lease = rules.heartbeat(&holder, token, now, extension)?;
            match &progress {
                None => writer.save_task(handle, &before, rules.record(), now)?,
                Some(text) => writer.save_heartbeat(
                    handle,
                    &before,
                    rules.record(),
                    now,
                    lease.attempt(),
                    text,
                )?,
            }
            if leaves_slot(held, rules.record()) {
                writer.release_unique_slot(handle)?;
            }
            let resource = task.grant_resource(lease.attempt(), lease.token());
            Ok((lease, resource))
        })?;
        self.namespace_changed(&task.namespace);
        Ok(lease)
    }

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

    /// An operator's retry: every failed, discarded or cancelled attempt of
    /// `task` becomes ready again, with one more try than it has had if it
    /// was out of tries ([`Task::retry`]). Its next claim grants a fresh
    /// token. Returns the attempts retried.
    ///
    /// Needs the `enqueue` scope and the namespace grant (an admin has
    /// both); `409 nothing_to_retry` if no attempt is failed, discarded or
    /// cancelled. Audited as `retry_task` naming the task.
    pub fn retry_task(&self, caller: &Caller, task: &TaskRef) -> Result<Vec<AttemptNumber>, Error> {
        self.operate(caller, task, Action::RetryTask, Task::retry)
    }

    /// An operator's cancel: every attempt of `task` not yet final becomes
    /// cancelled ([`Task::cancel`]), a leased one included, and leaves the
    /// claim indexes. The holder of a cancelled lease learns it at its next
    /// heartbeat, submit or failure report, as `409 task_cancelled`, and
    /// nothing it sends is accepted. Returns the attempts cancelled.
    ///
    /// Needs the `enqueue` scope and the namespace grant (an admin has
    /// both); `409 nothing_to_cancel` if every attempt is final. Audited as
    /// `cancel_task` naming the task. [`retry_task`](Self::retry_task)
    /// undoes it.
    pub fn cancel_task(
        &self,
        caller: &Caller,
        task: &TaskRef,
    ) -> Result<Vec<AttemptNumber>, Error> {
        self.operate(caller, task, Action::CancelTask, Task::cancel)
    }

    /// An operator's rule on `task` (the `enqueue` scope and the grant),
    /// applied in one transaction and audited as `action` naming the task.
    fn operate(
        &self,
        caller: &Caller,
        task: &TaskRef,
        action: Action,
        rule: fn(&mut Task) -> Result<Vec<AttemptNumber>, LeaseError>,
    ) -> Result<Vec<AttemptNumber>, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Enqueue, action)?;
        let now = self.now_utc();
        let changed = self.perform(&scope, now, |writer| {
            let (handle, mut rules, held) = load(writer.reads(), task)?;
            let changed = apply(writer, handle, held, &mut rules, now, rule)?;
            Ok((changed, task.resource("")))
        })?;
        self.namespace_changed(&task.namespace);
        Ok(changed)
    }

    /// Returns the lapsed leases of `namespace` to their attempts' next
    /// state (ready, or a lapse backoff), at most `limit` tasks per call,
    /// and returns the tasks changed.
    ///
    /// Optional upkeep for hosts with a timer: a claim already takes over
    /// a lapsed lease whether or not this ran (it searches leases by when
    /// they lapse). The expired leases are found by reading the namespace's
    /// entries in the partial `attempts_leased` index (one per leased
    /// attempt, never a table scan). Not audited.
    pub fn expire_leases(
        &self,
        namespace: &Namespace,
        limit: usize,
    ) -> Result<Vec<TaskRef>, Error> {
        let now = self.now_utc();
        let changed = self.write(|writer| {
            let mut changed = Vec::new();
            for loaded in writer.lapsed_tasks(namespace, None, now, limit.max(1))? {
                let mut rules = Task::restore(loaded.record)?;
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
                    continue;
                }
                let record = rules.record();
                changed.push(TaskRef::new(
                    namespace.clone(),
                    record.id.clone(),
                    record.version,
                ));
            }
            Ok(changed)
        })?;
        if !changed.is_empty() {
            self.namespace_changed(namespace);
        }
        Ok(changed)
    }

    /// Lists a namespace's attempts in one state ([`TaskQuery`]), a page at
    /// a time: each with its task, queue, state and tries, oldest or newest
    /// first, and the cursor of the next page. A discarded attempt found
    /// here is put back by [`retry_task`](Self::retry_task).
    ///
    /// One search of an index on (namespace, state, task, attempt) per
    /// page, however many tasks the namespace holds. Needs the `read` scope
    /// and the namespace grant; the limit is held to 1 to
    /// [`MAX_TASKS_LISTED`](crate::limits::MAX_TASKS_LISTED), as
    /// [`list_keys`](Self::list_keys) holds its own. Audited as `list_tasks`.
    pub fn list_tasks(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        query: &TaskQuery,
    ) -> Result<TaskPage, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ListTasks)?;
        let limit = query.limit.clamp(1, MAX_TASKS_LISTED);
        self.perform_read(&scope, |reader| {
            let rows =
                reader.tasks_by_state(namespace, query.state, query.order, query.after, limit)?;
            let next = (rows.len() == limit)
                .then(|| rows.last().map(|(cursor, _)| *cursor))
                .flatten();
            let tasks = rows.into_iter().map(|(_, listing)| listing).collect();
            Ok((TaskPage { tasks, next }, None))
        })
    }

    /// Reads a task: its brief, queue, attempts and leases. Needs the
    /// `read` scope and the namespace grant; audited as `read_task` naming
    /// the task.
    pub fn read_task(&self, caller: &Caller, task: &TaskRef) -> Result<TaskView, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ReadTask)?;
        self.perform_read(&scope, |reader| {
            let loaded = load_task(reader, task, true)?;
            let view = TaskView {
                task: task.clone(),
                queue: loaded.queue,
                brief: loaded
                    .brief
                    .ok_or_else(|| crate::error::corrupt("task brief"))?,
                created_at: loaded.created_at,
                partition_key: loaded.partition_key,
                unique_key: loaded.unique_key,
                // Checked by the lease rules, as every record read.
                record: Task::restore(loaded.record)?.into_record(),
                progress: reader
                    .progress_of_task(loaded.handle)?
                    .into_iter()
                    .map(|(attempt, text)| {
                        let progress = serde_json::from_str(&text)
                            .map_err(|_| crate::error::corrupt("attempt progress"))?;
                        Ok(AttemptProgress { attempt, progress })
                    })
                    .collect::<Result<_, Error>>()?,
            };
            Ok((view, task.resource("")))
        })
    }

    /// Reads the execution receipt of one attempt of `task`, with its
    /// output. Needs the `read` scope and the namespace grant; `404` if the
    /// attempt has none. Audited as `read_receipt` naming the run
    /// (`task:<id>@<version>/a<attempt>/t<token>`).
    pub fn read_receipt(
        &self,
        caller: &Caller,
        task: &TaskRef,
        attempt: AttemptNumber,
    ) -> Result<StoredReceipt, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ReadReceipt)?;
        self.perform_read(&scope, |reader| {
            let handle = find(reader, task)?;
            let stored = reader
                .receipts_of_attempt(task, handle, attempt)?
                .into_iter()
                .next()
                .ok_or_else(|| Error::NotFound {
                    what: format!("receipt of {task} attempt {attempt}"),
                })?;
            let resource = task.grant_resource(stored.receipt.attempt, stored.receipt.token);
            Ok((stored, resource))
        })
    }

    /// The finished alternatives of `task`: one receipt per done attempt,
    /// in attempt order, with outputs, for a comparison step. Needs the
    /// `read` scope and the namespace grant; audited as `list_attempts`.
    pub fn alternatives(
        &self,
        caller: &Caller,
        task: &TaskRef,
    ) -> Result<Vec<StoredReceipt>, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ListAttempts)?;
        self.perform_read(&scope, |reader| {
            let (handle, rules, _) = load(reader, task)?;
            let stored = reader.receipts_of_task(task, handle, usize::from(MAX_ALTERNATIVES))?;
            let chosen: Vec<StoredReceipt> = {
                let receipts: Vec<&Receipt> = stored.iter().map(|s| &s.receipt).collect();
                let kept = rules.alternatives(receipts.iter().copied());
                stored
                    .iter()
                    .filter(|s| kept.contains(&&s.receipt))
                    .cloned()
                    .collect()
            };
            Ok((chosen, task.resource("")))
        })
    }
}

/// A task checked and encoded for its insert.
struct Prepared<'a> {
    task: TaskRef,
    bytes: std::borrow::Cow<'a, [u8]>,
    format: &'static str,
    record: TaskRecord,
    partition_key: Option<&'a PartitionKey>,
    /// Its uniqueness and slot, if it takes one.
    unique: Option<PreparedUnique<'a>>,
    /// Its unique key, kept on the task whether or not it takes a slot.
    unique_key: Option<&'a UniqueKey>,
    /// Whether its id was drawn here rather than given.
    drawn_id: bool,
}

/// A unique task's rule and the slot it takes.
struct PreparedUnique<'a> {
    rule: &'a Uniqueness,
    slot: UniqueSlot,
    /// When the slot's window ends, if it has one.
    ends_at: Option<DateTime<Utc>>,
}

/// What a batch does with one of its tasks.
#[derive(PartialEq, Eq)]
enum Plan {
    /// Insert it (a unique one has taken its slot).
    Insert,
    /// It is stored already: the answer is the task itself, not created.
    Exists,
    /// A duplicate of this stored task.
    Stored(TaskRef),
    /// A duplicate of the batch's task at this place.
    Earlier(usize),
}

/// Encodes the brief, picks the id and lets the lease rules check the
/// spec and the uniqueness, before anything is written. A unique task
/// takes a slot only if its first states are counted ([`Uniqueness::holds`]).
fn prepare<'a>(
    namespace: &Namespace,
    brief: &'a Brief,
    options: &'a EnqueueOptions,
    now: DateTime<Utc>,
    ids: &mut NewIds,
) -> Result<Prepared<'a>, Error> {
    let (bytes, format) = brief.encode()?;
    if let Some(unique) = &options.unique {
        unique.validate()?;
    }
    let id = match &options.task_id {
        Some(id) => id.clone(),
        None => ids.next()?,
    };
    let version = options.version.unwrap_or(BriefVersion::FIRST);
    let mut spec = options.spec;
    if let Some(timeout) = options.timeout {
        let at = TimeDelta::from_std(timeout)
            .ok()
            .and_then(|timeout| now.checked_add_signed(timeout))
            .ok_or_else(|| Error::InvalidInput {
                reason: format!("timeout {timeout:?} is out of range"),
            })?;
        let at = DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at);
        spec.deadline = Some(spec.deadline.map_or(at, |deadline| deadline.min(at)));
    }
    if !spec.can_meet_deadline(now) {
        return Err(Error::InvalidInput {
            reason: "a task's deadline must come after its enqueue and its not-before time"
                .to_owned(),
        });
    }
    if let Some(duration) = spec.lease_duration
        && duration.subsec_nanos() % 1_000_000 != 0
    {
        return Err(Error::InvalidInput {
            reason: format!("a task's lease duration must be whole milliseconds, got {duration:?}"),
        });
    }
    let record = Task::new(id.clone(), version, spec)?.into_record();
    let unique = options
        .unique
        .as_ref()
        .filter(|rule| rule.holds(record.attempts.iter().map(|a| a.state.name())))
        .map(|rule| PreparedUnique {
            rule,
            slot: rule.slot(now),
            ends_at: rule.slot_ends_at(now),
        });
    Ok(Prepared {
        task: TaskRef::new(namespace.clone(), id, version),
        bytes,
        format,
        record,
        partition_key: options.partition_key.as_ref(),
        unique,
        unique_key: options.unique.as_ref().map(|unique| &unique.key),
        drawn_id: options.task_id.is_none(),
    })
}

/// How often an enqueue tries a unique key whose holder lets go of it
/// between the read and the lock before it answers a retryable error.
const UNIQUE_TURNS: usize = 4;

/// A storage error a caller may retry as it is: nothing was written.
fn retryable(reason: &str) -> Error {
    Error::Storage(StorageError::new(
        StorageErrorKind::Retryable,
        None,
        reason.to_owned(),
    ))
}

/// Takes `unique`'s slot for `prepared` (`None`: insert the task), or
/// answers the task that holds it and whether the duplicate changed that
/// holder ([`duplicate`]). A holder that let go of the slot between its
/// read and its lock (another process claimed or ended it) leaves the
/// slot to be taken again.
fn take_or_duplicate(
    writer: &dyn WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    prepared: &Prepared<'_>,
    unique: &PreparedUnique<'_>,
    now: DateTime<Utc>,
) -> Result<Option<(TaskRef, bool)>, Error> {
    for _ in 0..UNIQUE_TURNS {
        let Some(holder) = writer.take_unique_slot(
            namespace,
            queue,
            &unique.slot,
            unique.ends_at,
            &prepared.task,
        )?
        else {
            return Ok(None);
        };
        if let Some(replaced) = duplicate(writer, prepared, unique, &holder, now)? {
            return Ok(Some((holder, replaced)));
        }
    }
    Err(retryable("a unique key changed hands too often"))
}

/// What a duplicate enqueue of `prepared` does to `holder`, the task that
/// holds its slot ([`decide_duplicate`]): nothing, or a waiting holder
/// takes its brief and not-before time. Returns whether it changed the
/// holder; `None` if the holder, once locked, holds the slot no more (a
/// mode that keeps the holder answers from the read alone).
fn duplicate(
    writer: &dyn WriteTransaction,
    prepared: &Prepared<'_>,
    unique: &PreparedUnique<'_>,
    holder: &TaskRef,
    now: DateTime<Utc>,
) -> Result<Option<bool>, Error> {
    let loaded = writer
        .lock_tasks(&[holder])?
        .pop()
        .flatten()
        .ok_or_else(|| not_found(holder))?;
    if loaded.unique_held.is_none() {
        return Ok(None);
    }
    let mut rules = Task::restore(loaded.record)?;
    if rules.past_deadline(now) {
        // A holder past its deadline can never run: its end is recorded
        // now (discarded, deadline_exceeded), which lets its slot go, and
        // the enqueue takes the slot again.
        let ended = apply(
            writer,
            loaded.handle,
            loaded.unique_held,
            &mut rules,
            now,
            |rules| Ok(rules.expire(now)),
        )?;
        if !ended.is_empty() && leaves_slot(loaded.unique_held, rules.record()) {
            return Ok(None);
        }
    }
    if unique.rule.mode == UniqueMode::Keep {
        return Ok(Some(false));
    }
    let seen = tessera_lease::Holder {
        waiting: rules.is_waiting(),
        enqueued_at: loaded.created_at,
    };
    match decide_duplicate(unique.rule.mode, seen, prepared.record_not_before(), now) {
        Duplicate::Keep => Ok(Some(false)),
        Duplicate::Replace { not_before } => {
            if !rules.can_run_from(not_before.unwrap_or(now)) {
                return Err(Error::InvalidInput {
                    reason: "this duplicate would move the waiting task's not-before time to or \
                             past its deadline, where it could never run"
                        .to_owned(),
                });
            }
            writer.replace_brief(loaded.handle, &prepared.bytes, prepared.format)?;
            apply(
                writer,
                loaded.handle,
                loaded.unique_held,
                &mut rules,
                now,
                |rules| rules.reschedule(not_before),
            )?;
            Ok(Some(true))
        }
    }
}

impl Prepared<'_> {
    /// The insert of it into `queue`.
    fn new_task<'a>(
        &'a self,
        queue: &'a QueueName,
        now: DateTime<Utc>,
        enqueued_by: &'a str,
    ) -> NewTask<'a> {
        NewTask {
            task: &self.task,
            queue,
            brief: &self.bytes,
            brief_format: self.format,
            record: &self.record,
            created_at: now,
            enqueued_by,
            partition_key: self.partition_key,
            unique_key: self.unique_key,
            unique: self.unique.as_ref().map(|unique| NewUnique {
                slot: &unique.slot,
                states: unique.rule.states,
            }),
            drawn_id: self.drawn_id,
        }
    }

    /// The not-before time the enqueue asked for: its attempts' schedule.
    fn record_not_before(&self) -> Option<DateTime<Utc>> {
        self.record
            .attempts
            .first()
            .and_then(|attempt| match attempt.state {
                TaskState::Scheduled { at } => Some(at),
                _ => None,
            })
    }

    /// Inserts it; `false` if its reference exists.
    fn insert(
        &self,
        writer: &dyn WriteTransaction,
        queue: &QueueName,
        now: DateTime<Utc>,
        enqueued_by: &str,
    ) -> Result<bool, Error> {
        Ok(writer.insert_task(&self.new_task(queue, now, enqueued_by))?)
    }
}
