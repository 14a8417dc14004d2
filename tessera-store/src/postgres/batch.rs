//! Set-based statements on PostgreSQL: many tasks, receipts or audit rows
//! in one statement each, their values passed as arrays and read back
//! with `unnest`, so a batch of any size costs the same round trips.
//!
//! Each statement is a file of `sql/`; one function or `params` here
//! builds its arguments, in the order and under the names its SQL gives
//! them, and its answer is read by column name.

use std::collections::HashMap;

use tessera_audit::AuditEvent;
use tessera_lease::{PartitionKey, UniqueKey};

use super::claim::Named;
use super::rows::{attempt_row, receipt_row, task_row, version};
use super::transactions::PgTransaction;
use crate::backend::rows::{
    AttemptRow, AttemptWrite, EventRow, ReceiptColumns, TaskRow, acknowledged_writes,
    claimable_column, corrupt, duration_millis, millis, timing_columns,
};
use crate::backend::{LoadedTask, NewReceipt, NewTask, ReceiptKey, Result, TaskChange};
use crate::model::task::{StoredReceipt, TaskRef};

/// The tasks named by their references, locked, with their attempts.
pub(super) const LOCK_AND_LOAD: &str = include_str!("sql/lock_and_load.sql");
/// A queue's first claimable tasks, locked, with their attempts.
pub(super) const LOCK_CLAIMABLE: &str = include_str!("sql/lock_claimable.sql");
/// The receipts stored under many keys.
pub(super) const RECEIPTS_BY_KEYS: &str = include_str!("sql/receipts_by_keys.sql");
/// What a batch decided, in one statement.
pub(super) const WRITE_ACKNOWLEDGED: &str = include_str!("sql/write_acknowledged.sql");
/// Many tasks, in order, a reference that exists skipped.
pub(super) const INSERT_TASKS: &str = include_str!("sql/insert_tasks.sql");
/// [`INSERT_TASKS`] for tasks whose ids the store drew.
pub(super) const INSERT_NEW_TASKS: &str = include_str!("sql/insert_new_tasks.sql");
/// The attempts of many new tasks.
pub(super) const INSERT_ATTEMPTS: &str = include_str!("sql/insert_attempts.sql");

/// The answers' columns beside a task's and an attempt's, in their
/// tables' own names: a task's namespace ([`LOCK_AND_LOAD`],
/// [`LOCK_CLAIMABLE`]), whether a lapse is due ([`LOCK_CLAIMABLE`]), a
/// key's place from 1 ([`RECEIPTS_BY_KEYS`]), and the rows changed
/// ([`WRITE_ACKNOWLEDGED`]).
const NAMESPACE: &str = "namespace";
const LAPSE_DUE: &str = "lapse_due";
const PLACE: &str = "place";
const CHANGED: &str = "changed";
/// What [`INSERT_TASKS`] answers for each task it inserted.
const INSERTED: [&str; 4] = ["id", "namespace", "task_id", "version"];

/// [`LOCK_AND_LOAD`]'s arguments: one array element a task.
#[derive(Debug, Default)]
pub(super) struct LockAndLoadArgs<'a> {
    pub(super) namespaces: Vec<&'a str>,
    pub(super) task_ids: Vec<&'a str>,
    pub(super) versions: Vec<i64>,
}

impl LockAndLoadArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 3] {
        [
            ("namespaces", &self.namespaces),
            ("task_ids", &self.task_ids),
            ("versions", &self.versions),
        ]
    }
}

/// [`LOCK_CLAIMABLE`]'s arguments.
#[derive(Debug, Default)]
pub(super) struct LockClaimableArgs<'a> {
    pub(super) namespace: &'a str,
    pub(super) queue: &'a str,
    pub(super) now: i64,
    pub(super) count: i64,
}

impl LockClaimableArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 4] {
        [
            ("namespace", &self.namespace),
            ("queue", &self.queue),
            ("now", &self.now),
            ("count", &self.count),
        ]
    }
}

/// [`RECEIPTS_BY_KEYS`]'s arguments: one array element a key.
#[derive(Debug, Default)]
pub(super) struct ReceiptsByKeysArgs<'a> {
    pub(super) principals: Vec<&'a str>,
    pub(super) tasks: Vec<i64>,
    pub(super) idempotency_keys: Vec<&'a str>,
}

impl ReceiptsByKeysArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 3] {
        [
            ("principals", &self.principals),
            ("tasks", &self.tasks),
            ("idempotency_keys", &self.idempotency_keys),
        ]
    }
}

/// The values of a statement's named arguments, in order.
pub(super) fn values<'a>(named: &[Named<'a>]) -> Vec<&'a (dyn postgres::types::ToSql + Sync)> {
    named.iter().map(|(_, value)| *value).collect()
}

/// Where a task's row is looked up by its reference.
fn reference(task: &TaskRef) -> (String, String, i64) {
    (
        task.namespace.as_str().to_owned(),
        task.id.as_str().to_owned(),
        version(task),
    )
}

impl PgTransaction<'_> {
    /// The tasks `tasks` names, locked, with their attempts: one
    /// statement.
    pub(super) fn lock_tasks_at_once(&self, tasks: &[&TaskRef]) -> Result<Vec<Option<LoadedTask>>> {
        let args = LockAndLoadArgs {
            namespaces: tasks.iter().map(|t| t.namespace.as_str()).collect(),
            task_ids: tasks.iter().map(|t| t.id.as_str()).collect(),
            versions: tasks.iter().map(|t| version(t)).collect(),
        };
        let rows = self.query(LOCK_AND_LOAD, &values(&args.params()))?;
        let mut found: HashMap<(String, String, i64), (TaskRow, Vec<AttemptRow>)> =
            HashMap::with_capacity(tasks.len());
        for row in &rows {
            let task = task_row(row)?;
            let namespace: String = row.try_get(NAMESPACE)?;
            let attempt = attempt_row(row)?;
            found
                .entry((namespace, task.task_id.clone(), task.version))
                .or_insert_with(|| (task, Vec::new()))
                .1
                .push(attempt);
        }
        tasks
            .iter()
            .map(|task| match found.remove(&reference(task)) {
                None => Ok(None),
                Some((row, attempts)) => row.loaded(attempts).map(Some),
            })
            .collect()
    }

    /// See [`WriteTransaction::lock_claimable`]: one statement
    /// ([`LOCK_CLAIMABLE`]).
    pub(super) fn lock_claimable_at_once(
        &self,
        namespace: &str,
        queue: &str,
        now: i64,
        count: i64,
    ) -> Result<Option<Vec<LoadedTask>>> {
        let args = LockClaimableArgs {
            namespace,
            queue,
            now,
            count,
        };
        let rows = self.query(LOCK_CLAIMABLE, &values(&args.params()))?;
        if rows.is_empty() {
            // No claimable task: whether a lapse is due is the general
            // claim's to find.
            return Ok(None);
        }
        let mut tasks: Vec<(TaskRow, Vec<AttemptRow>)> = Vec::new();
        for row in &rows {
            if row.try_get::<_, bool>(LAPSE_DUE)? {
                return Ok(None);
            }
            let attempt = attempt_row(row)?;
            let id: i64 = row.try_get("id")?;
            match tasks.last_mut() {
                Some((task, attempts)) if task.id == id => attempts.push(attempt),
                _ => tasks.push((task_row(row)?, vec![attempt])),
            }
        }
        tasks
            .into_iter()
            .map(|(task, attempts)| task.loaded(attempts))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub(super) fn receipts_at_once(
        &self,
        keys: &[ReceiptKey<'_>],
    ) -> Result<Vec<Option<StoredReceipt>>> {
        let mut answers: Vec<Option<StoredReceipt>> = vec![None; keys.len()];
        if keys.is_empty() {
            return Ok(answers);
        }
        let args = ReceiptsByKeysArgs {
            principals: keys.iter().map(|k| k.principal.as_str()).collect(),
            tasks: keys.iter().map(|k| k.handle.0).collect(),
            idempotency_keys: keys.iter().map(|k| k.key.as_str()).collect(),
        };
        for row in self.query(RECEIPTS_BY_KEYS, &values(&args.params()))? {
            let place: i64 = row.try_get(PLACE)?;
            let index = usize::try_from(place - 1).map_err(|_| corrupt("receipt row"))?;
            if let Some(key) = keys.get(index) {
                answers[index] = Some(receipt_row(&row)?.stored(key.task)?);
            }
        }
        Ok(answers)
    }

    /// What a batch decided, in one statement ([`WRITE_ACKNOWLEDGED`]);
    /// a change of another kind (progress with its lease's expiry, a retry's
    /// tries) is written as one task's, before it.
    pub(super) fn write_acknowledged_at_once(
        &self,
        changes: &[TaskChange<'_>],
        receipts: &[NewReceipt<'_>],
        events: &[AuditEvent],
    ) -> Result<()> {
        let mut states: Vec<(i64, AttemptRow, i64, Option<ReceiptColumns>)> = Vec::new();
        let mut wholes: Vec<(i64, AttemptRow, i64)> = Vec::new();
        let mut expiries: Vec<(i64, AttemptRow)> = Vec::new();
        // A task's new token counter and claim column, each if it moved.
        let mut claimables: Vec<(i64, Option<Option<i64>>, Option<i64>)> = Vec::new();
        for (change, mut writes) in changes.iter().zip(acknowledged_writes(changes, receipts)?) {
            let id = change.handle.0;
            let mut rest = Vec::new();
            for write in std::mem::take(&mut writes.attempts) {
                match write {
                    AttemptWrite::State(row) => {
                        let receipt = writes.receipt(row.number).cloned();
                        states.push((id, row, millis(change.at), receipt));
                    }
                    AttemptWrite::Whole(row) => wholes.push((id, row, millis(change.at))),
                    // Progress is written with its lease's expiry.
                    AttemptWrite::Expiry(row)
                        if writes
                            .progress
                            .as_ref()
                            .is_none_or(|(n, _)| *n != row.number) =>
                    {
                        expiries.push((id, row));
                    }
                    other @ AttemptWrite::Expiry(_) => rest.push(other),
                }
            }
            writes.attempts = rest;
            if writes.last_token.is_some() || writes.claimable_at.is_some() {
                claimables.push((id, writes.claimable_at.take(), writes.last_token.take()));
            }
            if !writes.is_empty() {
                self.write_task(change.handle, writes)?;
            }
        }
        if states.is_empty()
            && wholes.is_empty()
            && expiries.is_empty()
            && claimables.is_empty()
            && events.is_empty()
        {
            return Ok(());
        }
        let rows: Vec<EventRow> = events.iter().map(EventRow::from_event).collect();
        let args = AcknowledgedArgs {
            state_task: states.iter().map(|(id, ..)| *id).collect(),
            state_number: states.iter().map(|(_, r, ..)| r.number).collect(),
            state_state: states.iter().map(|(_, r, ..)| r.state.as_str()).collect(),
            state_until_at: states.iter().map(|(_, r, ..)| r.until_at).collect(),
            state_lapses_at: states.iter().map(|(_, r, ..)| r.lapses_at).collect(),
            state_discarded: states
                .iter()
                .map(|(_, r, ..)| r.discarded.as_deref())
                .collect(),
            state_last_error: states
                .iter()
                .map(|(_, r, ..)| r.last_error.as_deref())
                .collect(),
            state_changed_at: states.iter().map(|(_, _, at, _)| *at).collect(),
            state_idempotency_key: states
                .iter()
                .map(|(.., receipt)| receipt.as_ref().map(|r| r.idempotency_key.as_str()))
                .collect(),
            state_digest: states
                .iter()
                .map(|(.., receipt)| receipt.as_ref().map(|r| r.digest.as_str()))
                .collect(),
            state_accepted_at: states
                .iter()
                .map(|(.., receipt)| receipt.as_ref().map(|r| r.accepted_at))
                .collect(),
            state_output: states
                .iter()
                .map(|(.., receipt)| receipt.as_ref().and_then(|r| r.output.as_deref()))
                .collect(),
            whole_task: wholes.iter().map(|(id, ..)| *id).collect(),
            whole_number: wholes.iter().map(|(_, r, _)| r.number).collect(),
            whole_state: wholes.iter().map(|(_, r, _)| r.state.as_str()).collect(),
            whole_until_at: wholes.iter().map(|(_, r, _)| r.until_at).collect(),
            whole_tries: wholes.iter().map(|(_, r, _)| r.tries).collect(),
            whole_holder: wholes.iter().map(|(_, r, _)| r.holder.as_deref()).collect(),
            whole_token: wholes.iter().map(|(_, r, _)| r.token).collect(),
            whole_granted_at: wholes.iter().map(|(_, r, _)| r.granted_at).collect(),
            whole_expires_at: wholes.iter().map(|(_, r, _)| r.expires_at).collect(),
            whole_lapses_at: wholes.iter().map(|(_, r, _)| r.lapses_at).collect(),
            whole_discarded: wholes
                .iter()
                .map(|(_, r, _)| r.discarded.as_deref())
                .collect(),
            whole_last_error: wholes
                .iter()
                .map(|(_, r, _)| r.last_error.as_deref())
                .collect(),
            whole_changed_at: wholes.iter().map(|(.., at)| *at).collect(),
            expiry_task: expiries.iter().map(|(id, _)| *id).collect(),
            expiry_number: expiries.iter().map(|(_, r)| r.number).collect(),
            expiry_expires_at: expiries.iter().map(|(_, r)| r.expires_at).collect(),
            expiry_lapses_at: expiries.iter().map(|(_, r)| r.lapses_at).collect(),
            claim_task: claimables.iter().map(|(id, ..)| *id).collect(),
            claim_claimable_at: claimables.iter().map(|(_, at, _)| at.flatten()).collect(),
            claim_last_token: claimables.iter().map(|(.., token)| *token).collect(),
            claim_moves: claimables.iter().map(|(_, at, _)| at.is_some()).collect(),
            audit_at: rows.iter().map(|r| r.at).collect(),
            audit_principal: rows.iter().map(|r| r.principal.as_str()).collect(),
            audit_namespace: rows.iter().map(|r| r.namespace.as_str()).collect(),
            audit_action: rows.iter().map(|r| r.action.as_str()).collect(),
            audit_outcome: rows.iter().map(|r| r.outcome.as_str()).collect(),
            audit_resource: rows.iter().map(|r| r.resource.as_deref()).collect(),
            audit_ip_hash: rows.iter().map(|r| r.ip_hash.as_deref()).collect(),
        };
        let changed = self.query(WRITE_ACKNOWLEDGED, &values(&args.params()))?;
        let changed: i64 = match changed.first() {
            Some(row) => row.try_get(CHANGED)?,
            None => 0,
        };
        self.add_rows(u64::try_from(changed).unwrap_or(0));
        Ok(())
    }

    pub(super) fn insert_tasks_at_once(&self, tasks: &[NewTask<'_>]) -> Result<Vec<bool>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let (lease_ms, deadline_at): (Vec<Option<i64>>, Vec<Option<i64>>) =
            tasks.iter().map(|t| timing_columns(t.record)).unzip();
        let args = InsertTasksArgs {
            namespace: tasks.iter().map(|t| t.task.namespace.as_str()).collect(),
            queue: tasks.iter().map(|t| t.queue.as_str()).collect(),
            task_id: tasks.iter().map(|t| t.task.id.as_str()).collect(),
            version: tasks.iter().map(|t| version(t.task)).collect(),
            brief: tasks.iter().map(|t| t.brief).collect(),
            brief_format: tasks.iter().map(|t| t.brief_format).collect(),
            alternatives: tasks
                .iter()
                .map(|t| t.record.attempts.len() as i64)
                .collect(),
            lapse_backoff_ms: tasks
                .iter()
                .map(|t| duration_millis(t.record.lapse_backoff))
                .collect(),
            max_tries: tasks
                .iter()
                .map(|t| i64::from(t.record.max_tries))
                .collect(),
            claimable_at: tasks.iter().map(|t| claimable_column(t.record)).collect(),
            created_at: tasks.iter().map(|t| millis(t.created_at)).collect(),
            enqueued_by: tasks.iter().map(|t| t.enqueued_by).collect(),
            priority: tasks.iter().map(|t| i64::from(t.record.priority)).collect(),
            partition_key: tasks
                .iter()
                .map(|t| t.partition_key.map(PartitionKey::as_str))
                .collect(),
            unique_key: tasks
                .iter()
                .map(|t| t.unique_key.map(UniqueKey::as_str))
                .collect(),
            unique_slot: tasks
                .iter()
                .map(|t| t.unique.map(|u| u.slot.as_str()))
                .collect(),
            unique_states: tasks
                .iter()
                .map(|t| t.unique.map(|u| i64::from(u.states.bits())))
                .collect(),
            lease_ms,
            deadline_at,
        };
        let statement = if tasks.iter().all(|task| task.drawn_id) {
            INSERT_NEW_TASKS
        } else {
            INSERT_TASKS
        };
        let inserted = self.query(statement, &values(&args.params()))?;
        self.add_rows(inserted.len() as u64);
        let mut ids: HashMap<(String, String, i64), i64> = HashMap::with_capacity(inserted.len());
        for row in &inserted {
            ids.insert(
                (
                    row.try_get(INSERTED[1])?,
                    row.try_get(INSERTED[2])?,
                    row.try_get(INSERTED[3])?,
                ),
                row.try_get(INSERTED[0])?,
            );
        }
        let mut created = Vec::with_capacity(tasks.len());
        let mut attempts: Vec<(i64, &NewTask<'_>, AttemptRow)> = Vec::new();
        for task in tasks {
            // The first of a reference takes its row; a repeat finds it gone.
            let id = ids.remove(&reference(task.task));
            created.push(id.is_some());
            if let Some(id) = id {
                attempts.extend(task.record.attempts.iter().map(|attempt| {
                    let row = AttemptRow::from_record(attempt, task.record.lapse_backoff);
                    (id, task, row)
                }));
            }
        }
        if !attempts.is_empty() {
            let args = InsertAttemptsArgs {
                task: attempts.iter().map(|(id, ..)| *id).collect(),
                number: attempts.iter().map(|(.., row)| row.number).collect(),
                namespace: attempts
                    .iter()
                    .map(|(_, t, _)| t.task.namespace.as_str())
                    .collect(),
                queue: attempts.iter().map(|(_, t, _)| t.queue.as_str()).collect(),
                state: attempts
                    .iter()
                    .map(|(.., row)| row.state.as_str())
                    .collect(),
                until_at: attempts.iter().map(|(.., row)| row.until_at).collect(),
                priority: attempts
                    .iter()
                    .map(|(_, t, _)| i64::from(t.record.priority))
                    .collect(),
                changed_at: attempts
                    .iter()
                    .map(|(_, t, _)| millis(t.created_at))
                    .collect(),
            };
            self.execute(INSERT_ATTEMPTS, &values(&args.params()))?;
        }
        Ok(created)
    }
}

/// The columns each batch statement's answer is read by, for the check
/// that its SQL answers them: [`LOCK_AND_LOAD`]'s, [`LOCK_CLAIMABLE`]'s,
/// [`RECEIPTS_BY_KEYS`]', [`WRITE_ACKNOWLEDGED`]'s and the inserts'.
#[cfg(test)]
pub(super) fn answer_columns() -> [(&'static str, Vec<&'static str>); 5] {
    use super::rows::{AttemptColumns, TaskColumns, receipt_columns};
    let mut locked = TaskColumns::PLAIN.names();
    locked.push(NAMESPACE);
    locked.extend(AttemptColumns::PLAIN.names());
    let mut claimable = locked.clone();
    claimable.push(LAPSE_DUE);
    let mut receipts = receipt_columns().to_vec();
    receipts.push(PLACE);
    [
        (LOCK_AND_LOAD, locked),
        (LOCK_CLAIMABLE, claimable),
        (RECEIPTS_BY_KEYS, receipts),
        (WRITE_ACKNOWLEDGED, vec![CHANGED]),
        (INSERT_TASKS, INSERTED.to_vec()),
    ]
}

/// [`WRITE_ACKNOWLEDGED`]'s arguments: one array a column, one element a
/// row written, grouped as the statement's parts are.
#[derive(Debug, Default)]
pub(super) struct AcknowledgedArgs<'a> {
    pub(super) state_task: Vec<i64>,
    pub(super) state_number: Vec<i64>,
    pub(super) state_state: Vec<&'a str>,
    pub(super) state_until_at: Vec<Option<i64>>,
    pub(super) state_lapses_at: Vec<Option<i64>>,
    pub(super) state_discarded: Vec<Option<&'a str>>,
    pub(super) state_last_error: Vec<Option<&'a str>>,
    pub(super) state_changed_at: Vec<i64>,
    pub(super) state_idempotency_key: Vec<Option<&'a str>>,
    pub(super) state_digest: Vec<Option<&'a str>>,
    pub(super) state_accepted_at: Vec<Option<i64>>,
    pub(super) state_output: Vec<Option<&'a [u8]>>,
    pub(super) whole_task: Vec<i64>,
    pub(super) whole_number: Vec<i64>,
    pub(super) whole_state: Vec<&'a str>,
    pub(super) whole_until_at: Vec<Option<i64>>,
    pub(super) whole_tries: Vec<i64>,
    pub(super) whole_holder: Vec<Option<&'a str>>,
    pub(super) whole_token: Vec<Option<i64>>,
    pub(super) whole_granted_at: Vec<Option<i64>>,
    pub(super) whole_expires_at: Vec<Option<i64>>,
    pub(super) whole_lapses_at: Vec<Option<i64>>,
    pub(super) whole_discarded: Vec<Option<&'a str>>,
    pub(super) whole_last_error: Vec<Option<&'a str>>,
    pub(super) whole_changed_at: Vec<i64>,
    pub(super) expiry_task: Vec<i64>,
    pub(super) expiry_number: Vec<i64>,
    pub(super) expiry_expires_at: Vec<Option<i64>>,
    pub(super) expiry_lapses_at: Vec<Option<i64>>,
    pub(super) claim_task: Vec<i64>,
    pub(super) claim_claimable_at: Vec<Option<i64>>,
    pub(super) claim_last_token: Vec<Option<i64>>,
    pub(super) claim_moves: Vec<bool>,
    pub(super) audit_at: Vec<i64>,
    pub(super) audit_principal: Vec<&'a str>,
    pub(super) audit_namespace: Vec<&'a str>,
    pub(super) audit_action: Vec<&'a str>,
    pub(super) audit_outcome: Vec<&'a str>,
    pub(super) audit_resource: Vec<Option<&'a str>>,
    pub(super) audit_ip_hash: Vec<Option<&'a str>>,
}

impl AcknowledgedArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 40] {
        [
            ("state_task", &self.state_task),
            ("state_number", &self.state_number),
            ("state_state", &self.state_state),
            ("state_until_at", &self.state_until_at),
            ("state_lapses_at", &self.state_lapses_at),
            ("state_discarded", &self.state_discarded),
            ("state_last_error", &self.state_last_error),
            ("state_changed_at", &self.state_changed_at),
            ("state_idempotency_key", &self.state_idempotency_key),
            ("state_digest", &self.state_digest),
            ("state_accepted_at", &self.state_accepted_at),
            ("state_output", &self.state_output),
            ("whole_task", &self.whole_task),
            ("whole_number", &self.whole_number),
            ("whole_state", &self.whole_state),
            ("whole_until_at", &self.whole_until_at),
            ("whole_tries", &self.whole_tries),
            ("whole_holder", &self.whole_holder),
            ("whole_token", &self.whole_token),
            ("whole_granted_at", &self.whole_granted_at),
            ("whole_expires_at", &self.whole_expires_at),
            ("whole_lapses_at", &self.whole_lapses_at),
            ("whole_discarded", &self.whole_discarded),
            ("whole_last_error", &self.whole_last_error),
            ("whole_changed_at", &self.whole_changed_at),
            ("expiry_task", &self.expiry_task),
            ("expiry_number", &self.expiry_number),
            ("expiry_expires_at", &self.expiry_expires_at),
            ("expiry_lapses_at", &self.expiry_lapses_at),
            ("claim_task", &self.claim_task),
            ("claim_claimable_at", &self.claim_claimable_at),
            ("claim_last_token", &self.claim_last_token),
            ("claim_moves", &self.claim_moves),
            ("audit_at", &self.audit_at),
            ("audit_principal", &self.audit_principal),
            ("audit_namespace", &self.audit_namespace),
            ("audit_action", &self.audit_action),
            ("audit_outcome", &self.audit_outcome),
            ("audit_resource", &self.audit_resource),
            ("audit_ip_hash", &self.audit_ip_hash),
        ]
    }
}

/// [`INSERT_TASKS`]' and [`INSERT_NEW_TASKS`]' arguments: one array a
/// column, one element a task.
#[derive(Debug, Default)]
pub(super) struct InsertTasksArgs<'a> {
    pub(super) namespace: Vec<&'a str>,
    pub(super) queue: Vec<&'a str>,
    pub(super) task_id: Vec<&'a str>,
    pub(super) version: Vec<i64>,
    pub(super) brief: Vec<&'a [u8]>,
    pub(super) brief_format: Vec<&'a str>,
    pub(super) alternatives: Vec<i64>,
    pub(super) lapse_backoff_ms: Vec<i64>,
    pub(super) max_tries: Vec<i64>,
    pub(super) claimable_at: Vec<Option<i64>>,
    pub(super) created_at: Vec<i64>,
    pub(super) enqueued_by: Vec<&'a str>,
    pub(super) priority: Vec<i64>,
    pub(super) partition_key: Vec<Option<&'a str>>,
    pub(super) unique_key: Vec<Option<&'a str>>,
    pub(super) unique_slot: Vec<Option<&'a str>>,
    pub(super) unique_states: Vec<Option<i64>>,
    pub(super) lease_ms: Vec<Option<i64>>,
    pub(super) deadline_at: Vec<Option<i64>>,
}

impl InsertTasksArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 19] {
        [
            ("namespace", &self.namespace),
            ("queue", &self.queue),
            ("task_id", &self.task_id),
            ("version", &self.version),
            ("brief", &self.brief),
            ("brief_format", &self.brief_format),
            ("alternatives", &self.alternatives),
            ("lapse_backoff_ms", &self.lapse_backoff_ms),
            ("max_tries", &self.max_tries),
            ("claimable_at", &self.claimable_at),
            ("created_at", &self.created_at),
            ("enqueued_by", &self.enqueued_by),
            ("priority", &self.priority),
            ("partition_key", &self.partition_key),
            ("unique_key", &self.unique_key),
            ("unique_slot", &self.unique_slot),
            ("unique_states", &self.unique_states),
            ("lease_ms", &self.lease_ms),
            ("deadline_at", &self.deadline_at),
        ]
    }
}

/// [`INSERT_ATTEMPTS`]' arguments: one array a column, one element an
/// attempt.
#[derive(Debug, Default)]
pub(super) struct InsertAttemptsArgs<'a> {
    pub(super) task: Vec<i64>,
    pub(super) number: Vec<i64>,
    pub(super) namespace: Vec<&'a str>,
    pub(super) queue: Vec<&'a str>,
    pub(super) state: Vec<&'a str>,
    pub(super) until_at: Vec<Option<i64>>,
    pub(super) priority: Vec<i64>,
    pub(super) changed_at: Vec<i64>,
}

impl InsertAttemptsArgs<'_> {
    pub(super) fn params(&self) -> [Named<'_>; 8] {
        [
            ("task", &self.task),
            ("number", &self.number),
            ("namespace", &self.namespace),
            ("queue", &self.queue),
            ("state", &self.state),
            ("until_at", &self.until_at),
            ("priority", &self.priority),
            ("changed_at", &self.changed_at),
        ]
    }
}
