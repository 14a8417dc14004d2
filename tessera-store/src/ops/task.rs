//! Task operations outside a lease: an operator's retry and cancel, lease
//! expiry, and the reads of tasks, receipts and alternatives, each
//! applying `tessera-lease`'s rules inside one transaction; and the
//! helpers every task operation loads and applies a task with.

use chrono::{DateTime, Utc};
use tessera_audit::Action;
use tessera_lease::{
    AttemptNumber, LeaseError, MAX_ALTERNATIVES, Namespace, Receipt, Task, UniqueStates,
};

use crate::backend::{LoadedTask, ReadTransaction, TaskHandle, WriteTransaction};
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::bulk::AttemptProgress;
use crate::model::task::{
    MAX_TASKS_LISTED, ParentAlternatives, StoredReceipt, TaskPage, TaskQuery, TaskRef, TaskView,
    not_found, purged,
};
use crate::ops::dependency;
use crate::store::Store;

/// A task loaded by reference, with its brief if asked; `404` if none.
pub(crate) fn load_task(
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
pub(crate) fn load(
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
pub(crate) fn under_token(error: Error, task: &TaskRef) -> Error {
    match error {
        Error::NotFound { .. } => purged(task),
        other => other,
    }
}

/// Where a task is, without its attempts; `404` if none.
pub(crate) fn find(reader: &dyn ReadTransaction, task: &TaskRef) -> Result<TaskHandle, Error> {
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
    dependency::keep_waiting(writer, handle, &before, task)?;
    writer.save_task(handle, &before, task.record(), now)?;
    if task.record().leaves_unique_slot(held) {
        writer.release_unique_slot(handle)?;
    }
    dependency::settle_one(writer, handle, &before, task.record(), now)?;
    Ok(value)
}

impl Store {
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

    /// What a task enqueued [after](crate::EnqueueOptions::after) others
    /// consumes: for each of its parents, in the order they were stored,
    /// its finished alternatives (one receipt per done attempt, in
    /// attempt order, with outputs, as [`alternatives`](Self::alternatives)
    /// answers them; none for a parent that ended without one). A parent
    /// purged meanwhile is left out. Needs the `read` scope and the
    /// namespace grant; audited as `list_attempts` naming the task.
    pub fn parent_alternatives(
        &self,
        caller: &Caller,
        task: &TaskRef,
    ) -> Result<Vec<ParentAlternatives>, Error> {
        let scope = self.admit(caller, &task.namespace, Scope::Read, Action::ListAttempts)?;
        self.perform_read(&scope, |reader| {
            let handle = find(reader, task)?;
            let mut parents = Vec::new();
            for parent in reader.parents_of(handle)? {
                let Some(loaded) = reader.task(&parent, false)? else {
                    continue;
                };
                let rules = Task::restore(loaded.record)?;
                let stored = reader.receipts_of_task(
                    &parent,
                    loaded.handle,
                    usize::from(MAX_ALTERNATIVES),
                )?;
                let receipts: Vec<&Receipt> = stored.iter().map(|s| &s.receipt).collect();
                let kept = rules.alternatives(receipts.iter().copied());
                let receipts = stored
                    .iter()
                    .filter(|s| kept.contains(&&s.receipt))
                    .cloned()
                    .collect();
                parents.push(ParentAlternatives { parent, receipts });
            }
            Ok((parents, task.resource("")))
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
