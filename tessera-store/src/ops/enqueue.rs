//! Enqueue: new tasks one at a time or in a batch, unique tasks and their
//! duplicates, and the namespace a first enqueue opens.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_audit::{Action, Outcome, Resource};
use tessera_lease::{
    BriefVersion, Duplicate, Namespace, PartitionKey, QueueName, RunAfter, Task, TaskId,
    TaskRecord, TaskSpec, TaskState, UniqueKey, UniqueMode, UniqueSlot, Uniqueness,
    decide_duplicate,
};

use crate::backend::{NamespaceKind, NewTask, NewUnique, WriteTransaction};
use crate::error::{ConflictKind, Error, StorageError, StorageErrorKind};
use crate::model::access::{Caller, PrincipalKind, Scope};
use crate::model::audit::Trail;
use crate::model::task::{
    Brief, EnqueueOptions, Enqueued, MAX_ENQUEUE_BATCH, PRACTICE_QUEUE, TaskRef, not_found,
};
use crate::ops::dependency::{self, NewChild};
use crate::ops::task::apply;
use crate::store::Store;

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
            dependency::start(writer, &[prepared.child(true)], now)?;
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
            let children: Vec<NewChild<'_>> = prepared
                .iter()
                .zip(&enqueued)
                .map(|(task, answer)| task.child(answer.created && answer.task == task.task))
                .collect();
            dependency::start(writer, &children, now)?;
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
    /// The tasks it runs after, and when.
    parents: &'a [TaskRef],
    run_after: RunAfter,
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
    // A task with parents starts waiting; its enqueue starts it once
    // they are found (`dependency::start`).
    spec.waits = !options.parents.is_empty();
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
        parents: &options.parents,
        run_after: options.run_after,
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
        if !ended.is_empty() && rules.record().leaves_unique_slot(loaded.unique_held) {
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

    /// It as [`dependency::start`] reads it.
    fn child(&self, created: bool) -> NewChild<'_> {
        NewChild {
            task: &self.task,
            parents: self.parents,
            run_after: self.run_after,
            created,
        }
    }

    /// The not-before time the enqueue asked for: its attempts' schedule.
    fn record_not_before(&self) -> Option<DateTime<Utc>> {
        self.record
            .attempts
            .first()
            .and_then(|attempt| match attempt.state {
                TaskState::Scheduled { at }
                | TaskState::Waiting {
                    not_before: Some(at),
                } => Some(at),
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
