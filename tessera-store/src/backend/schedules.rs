//! Schedule rows as both backends read them: the columns in one order,
//! decoded once.

use tessera_lease::{Namespace, QueueName, ScheduleName};

use super::rows::{corrupt, from_millis};
use super::{Result, ScheduleRow};

/// A schedule's columns as read, in the order every backend selects them:
/// namespace, name, queue, cron, zone, brief, brief format, options,
/// paused, active since, created, updated, created by, last run-at.
#[derive(Debug)]
#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
pub(crate) struct RawSchedule {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) queue: String,
    pub(crate) cron: String,
    pub(crate) zone: String,
    pub(crate) brief: Vec<u8>,
    pub(crate) brief_format: String,
    pub(crate) options: String,
    pub(crate) paused: i64,
    pub(crate) active_since: i64,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) created_by: String,
    pub(crate) last_run_at: Option<i64>,
}

#[cfg_attr(not(feature = "schedule"), allow(dead_code))]
impl RawSchedule {
    /// The row, its names checked.
    pub(crate) fn decode(self) -> Result<ScheduleRow> {
        Ok(ScheduleRow {
            namespace: Namespace::parse(&self.namespace)
                .map_err(|_| corrupt("schedule namespace"))?,
            name: ScheduleName::parse(&self.name).map_err(|_| corrupt("schedule name"))?,
            queue: QueueName::parse(&self.queue).map_err(|_| corrupt("schedule queue"))?,
            cron: self.cron,
            zone: self.zone,
            brief: self.brief,
            brief_format: self.brief_format,
            options: self.options,
            paused: self.paused != 0,
            active_since: from_millis(self.active_since),
            created_at: from_millis(self.created_at),
            updated_at: from_millis(self.updated_at),
            created_by: self.created_by,
            last_run_at: self.last_run_at.map(from_millis),
        })
    }
}
