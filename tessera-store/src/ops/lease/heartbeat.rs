//! Heartbeats: a holder extends its lease, with progress or without.

use std::collections::HashMap;

use tessera_lease::{Namespace, Task, TaskRecord};

use crate::backend::{TaskChange, TaskHandle};
use crate::model::audit::ActionScope;
use crate::model::task::not_found;
use crate::ops::dependency;

use tessera_audit::Action;
use tessera_lease::{FencingToken, Lease, check_progress_size};

use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::task::TaskRef;
use crate::ops::task::{load, under_token};
use crate::store::Store;

impl Store {
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

    pub(super) fn beat(
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
            if rules.record().leaves_unique_slot(held) {
                writer.release_unique_slot(handle)?;
            }
            dependency::settle_one(writer, handle, &before, rules.record(), now)?;
            let resource = task.grant_resource(lease.attempt(), lease.token());
            Ok((lease, resource))
        })?;
        self.namespace_changed(&task.namespace);
        Ok(lease)
    }
}

/// One task of a heartbeat batch, as loaded and as the rules leave it.
struct Held {
    handle: TaskHandle,
    before: TaskRecord,
    rules: Task,
}

impl Store {
    /// Extends many leases `caller` holds at once, as
    /// [`heartbeat`](Self::heartbeat) extends one: one transaction, the
    /// tasks locked at once, one audit row per extended lease. Each
    /// lease's own answer in order (`403`, `404`, `409` as a heartbeat's);
    /// the outer error is the transaction's, which then extended none.
    pub(crate) fn heartbeat_many(
        &self,
        caller: &Caller,
        held: &[(TaskRef, FencingToken)],
    ) -> Result<Vec<Result<Lease, Error>>, Error> {
        let now = self.now_utc();
        let holder = caller.lease_principal();
        let extension = self.config.lease_duration();
        let scopes: Vec<Result<ActionScope, Error>> = held
            .iter()
            .map(|(task, _)| self.admit(caller, &task.namespace, Scope::Claim, Action::Heartbeat))
            .collect();
        let mut refs: Vec<&TaskRef> = held
            .iter()
            .zip(&scopes)
            .filter(|(_, scope)| scope.is_ok())
            .map(|((task, _), _)| task)
            .collect();
        refs.sort_unstable();
        refs.dedup();
        if refs.is_empty() {
            return Ok(scopes
                .into_iter()
                .map(|scope| Err(scope.expect_err("every scope was refused")))
                .collect());
        }
        let result = self.write(|writer| {
            let loaded = writer.lock_tasks(&refs)?;
            let mut tasks: HashMap<&TaskRef, Result<Held, Error>> = HashMap::new();
            for (task, loaded) in refs.iter().zip(loaded) {
                let entry = match loaded {
                    None => Err(not_found(task)),
                    Some(loaded) => Task::restore(loaded.record.clone())
                        .map(|rules| Held {
                            handle: loaded.handle,
                            before: loaded.record,
                            rules,
                        })
                        .map_err(Error::from),
                };
                tasks.insert(task, entry);
            }
            let mut answers = Vec::with_capacity(held.len());
            let mut events = Vec::new();
            for ((task, token), scope) in held.iter().zip(&scopes) {
                let scope = match scope {
                    Ok(scope) => scope,
                    Err(error) => {
                        answers.push(Err(error.clone()));
                        continue;
                    }
                };
                let answer = match tasks.get_mut(task) {
                    Some(Ok(loaded)) => loaded
                        .rules
                        .heartbeat(&holder, *token, now, extension)
                        .map_err(Error::from),
                    Some(Err(error)) => Err(error.clone()),
                    None => unreachable!("every admitted reference was looked up"),
                };
                if let Ok(lease) = &answer {
                    events.push(
                        scope.event(now, task.grant_resource(lease.attempt(), lease.token())),
                    );
                }
                answers.push(answer);
            }
            let changes: Vec<TaskChange<'_>> = tasks
                .values()
                .filter_map(|task| task.as_ref().ok())
                .filter(|task| task.before != *task.rules.record())
                .map(|task| TaskChange {
                    handle: task.handle,
                    before: &task.before,
                    after: task.rules.record(),
                    at: now,
                })
                .collect();
            writer.write_acknowledged(&changes, &[], &events)?;
            dependency::settle(writer, dependency::ended(&changes), now)?;
            Ok(answers)
        });
        match result {
            Ok(answers) => {
                let mut wrote = false;
                for (answer, scope) in answers.iter().zip(&scopes) {
                    match (answer, scope) {
                        (Ok(_), _) => wrote = true,
                        (Err(error), Ok(scope)) => self.count(scope, error.outcome()),
                        // Counted when it was refused.
                        (Err(_), Err(_)) => {}
                    }
                }
                if wrote {
                    let mut changed: Vec<&Namespace> = refs.iter().map(|t| &t.namespace).collect();
                    changed.dedup();
                    for namespace in changed {
                        self.namespace_changed(namespace);
                    }
                    self.after_write();
                }
                Ok(answers)
            }
            Err(error) => {
                for scope in scopes.iter().flatten() {
                    self.count(scope, error.outcome());
                }
                Err(error)
            }
        }
    }
}
