//! Schedules: each run-at fires at most once, every fire's task is kept,
//! and a run-at that fell due while its schedule could not have been
//! paused is fired.
//!
//! A schedule's pause may hold, by the store's clock, from its
//! invocation's wall time (less the clock skew) until the completion of
//! the first acknowledged resume invoked after it was acknowledged (plus
//! the skew); an unknown pause may land any time after its invocation,
//! so it may hold to the end. A run-at is excused when such a window
//! meets the stretch from it to the next run-at the run lists, in which
//! a pass had to fire it.
//!
//! Fires are grouped by schedule and run-at in ordered maps once; the
//! due run-ats of a schedule are compared with its few pauses.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::check::{Anomaly, AnomalyKind, anomaly};
use crate::history::{Fire, Operation, OperationId, Outcome, Step};
use crate::index::{Index, acknowledged};
use crate::purge::Purges;
use crate::state::FinalState;

/// A stretch of store time a pause may have held: from, and until
/// (`None`: to the end).
type Window = (DateTime<Utc>, Option<DateTime<Utc>>);

/// Acknowledged fires by schedule and run-at, each with its pass.
type FiresByRunAt<'a> = BTreeMap<(&'a str, DateTime<Utc>), Vec<(&'a Fire, &'a Step)>>;

/// Checks every schedule and returns the tasks fires made (acknowledged,
/// or recorded in a fire row), which explains them at the end. A fire's
/// task missing at the end may have been purged (`purges`).
pub(crate) fn schedules<'a>(
    index: &Index<'a>,
    end: &'a FinalState,
    purges: &Purges<'a>,
    skew: TimeDelta,
    anomalies: &mut Vec<Anomaly>,
) -> HashSet<&'a str> {
    let mut fires: FiresByRunAt<'_> = BTreeMap::new();
    for step in &index.passes {
        if let Some(Outcome::Fired { fires: made }) = step.completion.outcome() {
            for fire in made {
                fires
                    .entry((&fire.schedule, fire.run_at))
                    .or_default()
                    .push((fire, step));
            }
        }
    }
    let mut made: HashSet<&str> = HashSet::new();
    for ((schedule, run_at), acknowledged) in &fires {
        let (fire, _) = acknowledged[0];
        made.extend(acknowledged.iter().map(|(fire, _)| fire.task.as_str()));
        let operations: Vec<OperationId> = acknowledged.iter().map(|(_, step)| step.id).collect();
        if acknowledged.len() > 1 {
            anomalies.push(anomaly(
                AnomalyKind::DoubledFire,
                &fire.task,
                operations.clone(),
                format!(
                    "schedule {schedule} run-at {run_at} fired {} times",
                    acknowledged.len()
                ),
            ));
        }
        for (fire, step) in acknowledged {
            if !end.tasks.contains_key(&fire.task) && !purges.excuses(&fire.task) {
                anomalies.push(anomaly(
                    AnomalyKind::LostEnqueue,
                    &fire.task,
                    vec![step.id],
                    format!("the task of schedule {schedule}'s fire of {run_at} is missing"),
                ));
            }
        }
        // Retention keeps a schedule's latest fire row alone: a row is
        // missing rightly when a later run-at's row is there.
        let rows = end.schedules.get(*schedule);
        if rows.is_some_and(|rows| rows.fires.iter().all(|row| row.run_at < *run_at)) {
            anomalies.push(anomaly(
                AnomalyKind::LostFire,
                &fire.task,
                operations,
                format!("schedule {schedule}'s fire of {run_at} has no fire row"),
            ));
        }
    }
    for (schedule, stored) in &end.schedules {
        let mut rows: BTreeMap<DateTime<Utc>, Vec<&str>> = BTreeMap::new();
        for row in &stored.fires {
            rows.entry(row.run_at).or_default().push(&row.task);
            made.insert(&row.task);
        }
        // Retention keeps a schedule's latest fire row alone: a task of an
        // earlier run-at (named `sched-<name>-<run-at in ms>`) was made by
        // a fire whose row it deleted, whether it is there at the end or
        // may have been purged since.
        let latest = rows.keys().next_back().copied();
        let prefix = format!("sched-{schedule}-");
        let mut trimmed: Vec<DateTime<Utc>> = Vec::new();
        for task in end.tasks.keys().map(String::as_str).chain(purges.excused()) {
            let run_at = task
                .strip_prefix(&prefix)
                .and_then(|millis| millis.parse::<i64>().ok())
                .and_then(DateTime::from_timestamp_millis);
            if let Some(run_at) = run_at.filter(|at| latest.is_some_and(|latest| *at < latest)) {
                made.insert(task);
                trimmed.push(run_at);
            }
        }
        for (run_at, tasks) in &rows {
            let passes = fires.get(&(schedule.as_str(), *run_at));
            let acknowledged: Vec<OperationId> =
                passes.map_or(Vec::new(), |f| f.iter().map(|(_, step)| step.id).collect());
            // A task an acknowledged fire named is reported missing there.
            let reported =
                |task: &str| passes.is_some_and(|f| f.iter().any(|(fire, _)| fire.task == task));
            if tasks.len() > 1 {
                anomalies.push(anomaly(
                    AnomalyKind::DoubledFire,
                    tasks[0],
                    acknowledged.clone(),
                    format!(
                        "schedule {schedule} run-at {run_at} has {} fire rows",
                        tasks.len()
                    ),
                ));
            }
            for task in tasks {
                if !end.tasks.contains_key(*task) && !reported(task) && !purges.excuses(task) {
                    anomalies.push(anomaly(
                        AnomalyKind::LostEnqueue,
                        task,
                        acknowledged.clone(),
                        format!(
                            "the task of schedule {schedule}'s fire row of {run_at} is missing"
                        ),
                    ));
                }
            }
        }
        let steps = index.schedules.get(schedule.as_str());
        let paused = possibly_paused(steps.map_or(&[][..], Vec::as_slice), skew);
        let mut due = stored.due.clone();
        due.sort_unstable();
        due.dedup();
        for (n, run_at) in due.iter().enumerate() {
            let fired = rows.contains_key(run_at)
                || fires.contains_key(&(schedule.as_str(), *run_at))
                || trimmed.contains(run_at);
            let from = *run_at - skew;
            let until = due.get(n + 1).map(|next| *next + skew);
            let excused = paused.iter().any(|(start, stop)| {
                until.is_none_or(|until| *start <= until) && stop.is_none_or(|stop| stop >= from)
            });
            if !fired && !excused {
                anomalies.push(anomaly(
                    AnomalyKind::LostFire,
                    &format!("schedule {schedule} run-at {run_at}"),
                    Vec::new(),
                    "due with no pause possible around it, and never fired".to_owned(),
                ));
            }
        }
    }
    made
}

/// The windows the pauses among `steps` (one schedule's pauses and
/// resumes) may have held.
fn possibly_paused(steps: &[&Step], skew: TimeDelta) -> Vec<Window> {
    steps
        .iter()
        .filter(|step| {
            matches!(step.operation, Operation::PauseSchedule { .. })
                && step.completion.may_have_happened()
        })
        .map(|pause| {
            let resumed = acknowledged(pause)
                .then(|| {
                    steps
                        .iter()
                        .filter(|step| {
                            matches!(step.operation, Operation::ResumeSchedule { .. })
                                && acknowledged(step)
                                && pause.precedes(step)
                        })
                        .filter_map(|step| step.completed_wall)
                        .min()
                })
                .flatten();
            (pause.invoked_wall - skew, resumed.map(|at| at + skew))
        })
        .collect()
}
