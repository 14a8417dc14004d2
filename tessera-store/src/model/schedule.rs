//! Periodic schedules as a host sees them: what to put, what a read shows,
//! and what a scheduler's pass fired.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::Resource;
use tessera_lease::{
    BriefVersion, CronSchedule, Namespace, QueueName, ScheduleName, ScheduleText, TaskSpec,
};

use crate::backend::ScheduleRow;
use crate::error::{Error, corrupt};
use crate::model::task::{Brief, TaskRef};

/// The most schedules one listing returns.
pub const MAX_SCHEDULES_LISTED: usize = 100;

/// A periodic schedule to put ([`Store::put_schedule`](crate::Store::put_schedule)):
/// when it fires, and the task each fire enqueues.
///
/// ```
/// use tessera_store::{Brief, QueueName, ScheduleSpec};
///
/// let spec = ScheduleSpec::new(
///     QueueName::parse("reports")?,
///     "30 2 * * *",
///     "Europe/Stockholm",
///     Brief::Json(serde_json::json!({ "report": "nightly" })),
/// );
/// assert_eq!(spec.schedule.cron, "30 2 * * *");
/// # Ok::<(), tessera_store::LeaseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// The queue each fire enqueues into.
    pub queue: QueueName,
    /// The cron expression and its IANA time zone, as written; checked
    /// when the schedule is put (`400 invalid_input` for either).
    pub schedule: ScheduleText,
    /// The brief every fire's task carries.
    pub brief: Brief,
    /// The brief's version (default 1).
    #[serde(default = "first_version")]
    pub version: BriefVersion,
    /// How each fire's task is set up: alternatives, tries, lapse backoff,
    /// priority and its own lease length, as an enqueue's. A not-before
    /// time is refused (a fire's task is claimable at once), and so is a
    /// deadline (one time would pass for every fire).
    #[serde(default)]
    pub spec: TaskSpec,
}

fn first_version() -> BriefVersion {
    BriefVersion::FIRST
}

impl ScheduleSpec {
    /// Fires `brief` into `queue` at each run-at of `cron` read in `zone`,
    /// with the default enqueue options.
    pub fn new(queue: QueueName, cron: &str, zone: &str, brief: Brief) -> Self {
        Self {
            queue,
            schedule: ScheduleText {
                cron: cron.to_owned(),
                zone: zone.to_owned(),
            },
            brief,
            version: BriefVersion::FIRST,
            spec: TaskSpec::default(),
        }
    }

    /// The same schedule, its tasks set up by `spec`.
    pub fn with_spec(mut self, spec: TaskSpec) -> Self {
        self.spec = spec;
        self
    }

    /// The same schedule, its tasks' briefs at `version`.
    pub fn with_version(mut self, version: BriefVersion) -> Self {
        self.version = version;
        self
    }
}

/// A stored schedule, as [`Store::read_schedule`](crate::Store::read_schedule)
/// and the listing show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleView {
    /// Its namespace.
    pub namespace: Namespace,
    /// Its name, unique in the namespace.
    pub name: ScheduleName,
    /// The queue its fires enqueue into.
    pub queue: QueueName,
    /// The cron expression and time zone.
    pub schedule: ScheduleText,
    /// The brief each fire's task carries.
    pub brief: Brief,
    /// The brief's version.
    pub version: BriefVersion,
    /// How each fire's task is set up.
    pub spec: TaskSpec,
    /// Whether it is paused: a scheduler fires nothing of it.
    pub paused: bool,
    /// Run-ats at or before this never fire: when it was put, replaced or
    /// last resumed.
    pub active_since: DateTime<Utc>,
    /// When it was first put.
    pub created_at: DateTime<Utc>,
    /// When it was last put, paused or resumed.
    pub updated_at: DateTime<Utc>,
    /// The last run-at fired, if any.
    pub last_run_at: Option<DateTime<Utc>>,
    /// The run-at a scheduler fires next, as of the read: one already due
    /// (fired at the next pass), else the next occurrence. `None` while
    /// paused, or when the expression never matches again.
    pub next_run_at: Option<DateTime<Utc>>,
}

/// One page of a namespace's schedules, in name order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulePage {
    /// The schedules.
    pub schedules: Vec<ScheduleView>,
    /// The name to pass as `after` for the next page; `None` on the last.
    pub next: Option<ScheduleName>,
}

/// One run-at a scheduler's pass fired: the fire recorded and its task
/// enqueued, in one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fired {
    /// The schedule's namespace.
    pub namespace: Namespace,
    /// The schedule.
    pub schedule: ScheduleName,
    /// The run-at fired.
    pub run_at: DateTime<Utc>,
    /// The task it enqueued ([`fire_task_id`](tessera_lease::fire_task_id)
    /// names it), or found already there under that id.
    pub task: TaskRef,
    /// Whether the task was created by this fire (`false`: a task with its
    /// id and version was there already, and was left as it was).
    pub created: bool,
}

/// The enqueue options a schedule keeps, as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct StoredOptions {
    pub(crate) version: BriefVersion,
    pub(crate) spec: TaskSpec,
}

impl StoredOptions {
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).expect("options always serialize")
    }

    pub(crate) fn decode(text: &str) -> Result<Self, Error> {
        serde_json::from_str(text).map_err(|_| corrupt("schedule options"))
    }
}

/// A stored schedule's parsed parts.
pub(crate) struct Loaded {
    pub(crate) cron: CronSchedule,
    pub(crate) options: StoredOptions,
}

impl Loaded {
    pub(crate) fn of(row: &ScheduleRow) -> Result<Self, Error> {
        let cron =
            CronSchedule::parse(&row.cron, &row.zone).map_err(|_| corrupt("schedule cron"))?;
        Ok(Self {
            cron,
            options: StoredOptions::decode(&row.options)?,
        })
    }

    /// The run-at due at `now`, if one is.
    pub(crate) fn due(&self, row: &ScheduleRow, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.due_since(row.active_since, row.last_run_at, now)
    }
}

/// The view of a stored schedule at `now`.
pub(crate) fn view(row: ScheduleRow, now: DateTime<Utc>) -> Result<ScheduleView, Error> {
    let loaded = Loaded::of(&row)?;
    let next_run_at = if row.paused {
        None
    } else {
        loaded
            .due(&row, now)
            .or_else(|| loaded.cron.next_after(now.max(row.active_since)))
    };
    Ok(ScheduleView {
        brief: Brief::decode(row.brief, &row.brief_format)?,
        namespace: row.namespace,
        name: row.name,
        queue: row.queue,
        schedule: ScheduleText {
            cron: row.cron,
            zone: row.zone,
        },
        version: loaded.options.version,
        spec: loaded.options.spec,
        paused: row.paused,
        active_since: row.active_since,
        created_at: row.created_at,
        updated_at: row.updated_at,
        last_run_at: row.last_run_at,
        next_run_at,
    })
}

/// The audit resource naming a schedule, followed by `suffix`.
pub(crate) fn resource(name: &ScheduleName, suffix: &str) -> Option<Resource> {
    Resource::new(&format!("schedule:{name}{suffix}")).ok()
}

/// `404` for a schedule that is not there.
pub(crate) fn not_found(namespace: &Namespace, name: &ScheduleName) -> Error {
    Error::NotFound {
        what: format!("schedule {namespace}/{name}"),
    }
}
