//! Periodic schedules and their fires on PostgreSQL.

use postgres::Row;
use tessera_lease::{Namespace, ScheduleName};

use super::transactions::PgTransaction;
use crate::backend::rows::{count, millis};
use crate::backend::schedules::RawSchedule;
use crate::backend::{NewFire, Result, ScheduleRow};

/// A schedule's columns in [`RawSchedule`] order, its last fire read from
/// the end of its entries in `schedule_fires_run_at`, then `$tail`.
macro_rules! select_schedules {
    ($tail:literal) => {
        concat!(
            "SELECT s.namespace, s.name, s.queue, s.cron, s.zone, s.brief, s.brief_format, \
             s.options, s.paused, s.active_since, s.created_at, s.updated_at, s.created_by, \
             (SELECT max(f.run_at) FROM schedule_fires f \
             WHERE f.namespace = s.namespace AND f.schedule = s.name) \
             FROM schedules s ",
            $tail
        )
    };
}

const SCHEDULE_BY_NAME: &str = select_schedules!("WHERE s.namespace = $1 AND s.name = $2");

/// Takes the schedule's row lock: fires of one schedule take turns.
const LOCK_SCHEDULE: &str = "SELECT 1 FROM schedules WHERE namespace = $1 AND name = $2 FOR UPDATE";

const SCHEDULES_OF: &str =
    select_schedules!("WHERE s.namespace = $1 AND s.name > $2 ORDER BY s.name LIMIT $3");

const ACTIVE_SCHEDULES: &str = select_schedules!(
    "WHERE s.paused = 0 AND (s.namespace, s.name) > ($1, $2) \
     ORDER BY s.namespace, s.name LIMIT $3"
);

const PUT_SCHEDULE: &str = "INSERT INTO schedules (namespace, name, queue, cron, \
     zone, brief, brief_format, options, paused, active_since, created_at, updated_at, \
     created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT (namespace, name) DO UPDATE SET queue = excluded.queue, \
     cron = excluded.cron, zone = excluded.zone, brief = excluded.brief, \
     brief_format = excluded.brief_format, options = excluded.options, \
     paused = excluded.paused, active_since = excluded.active_since, \
     updated_at = excluded.updated_at";

const DELETE_FIRES: &str = "DELETE FROM schedule_fires WHERE namespace = $1 AND schedule = $2";

/// A schedule's fire rows before its latest, at most `$3`.
const TRIM_FIRES: &str = "DELETE FROM schedule_fires WHERE id IN (SELECT f.id FROM schedule_fires f \
     WHERE f.namespace = $1 AND f.schedule = $2 AND f.run_at < (SELECT max(l.run_at) \
     FROM schedule_fires l WHERE l.namespace = $1 AND l.schedule = $2) \
     ORDER BY f.run_at LIMIT $3 FOR UPDATE SKIP LOCKED)";

const DELETE_SCHEDULE: &str = "DELETE FROM schedules WHERE namespace = $1 AND name = $2";

const INSERT_FIRE: &str = "INSERT INTO schedule_fires \
     (namespace, schedule, run_at, task_id, fired_at) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (namespace, schedule, run_at) DO NOTHING";

fn decode(row: &Row) -> Result<ScheduleRow> {
    RawSchedule {
        namespace: row.try_get(0)?,
        name: row.try_get(1)?,
        queue: row.try_get(2)?,
        cron: row.try_get(3)?,
        zone: row.try_get(4)?,
        brief: row.try_get(5)?,
        brief_format: row.try_get(6)?,
        options: row.try_get(7)?,
        paused: row.try_get(8)?,
        active_since: row.try_get(9)?,
        created_at: row.try_get(10)?,
        updated_at: row.try_get(11)?,
        created_by: row.try_get(12)?,
        last_run_at: row.try_get(13)?,
    }
    .decode()
}

impl PgTransaction<'_> {
    pub(super) fn read_schedule(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<Option<ScheduleRow>> {
        self.query(SCHEDULE_BY_NAME, &[&namespace.as_str(), &name.as_str()])?
            .first()
            .map(decode)
            .transpose()
    }

    pub(super) fn lock_and_read_schedule(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<Option<ScheduleRow>> {
        if self
            .query(LOCK_SCHEDULE, &[&namespace.as_str(), &name.as_str()])?
            .is_empty()
        {
            return Ok(None);
        }
        self.read_schedule(namespace, name)
    }

    pub(super) fn read_schedules_of(
        &self,
        namespace: &Namespace,
        after: Option<&ScheduleName>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        let after = after.map_or("", ScheduleName::as_str);
        self.query(SCHEDULES_OF, &[&namespace.as_str(), &after, &count(limit)])?
            .iter()
            .map(decode)
            .collect()
    }

    pub(super) fn read_active_schedules(
        &self,
        after: Option<(&Namespace, &ScheduleName)>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>> {
        let (namespace, name) = after.map_or(("", ""), |(namespace, name)| {
            (namespace.as_str(), name.as_str())
        });
        self.query(ACTIVE_SCHEDULES, &[&namespace, &name, &count(limit)])?
            .iter()
            .map(decode)
            .collect()
    }

    pub(super) fn write_schedule(&self, row: &ScheduleRow) -> Result<()> {
        self.execute(
            PUT_SCHEDULE,
            &[
                &row.namespace.as_str(),
                &row.name.as_str(),
                &row.queue.as_str(),
                &row.cron,
                &row.zone,
                &row.brief,
                &row.brief_format,
                &row.options,
                &i64::from(row.paused),
                &millis(row.active_since),
                &millis(row.created_at),
                &millis(row.updated_at),
                &row.created_by,
            ],
        )?;
        Ok(())
    }

    pub(super) fn remove_schedule(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
    ) -> Result<bool> {
        let params: [&(dyn postgres::types::ToSql + Sync); 2] =
            [&namespace.as_str(), &name.as_str()];
        // The schedule first: its row lock waits for a fire under way, whose
        // fire row the second delete then sees.
        let deleted = self.execute(DELETE_SCHEDULE, &params)? > 0;
        self.execute(DELETE_FIRES, &params)?;
        Ok(deleted)
    }

    pub(super) fn remove_old_fires(
        &self,
        namespace: &Namespace,
        name: &ScheduleName,
        limit: usize,
    ) -> Result<usize> {
        let deleted = self.execute(
            TRIM_FIRES,
            &[&namespace.as_str(), &name.as_str(), &count(limit)],
        )?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    pub(super) fn record_fire(&self, fire: &NewFire<'_>) -> Result<bool> {
        let inserted = self.execute(
            INSERT_FIRE,
            &[
                &fire.namespace.as_str(),
                &fire.schedule.as_str(),
                &millis(fire.run_at),
                &fire.task_id.as_str(),
                &millis(fire.fired_at),
            ],
        )?;
        Ok(inserted > 0)
    }
}
