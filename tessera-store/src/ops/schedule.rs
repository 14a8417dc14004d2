//! Periodic schedules: putting, reading, pausing, resuming and deleting
//! them, and the scheduler's pass that fires what is due.
//!
//! A fire is one transaction: the schedule's row (locked where the backend
//! locks rows), its last fire, the `(namespace, schedule, run_at)` insert
//! into `schedule_fires`' unique index, the task with its attempts and the
//! audit row. A scheduler whose insert meets the index writes nothing, so
//! any number of them may run, in any number of processes, and each
//! run-at fires once. The rule of which run-at is due, and the catch-up
//! after downtime, are `tessera-lease`'s ([`CronSchedule::due_since`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::{Condvar, Mutex};
use tessera_audit::Action;
use tessera_lease::{CronSchedule, Namespace, QueueName, ScheduleName, Task, TaskId, fire_task_id};

use crate::backend::{NewFire, NewTask, RowLock, ScheduleRow, WriteTransaction};
use crate::error::Error;
use crate::model::access::{Caller, PrincipalKind, Scope};
use crate::model::audit::ActionScope;
use crate::model::schedule::{
    Fired, Loaded, MAX_SCHEDULES_LISTED, SchedulePage, ScheduleSpec, ScheduleView, StoredOptions,
    not_found, resource, view,
};
use crate::model::task::{Brief, TaskRef};
use crate::store::Store;

/// How many schedules a pass reads at a time.
const PASS_PAGE: usize = 100;

impl Store {
    /// Creates or replaces the schedule `name` of `namespace`, and returns
    /// it with whether it was created.
    ///
    /// Needs the `enqueue` scope and the namespace grant; an anonymous
    /// session's key is refused (`403`): its namespace is deleted with the
    /// session, and a schedule would outlive it. An invalid cron
    /// expression or time zone, one that never fires again (`0 0 0 30 2
    /// *`), an oversized brief, a task spec the lease
    /// rules refuse or a not-before time is `400 invalid_input`, and
    /// nothing is written. A replacement keeps the schedule's creation time
    /// and whether it is paused; its run-ats count from now, as a new
    /// schedule's do, so run-ats of the old expression are never fired
    /// late. One transaction: the namespace row on its first use, the
    /// schedule and the audit row, `put_schedule`.
    pub fn put_schedule(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
        spec: &ScheduleSpec,
    ) -> Result<(ScheduleView, bool), Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::PutSchedule)?;
        let now = self.now_utc();
        let checked = (|| {
            if caller.kind() == PrincipalKind::Anonymous {
                return Err(Error::Forbidden {
                    reason: "an anonymous session cannot keep a schedule".to_owned(),
                });
            }
            let cron = CronSchedule::try_from(spec.schedule.clone())?;
            // An expression that never matches (`0 0 0 30 2 *`) would cost
            // every scheduler pass a search to the end of the cron search's
            // horizon; it is refused once, here.
            if cron.next_after(now).is_none() {
                return Err(Error::InvalidInput {
                    reason: format!(
                        "the cron expression {:?} never fires after {now}",
                        spec.schedule.cron
                    ),
                });
            }
            if spec.spec.not_before.is_some() {
                return Err(Error::InvalidInput {
                    reason: "a schedule's tasks are claimable at their run-at: \
                             not_before is not allowed"
                        .to_owned(),
                });
            }
            if spec.spec.deadline.is_some() {
                return Err(Error::InvalidInput {
                    reason: "a schedule fires tasks over time, and one deadline would pass for \
                             all of them: a deadline is not allowed"
                        .to_owned(),
                });
            }
            let probe = TaskId::parse("schedule-probe").expect("a valid task id");
            Task::new(probe, spec.version, spec.spec)?;
            let (bytes, format) = spec.brief.encode()?;
            Ok((bytes.into_owned(), format))
        })()
        .inspect_err(|error| self.count(&scope, error.outcome()))?;
        let (brief, format) = checked;
        let options = StoredOptions {
            version: spec.version,
            spec: spec.spec,
        }
        .encode();
        let principal = caller.principal().to_string();
        let (row, created) = self.perform(&scope, now, |writer| {
            self.open_namespace(writer, caller, namespace, now)?;
            // A replacement keeps what a pause or resume just wrote.
            writer.lock_row(RowLock::Schedule(namespace, name))?;
            let existing = writer.lock_schedule(namespace, name)?;
            let row = ScheduleRow {
                namespace: namespace.clone(),
                name: name.clone(),
                queue: spec.queue.clone(),
                cron: spec.schedule.cron.clone(),
                zone: spec.schedule.zone.clone(),
                brief: brief.clone(),
                brief_format: format.to_owned(),
                options: options.clone(),
                paused: existing.as_ref().is_some_and(|e| e.paused),
                active_since: now,
                created_at: existing.as_ref().map_or(now, |e| e.created_at),
                updated_at: now,
                created_by: existing
                    .as_ref()
                    .map_or_else(|| principal.clone(), |e| e.created_by.clone()),
                last_run_at: existing.as_ref().and_then(|e| e.last_run_at),
            };
            writer.put_schedule(&row)?;
            Ok(((row, existing.is_none()), resource(name, "")))
        })?;
        Ok((view(row, now)?, created))
    }

    /// Reads the schedule `name` of `namespace`, with its last and next
    /// run-at. Needs the `read` scope and the namespace grant; `404` if
    /// there is none. Audited as `read_schedule`.
    pub fn read_schedule(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<ScheduleView, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ReadSchedule)?;
        let now = self.now_utc();
        self.perform_read(&scope, |reader| {
            let row = reader
                .schedule(namespace, name)?
                .ok_or_else(|| not_found(namespace, name))?;
            Ok((view(row, now)?, resource(name, "")))
        })
    }

    /// Lists the schedules of `namespace` in name order, a page at a time:
    /// those after `after`, at most `limit` (held to 1 to
    /// [`MAX_SCHEDULES_LISTED`](crate::limits::MAX_SCHEDULES_LISTED)).
    /// Needs the `read` scope and the namespace grant. Audited as
    /// `list_schedules`.
    pub fn list_schedules(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        after: Option<&ScheduleName>,
        limit: usize,
    ) -> Result<SchedulePage, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ListSchedules)?;
        let limit = limit.clamp(1, MAX_SCHEDULES_LISTED);
        let now = self.now_utc();
        self.perform_read(&scope, |reader| {
            let rows = reader.schedules_of(namespace, after, limit)?;
            let next = (rows.len() == limit)
                .then(|| rows.last().map(|row| row.name.clone()))
                .flatten();
            let schedules = rows
                .into_iter()
                .map(|row| view(row, now))
                .collect::<Result<Vec<_>, Error>>()?;
            Ok((SchedulePage { schedules, next }, None))
        })
    }

    /// Pauses the schedule `name` of `namespace`: no scheduler fires it
    /// until it is resumed, and the run-ats that pass meanwhile are
    /// skipped. Tasks it fired already are left as they are. Pausing a
    /// paused schedule changes nothing but its update time. Needs the
    /// `enqueue` scope and the namespace grant; `404` if there is none.
    /// Audited as `pause_schedule`.
    pub fn pause_schedule(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<ScheduleView, Error> {
        self.set_paused(caller, namespace, name, true, Action::PauseSchedule)
    }

    /// Resumes a paused schedule: its run-ats count from now, so what
    /// passed while it was paused never fires. Resuming an unpaused one
    /// changes nothing but its update time. Same permissions as
    /// [`pause_schedule`](Self::pause_schedule); audited as
    /// `resume_schedule`.
    pub fn resume_schedule(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<ScheduleView, Error> {
        self.set_paused(caller, namespace, name, false, Action::ResumeSchedule)
    }

    fn set_paused(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
        paused: bool,
        action: Action,
    ) -> Result<ScheduleView, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, action)?;
        let now = self.now_utc();
        let row = self.perform(&scope, now, |writer| {
            writer.lock_row(RowLock::Schedule(namespace, name))?;
            let mut row = writer
                .lock_schedule(namespace, name)?
                .ok_or_else(|| not_found(namespace, name))?;
            if row.paused && !paused {
                row.active_since = now;
            }
            row.paused = paused;
            row.updated_at = now;
            writer.put_schedule(&row)?;
            Ok((row, resource(name, "")))
        })?;
        view(row, now)
    }

    /// Deletes the schedule `name` of `namespace` and the record of its
    /// fires; tasks it fired are left as they are. Needs the `enqueue`
    /// scope and the namespace grant; `404` if there is none. Audited as
    /// `delete_schedule`.
    pub fn delete_schedule(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<(), Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::DeleteSchedule)?;
        let now = self.now_utc();
        self.perform(&scope, now, |writer| {
            if !writer.delete_schedule(namespace, name)? {
                return Err(not_found(namespace, name));
            }
            Ok(((), resource(name, "")))
        })
    }

    /// One scheduler pass at the store's now: fires every unpaused
    /// schedule of every namespace that has a run-at due, and returns the
    /// fires it made.
    ///
    /// Due is [`CronSchedule::due_since`]: the latest run-at at or before
    /// now that is after the schedule's last fire and after it was put or
    /// resumed. After downtime a schedule fires once, for the latest run-at
    /// passed; the ones missed on the way never fire. Each fire is one
    /// transaction (see the module docs): the fire row, the task (its id
    /// from [`fire_task_id`], so every scheduler names the same one,
    /// enqueued as the principal that first put the schedule, with the
    /// schedule's brief and options) and an audit row `fire_schedule`
    /// naming `schedule:<name>/<run-at in ms>` by the store (principal
    /// `-`). A scheduler that meets a fire already recorded, or finds the
    /// schedule paused or gone under its lock, writes nothing. Any number
    /// of processes may run passes at once.
    ///
    /// A pass reads the unpaused schedules a page at a time (one search of
    /// the partial `schedules_active` index per page), so a pass with
    /// nothing due writes nothing. For hosts: a timer calling this, or
    /// [`run_scheduler`](Self::run_scheduler).
    pub fn fire_due_schedules(&self) -> Result<Vec<Fired>, Error> {
        let now = self.now_utc();
        let mut fired = Vec::new();
        let mut after: Option<(Namespace, ScheduleName)> = None;
        loop {
            let page = self.read(|reader| {
                Ok(reader.active_schedules(
                    after.as_ref().map(|(namespace, name)| (namespace, name)),
                    PASS_PAGE,
                )?)
            })?;
            for row in &page {
                if Loaded::of(row)?.due(row, now).is_none() {
                    continue;
                }
                if let Some(fire) = self.fire(&row.namespace, &row.name, now)? {
                    fired.push(fire);
                }
            }
            if page.len() < PASS_PAGE {
                break;
            }
            after = page
                .last()
                .map(|row| (row.namespace.clone(), row.name.clone()));
        }
        if !fired.is_empty() {
            self.after_write();
        }
        Ok(fired)
    }

    /// Fires the run-at of one schedule due at `now`, if it still is under
    /// the schedule's lock.
    fn fire(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
        now: DateTime<Utc>,
    ) -> Result<Option<Fired>, Error> {
        let scope = ActionScope::new(None, Some(namespace), Action::FireSchedule);
        let fired = self.write(|writer| fire_in(writer, &scope, namespace, name, now))?;
        Ok(fired.map(|(fire, queue)| {
            self.namespace_changed(namespace);
            if fire.created {
                self.queue_received_work(namespace, &queue);
            }
            fire
        }))
    }

    /// When the next run-at of any unpaused schedule falls, as of the
    /// store's now: now itself if one is due, `None` if there is no
    /// schedule that will fire again. What a scheduler sleeps until.
    pub fn next_schedule_fire(&self) -> Result<Option<DateTime<Utc>>, Error> {
        let now = self.now_utc();
        let mut next: Option<DateTime<Utc>> = None;
        let mut after: Option<(Namespace, ScheduleName)> = None;
        loop {
            let page = self.read(|reader| {
                Ok(reader.active_schedules(
                    after.as_ref().map(|(namespace, name)| (namespace, name)),
                    PASS_PAGE,
                )?)
            })?;
            for row in &page {
                let loaded = Loaded::of(row)?;
                let at = match loaded.due(row, now) {
                    Some(_) => Some(now),
                    None => loaded.cron.next_after(now.max(row.active_since)),
                };
                next = match (next, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            if page.len() < PASS_PAGE {
                break;
            }
            after = page
                .last()
                .map(|row| (row.namespace.clone(), row.name.clone()));
        }
        Ok(next)
    }

    /// Runs a scheduler on a thread of its own until the returned
    /// [`Scheduler`] is stopped or dropped: a pass
    /// ([`fire_due_schedules`](Self::fire_due_schedules)), then a sleep
    /// until the next run-at ([`next_schedule_fire`](Self::next_schedule_fire))
    /// by the store's clock, at most `recheck` (schedules put through
    /// other stores are seen at the latest then) and at most the clock's
    /// [`max_park`](crate::Clock::max_park). A failed pass is tried again
    /// after `recheck`. Run one per process, or several: each run-at fires
    /// once whichever runs it.
    pub fn run_scheduler(self: &Arc<Self>, recheck: Duration) -> Scheduler {
        let stop = Arc::new(Stop::default());
        let store = Arc::clone(self);
        let signal = Arc::clone(&stop);
        let recheck = recheck.max(Duration::from_millis(1));
        let thread = std::thread::Builder::new()
            .name("tessera-scheduler".to_owned())
            .spawn(move || {
                while !signal.stopped() {
                    let wait = match store
                        .fire_due_schedules()
                        .and_then(|_| store.next_schedule_fire())
                    {
                        Ok(Some(next)) => (next - store.now_utc())
                            .to_std()
                            .unwrap_or(Duration::ZERO)
                            .min(recheck),
                        Ok(None) | Err(_) => recheck,
                    };
                    let wait = store
                        .clock()
                        .max_park()
                        .map_or(wait, |slice| wait.min(slice));
                    signal.wait(wait.max(Duration::from_millis(1)));
                }
            })
            .expect("the scheduler thread starts");
        Scheduler {
            stop,
            thread: Some(thread),
        }
    }
}

/// The body of one fire's transaction.
fn fire_in(
    writer: &dyn WriteTransaction,
    scope: &ActionScope,
    namespace: &Namespace,
    name: &ScheduleName,
    now: DateTime<Utc>,
) -> Result<Option<(Fired, QueueName)>, Error> {
    let Some(row) = writer.lock_schedule(namespace, name)? else {
        return Ok(None);
    };
    if row.paused {
        return Ok(None);
    }
    let loaded = Loaded::of(&row)?;
    let Some(run_at) = loaded.due(&row, now) else {
        return Ok(None);
    };
    let id = fire_task_id(name, run_at);
    let recorded = writer.insert_fire(&NewFire {
        namespace,
        schedule: name,
        run_at,
        task_id: &id,
        fired_at: now,
    })?;
    if !recorded {
        return Ok(None);
    }
    let version = loaded.options.version;
    let record = Task::new(id.clone(), version, loaded.options.spec)?.into_record();
    let task = TaskRef::new(namespace.clone(), id, version);
    // Checked as a brief when the schedule was put.
    let brief = Brief::decode(row.brief.clone(), &row.brief_format)?;
    let (bytes, format) = brief.encode()?;
    let created = writer.insert_task(&NewTask {
        task: &task,
        queue: &row.queue,
        brief: &bytes,
        brief_format: format,
        record: &record,
        created_at: now,
        enqueued_by: &row.created_by,
        partition_key: None,
        unique_key: None,
        unique: None,
        drawn_id: false,
    })?;
    if created {
        writer.signal_enqueued(namespace, &row.queue)?;
    }
    let millis = run_at.timestamp_millis();
    writer.insert_event(&scope.event(now, resource(name, &format!("/{millis}"))))?;
    let fire = Fired {
        namespace: namespace.clone(),
        schedule: name.clone(),
        run_at,
        task,
        created,
    };
    Ok(Some((fire, row.queue)))
}

/// What a scheduler thread waits on.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    fn stopped(&self) -> bool {
        *self.stopped.lock()
    }

    fn stop(&self) {
        *self.stopped.lock() = true;
        self.wake.notify_all();
    }

    /// Sleeps up to `wait` in real time, or until stopped.
    fn wait(&self, wait: Duration) {
        let mut stopped = self.stopped.lock();
        if !*stopped {
            let _ = self.wake.wait_for(&mut stopped, wait);
        }
    }
}

/// A scheduler thread started by [`Store::run_scheduler`]; stopping or
/// dropping it stops the thread after its current pass.
#[derive(Debug)]
pub struct Scheduler {
    stop: Arc<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Stops the thread and waits for it to end.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.halt();
    }
}
