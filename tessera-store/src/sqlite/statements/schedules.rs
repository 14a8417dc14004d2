//! The `schedules` and `schedule_fires` tables: periodic schedules and
//! the run-at times they fired for.

use rusqlite::{Row, params};

use crate::backend::rows::{count, millis};
use crate::backend::schedules::RawSchedule;
use crate::backend::{NewFire, Result, ScheduleRow};
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

/// A schedule's columns, its last fire (`last_run_at`) read from
/// the end of its entries in `schedule_fires_run_at`, then `$tail`.
macro_rules! select_schedules {
    ($tail:literal) => {
        concat!(
            "SELECT s.namespace, s.name, s.queue, s.cron, s.zone, s.brief, s.brief_format, \
             s.options, s.paused, s.active_since, s.created_at, s.updated_at, s.created_by, \
             (SELECT max(f.run_at) FROM schedule_fires f \
             WHERE f.namespace = s.namespace AND f.schedule = s.name) AS last_run_at \
             FROM schedules s ",
            $tail
        )
    };
}

/// Decodes a row of [`select_schedules!`].
fn raw(row: &Row<'_>) -> rusqlite::Result<RawSchedule> {
    Ok(RawSchedule {
        namespace: row.get("namespace")?,
        name: row.get("name")?,
        queue: row.get("queue")?,
        cron: row.get("cron")?,
        zone: row.get("zone")?,
        brief: row.get("brief")?,
        brief_format: row.get("brief_format")?,
        options: row.get("options")?,
        paused: row.get("paused")?,
        active_since: row.get("active_since")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        created_by: row.get("created_by")?,
        last_run_at: row.get("last_run_at")?,
    })
}

pub(crate) const SCHEDULE_BY_NAME: &str =
    select_schedules!("WHERE s.namespace = ?1 AND s.name = ?2");

/// A schedule by name, with its last fire.
pub(crate) fn schedule(
    reader: &Reader<'_>,
    namespace: &str,
    name: &str,
) -> Result<Option<ScheduleRow>> {
    reader
        .optional(SCHEDULE_BY_NAME, params![namespace, name], raw)?
        .map(RawSchedule::decode)
        .transpose()
}

pub(crate) const SCHEDULES_OF: &str =
    select_schedules!("WHERE s.namespace = ?1 AND s.name > ?2 ORDER BY s.name LIMIT ?3");

/// A page of a namespace's schedules after `after`, by name.
pub(crate) fn schedules_of(
    reader: &Reader<'_>,
    namespace: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<ScheduleRow>> {
    reader
        .all(SCHEDULES_OF, params![namespace, after, count(limit)], raw)?
        .into_iter()
        .map(RawSchedule::decode)
        .collect()
}

/// Unpaused schedules after `(?1, ?2)`, through the partial
/// `schedules_active` index.
pub(crate) const ACTIVE_SCHEDULES: &str = select_schedules!(
    "WHERE s.paused = 0 AND (s.namespace, s.name) > (?1, ?2) \
     ORDER BY s.namespace, s.name LIMIT ?3"
);

/// A page of unpaused schedules after `after` (namespace, name).
pub(crate) fn active_schedules(
    reader: &Reader<'_>,
    after: (&str, &str),
    limit: usize,
) -> Result<Vec<ScheduleRow>> {
    reader
        .all(
            ACTIVE_SCHEDULES,
            params![after.0, after.1, count(limit)],
            raw,
        )?
        .into_iter()
        .map(RawSchedule::decode)
        .collect()
}

pub(crate) const PUT_SCHEDULE: &str = "INSERT INTO schedules (namespace, name, queue, cron, \
     zone, brief, brief_format, options, paused, active_since, created_at, updated_at, \
     created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
     ON CONFLICT (namespace, name) DO UPDATE SET queue = excluded.queue, \
     cron = excluded.cron, zone = excluded.zone, brief = excluded.brief, \
     brief_format = excluded.brief_format, options = excluded.options, \
     paused = excluded.paused, active_since = excluded.active_since, \
     updated_at = excluded.updated_at";

/// Creates a schedule or replaces its definition; its creation stays.
pub(crate) fn put_schedule(writer: &Writer<'_>, row: &ScheduleRow) -> Result<()> {
    writer.execute(
        PUT_SCHEDULE,
        params![
            row.namespace.as_str(),
            row.name.as_str(),
            row.queue.as_str(),
            row.cron,
            row.zone,
            row.brief,
            row.brief_format,
            row.options,
            i64::from(row.paused),
            millis(row.active_since),
            millis(row.created_at),
            millis(row.updated_at),
            row.created_by,
        ],
    )?;
    Ok(())
}

pub(crate) const DELETE_SCHEDULE: &str = "DELETE FROM schedules WHERE namespace = ?1 AND name = ?2";

pub(crate) const DELETE_FIRES: &str =
    "DELETE FROM schedule_fires WHERE namespace = ?1 AND schedule = ?2";

/// Deletes a schedule and its fires; returns whether it was there.
pub(crate) fn delete_schedule(writer: &Writer<'_>, namespace: &str, name: &str) -> Result<bool> {
    let deleted = writer.execute(DELETE_SCHEDULE, params![namespace, name])? > 0;
    writer.execute(DELETE_FIRES, params![namespace, name])?;
    Ok(deleted)
}

pub(crate) const INSERT_FIRE: &str = "INSERT INTO schedule_fires \
     (namespace, schedule, run_at, task_id, fired_at) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (namespace, schedule, run_at) DO NOTHING";

/// Records a fire unless its run-at is recorded; returns whether it was new.
pub(crate) fn insert_fire(writer: &Writer<'_>, fire: &NewFire<'_>) -> Result<bool> {
    let inserted = writer.execute(
        INSERT_FIRE,
        params![
            fire.namespace.as_str(),
            fire.schedule.as_str(),
            millis(fire.run_at),
            fire.task_id.as_str(),
            millis(fire.fired_at),
        ],
    )?;
    Ok(inserted > 0)
}

/// A schedule's fire rows before its latest, at most `?3`.
pub(crate) const TRIM_FIRES: &str = "DELETE FROM schedule_fires WHERE id IN (SELECT f.id \
     FROM schedule_fires f WHERE f.namespace = ?1 AND f.schedule = ?2 AND f.run_at < \
     (SELECT max(l.run_at) FROM schedule_fires l WHERE l.namespace = ?1 AND l.schedule = ?2) \
     ORDER BY f.run_at LIMIT ?3)";

/// Deletes a schedule's fire rows before its latest, at most `limit`.
pub(crate) fn trim_fires(
    writer: &Writer<'_>,
    namespace: &str,
    name: &str,
    limit: i64,
) -> Result<usize> {
    Ok(writer.execute(TRIM_FIRES, params![namespace, name, limit])?)
}
