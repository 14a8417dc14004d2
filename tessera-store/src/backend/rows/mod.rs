//! The stored forms SQL backends share: rows with times in Unix
//! milliseconds and names as text, and their conversions to and from the
//! domain records. A backend reads its driver's rows into these and
//! writes them back; none of it names a driver.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_lease::{
    ArtifactKey, AttemptNumber, AttemptRecord, BriefVersion, ClaimKey, ClaimSource, ClaimableAt,
    ConcurrencyLimit, FencingToken, LeaseRecord, Namespace, ParentEnd, PartitionKey, Principal,
    QueueName, Receipt, RunAfter, StateName, TaskId, TaskRecord, TaskState, UniqueKey,
    UniqueStates, first_claimable,
};

use crate::backend::{LoadedTask, Result, TaskHandle};
use crate::error::{StorageError, StorageErrorKind};
use crate::model::bulk::{BulkFilter, BulkPosition};
use crate::model::health::{QueueDepth, StateCounts};
use crate::model::queue::QueueSettings;
use crate::model::task::{Brief, StoredReceipt, TaskCursor, TaskListing, TaskRef};

mod access;

pub(crate) use access::*;

/// A stored time: Unix milliseconds.
pub(crate) fn millis(time: DateTime<Utc>) -> i64 {
    time.timestamp_millis()
}

/// A stored time read back; out-of-range values clamp to the representable
/// range rather than fail a read.
pub(crate) fn from_millis(value: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(value).unwrap_or(if value < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// A `tasks` row, brief included; times in Unix milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct TaskRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) task_id: String,
    pub(crate) version: i64,
    /// `None` when the statement left the brief out.
    pub(crate) brief: Option<Vec<u8>>,
    pub(crate) brief_format: String,
    pub(crate) lapse_backoff_ms: i64,
    pub(crate) max_tries: i64,
    pub(crate) priority: i64,
    pub(crate) last_token: i64,
    pub(crate) claimable_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) partition_key: Option<String>,
    pub(crate) unique_key: Option<String>,
    /// The `UniqueStates` bits while the task holds its slot.
    pub(crate) unique_states: Option<i64>,
    /// Its own lease length in milliseconds.
    pub(crate) lease_ms: Option<i64>,
    /// Its deadline.
    pub(crate) deadline_at: Option<i64>,
}

/// The `lease_ms` and `deadline_at` columns of a task.
pub(crate) fn timing_columns(record: &TaskRecord) -> (Option<i64>, Option<i64>) {
    (
        record.lease_duration.map(duration_millis),
        record.deadline.map(millis),
    )
}

/// An `attempts` row; times in Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptRow {
    pub(crate) number: i64,
    pub(crate) state: String,
    pub(crate) until_at: Option<i64>,
    /// A discarded attempt's reason: `lapsed` or `failed`.
    pub(crate) discarded: Option<String>,
    pub(crate) last_error: Option<String>,
    pub(crate) tries: i64,
    pub(crate) holder: Option<String>,
    pub(crate) token: Option<i64>,
    pub(crate) granted_at: Option<i64>,
    pub(crate) expires_at: Option<i64>,
    /// While leased: the expiry plus the task's lapse backoff.
    pub(crate) lapses_at: Option<i64>,
}

/// An attempt of a listing with its task's columns, in the order
/// listing statements select them.
#[derive(Debug, Clone)]
pub(crate) struct ListingRow {
    /// Where a listing goes on after it, with `number`: a row id of the
    /// backend's listing order.
    pub(crate) position: i64,
    pub(crate) number: i64,
    pub(crate) state: String,
    pub(crate) until_at: Option<i64>,
    pub(crate) discarded: Option<String>,
    pub(crate) tries: i64,
    /// When the attempt reached its state, in milliseconds.
    pub(crate) changed_at: i64,
    pub(crate) queue: String,
    pub(crate) task_id: String,
    pub(crate) version: i64,
    pub(crate) partition_key: Option<String>,
    /// The attempt's last progress value, as JSON text.
    pub(crate) progress: Option<String>,
}

impl ListingRow {
    /// The listing of an attempt in `namespace`, and where a listing
    /// goes on after it.
    pub(crate) fn listing(self, namespace: &Namespace) -> Result<(TaskCursor, TaskListing)> {
        let bad = || corrupt("attempt row");
        let number = attempt_number(self.number).ok_or_else(bad)?;
        let task = TaskRef::new(
            namespace.clone(),
            TaskId::parse(&self.task_id).map_err(|_| corrupt("task row"))?,
            brief_version(self.version)?,
        );
        let listing = TaskListing {
            task,
            queue: QueueName::parse(&self.queue).map_err(|_| corrupt("task queue"))?,
            attempt: number,
            state: stored_state(&self.state, self.until_at, self.discarded.as_deref())?,
            tries: u32::try_from(self.tries).map_err(|_| bad())?,
            changed_at: from_millis(self.changed_at),
            partition_key: partition_key(self.partition_key.as_deref())?,
            progress: self.progress.as_deref().map(progress_value).transpose()?,
        };
        let cursor = TaskCursor {
            row: self.position,
            attempt: number.as_u16(),
        };
        Ok((cursor, listing))
    }
}

/// The range of a bulk scan: from after `after` (or the filter's start
/// if later) to the filter's end or `upto`, whichever is first, both
/// inclusive; `None` when it is empty.
pub(crate) fn bulk_range(
    filter: &BulkFilter,
    after: BulkPosition,
    upto: DateTime<Utc>,
) -> Option<(BulkPosition, i64)> {
    let start = match filter.changed_since {
        Some(since) => after.max(BulkPosition {
            leased: after.leased,
            changed_at: millis(since),
            task: i64::MIN,
            number: i64::MIN,
        }),
        None => after,
    };
    let end = match filter.changed_before {
        Some(before) => millis(before).saturating_sub(1).min(millis(upto)),
        None => millis(upto),
    };
    (start.changed_at <= end).then_some((start, end))
}

/// An attempt matching a bulk filter as read: its (changed_at, task row,
/// number), its task's id and version.
pub(crate) type MatchingRow = ((i64, i64, i64), String, i64);

/// A page of attempts matching a bulk filter in `namespace` (`leased`:
/// from the leased ones), from their positions and their tasks' ids and
/// versions.
pub(crate) fn matching(
    namespace: &Namespace,
    leased: bool,
    rows: Vec<MatchingRow>,
) -> Result<Vec<(BulkPosition, TaskRef)>> {
    rows.into_iter()
        .map(|((changed_at, task, number), task_id, version)| {
            let position = BulkPosition {
                leased,
                changed_at,
                task,
                number,
            };
            let id = TaskId::parse(&task_id).map_err(|_| corrupt("task row"))?;
            let reference = TaskRef::new(namespace.clone(), id, brief_version(version)?);
            Ok((position, reference))
        })
        .collect()
}

/// The progress values of a task's attempts as read back.
pub(crate) fn progress_list(rows: Vec<(i64, String)>) -> Result<Vec<(AttemptNumber, String)>> {
    rows.into_iter()
        .map(|(number, text)| {
            let number = attempt_number(number).ok_or_else(|| corrupt("attempt row"))?;
            Ok((number, text))
        })
        .collect()
}

/// A stored progress value.
pub(crate) fn progress_value(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|_| corrupt("attempt progress"))
}

/// A stored attempt number.
pub(crate) fn attempt_number(value: i64) -> Option<AttemptNumber> {
    u16::try_from(value)
        .ok()
        .and_then(|n| AttemptNumber::new(n).ok())
}

/// A stored brief version.
pub(crate) fn brief_version(value: i64) -> Result<BriefVersion> {
    u32::try_from(value)
        .ok()
        .and_then(|v| BriefVersion::new(v).ok())
        .ok_or_else(|| corrupt("task version"))
}

/// An attempt's state from its `state`, `until_at` and `discarded` columns.
fn stored_state(state: &str, until_at: Option<i64>, discarded: Option<&str>) -> Result<TaskState> {
    let bad = || corrupt("attempt row");
    let name: StateName = state.parse().map_err(|_| bad())?;
    let reason = match discarded {
        Some(reason) => Some(reason.parse().map_err(|_| bad())?),
        None => None,
    };
    TaskState::from_parts(name, until_at.map(from_millis), reason).map_err(|_| bad())
}

/// An accepted receipt as its attempt's row keeps it, of a known task;
/// times in Unix milliseconds. The attempt's number, token and holder are
/// the receipt's attempt, token and principal, and its artifact key is
/// the grant's ([`ArtifactKey::for_grant`]).
#[derive(Debug, Clone)]
pub(crate) struct ReceiptRow {
    pub(crate) attempt: i64,
    pub(crate) token: i64,
    pub(crate) principal: String,
    pub(crate) idempotency_key: String,
    pub(crate) digest: String,
    pub(crate) accepted_at: i64,
    pub(crate) output: Option<Vec<u8>>,
}

/// The receipt columns of an attempt row, as a submission that ends the
/// attempt writes them with its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReceiptColumns {
    pub(crate) idempotency_key: String,
    pub(crate) digest: String,
    pub(crate) accepted_at: i64,
    pub(crate) output: Option<Vec<u8>>,
}

impl ReceiptColumns {
    /// The columns of an accepted receipt, with its output bytes if kept.
    pub(crate) fn of(receipt: &Receipt, output: Option<&[u8]>) -> Self {
        Self {
            idempotency_key: receipt.idempotency_key.as_str().to_owned(),
            digest: receipt.digest.to_string(),
            accepted_at: millis(receipt.accepted_at),
            output: output.map(<[u8]>::to_vec),
        }
    }
}

/// A stored value this build cannot read back.
pub(crate) fn corrupt(what: &str) -> StorageError {
    StorageError::new(
        StorageErrorKind::Corrupt,
        None,
        format!("unreadable {what}"),
    )
}

/// A finished task's row as read (its row id, namespace and queue), with
/// no attempt yet.
pub(crate) fn finished_task(id: i64, namespace: &str, queue: &str) -> Result<super::FinishedTask> {
    Ok(super::FinishedTask {
        handle: TaskHandle(id),
        namespace: Namespace::parse(namespace).map_err(|_| corrupt("a task's namespace"))?,
        queue: QueueName::parse(queue).map_err(|_| corrupt("a task's queue"))?,
        attempts: Vec::new(),
    })
}

/// An attempt's stored state name and the time it was reached.
pub(crate) fn attempt_end(state: &str, changed_at: i64) -> Result<(StateName, DateTime<Utc>)> {
    let state = state
        .parse::<StateName>()
        .map_err(|_| corrupt("an attempt's state"))?;
    Ok((state, from_millis(changed_at)))
}

pub(crate) fn count(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The claim index's column: 0 while an attempt is ready, the earliest
/// backoff end otherwise, `NULL` when the lease rules say none
/// ([`TaskRecord::claimable_at`]).
/// The reference of a task stored in `namespace` as `id` at `version`.
pub(crate) fn task_ref(namespace: &Namespace, id: &str, version: i64) -> Result<TaskRef> {
    Ok(TaskRef::new(
        namespace.clone(),
        TaskId::parse(id).map_err(|_| corrupt("task row"))?,
        brief_version(version)?,
    ))
}

/// A stored task's reference read back from its namespace, id and version.
pub(crate) fn stored_task_ref(namespace: &str, id: &str, version: i64) -> Result<TaskRef> {
    let namespace = Namespace::parse(namespace).map_err(|_| corrupt("a task's namespace"))?;
    task_ref(&namespace, id, version)
}

/// An ended edge read back: the child's reference and rule, with how its
/// parent ended.
pub(crate) fn ended_edge(
    namespace: &str,
    task_id: &str,
    version: i64,
    run_after: &str,
    end: ParentEnd,
) -> Result<super::EndedEdge> {
    let namespace = Namespace::parse(namespace).map_err(|_| corrupt("an edge's namespace"))?;
    Ok(super::EndedEdge {
        child: task_ref(&namespace, task_id, version)?,
        run_after: RunAfter::parse(run_after).ok_or_else(|| corrupt("an edge's rule"))?,
        end,
    })
}

/// A stored partition key read back.
pub(crate) fn partition_key(value: Option<&str>) -> Result<Option<PartitionKey>> {
    value
        .map(PartitionKey::parse)
        .transpose()
        .map_err(|_| corrupt("task partition key"))
}

pub(crate) fn claimable_column(record: &TaskRecord) -> Option<i64> {
    record.claimable_at().map(|at| match at {
        ClaimableAt::Ready => 0,
        ClaimableAt::At(time) => millis(time),
    })
}

pub(crate) fn claimable_from_column(value: Option<i64>) -> ClaimableAt {
    match value {
        None | Some(0) => ClaimableAt::Ready,
        Some(at) => ClaimableAt::At(from_millis(at)),
    }
}

impl TaskRow {
    pub(crate) fn loaded(mut self, attempts: Vec<AttemptRow>) -> Result<LoadedTask> {
        let brief = match self.brief.take() {
            Some(bytes) => {
                Some(Brief::decode(bytes, &self.brief_format).map_err(|_| corrupt("task brief"))?)
            }
            None => None,
        };
        Ok(LoadedTask {
            handle: TaskHandle(self.id),
            queue: QueueName::parse(&self.queue).map_err(|_| corrupt("task queue"))?,
            created_at: from_millis(self.created_at),
            brief,
            partition_key: partition_key(self.partition_key.as_deref())?,
            unique_key: self
                .unique_key
                .as_deref()
                .map(UniqueKey::parse)
                .transpose()
                .map_err(|_| corrupt("task unique key"))?,
            unique_held: self
                .unique_states
                .map(|bits| u16::try_from(bits).map(UniqueStates::from_bits))
                .transpose()
                .map_err(|_| corrupt("task unique states"))?,
            record: self.record(attempts)?,
        })
    }

    pub(crate) fn record(&self, attempts: Vec<AttemptRow>) -> Result<TaskRecord> {
        Ok(TaskRecord {
            id: TaskId::parse(&self.task_id).map_err(|_| corrupt("task row"))?,
            version: brief_version(self.version)?,
            lapse_backoff: Duration::from_millis(
                u64::try_from(self.lapse_backoff_ms).map_err(|_| corrupt("task row"))?,
            ),
            max_tries: u32::try_from(self.max_tries).map_err(|_| corrupt("task row"))?,
            priority: u8::try_from(self.priority).map_err(|_| corrupt("task row"))?,
            lease_duration: self
                .lease_ms
                .map(|ms| u64::try_from(ms).map(Duration::from_millis))
                .transpose()
                .map_err(|_| corrupt("task row"))?,
            deadline: self.deadline_at.map(from_millis),
            last_token: match self.last_token {
                0 => None,
                token => Some(FencingToken::new(token).map_err(|_| corrupt("task row"))?),
            },
            attempts: attempts
                .iter()
                .map(AttemptRow::record)
                .collect::<Result<_>>()?,
        })
    }
}

impl AttemptRow {
    pub(crate) fn record(&self) -> Result<AttemptRecord> {
        let bad = || corrupt("attempt row");
        let state = stored_state(&self.state, self.until_at, self.discarded.as_deref())?;
        let lease = match (&self.holder, self.token, self.granted_at, self.expires_at) {
            (Some(holder), Some(token), Some(granted_at), Some(expires_at)) => Some(LeaseRecord {
                holder: holder.parse().map_err(|_| bad())?,
                token: FencingToken::new(token).map_err(|_| bad())?,
                granted_at: from_millis(granted_at),
                expires_at: from_millis(expires_at),
            }),
            (None, None, None, None) => None,
            _ => return Err(bad()),
        };
        Ok(AttemptRecord {
            number: attempt_number(self.number).ok_or_else(bad)?,
            state,
            tries: u32::try_from(self.tries).map_err(|_| bad())?,
            lease,
            last_error: self.last_error.clone(),
        })
    }

    /// The row of `record`, an attempt of a task with `lapse_backoff`.
    pub(crate) fn from_record(record: &AttemptRecord, lapse_backoff: Duration) -> Self {
        let lease = record.lease.as_ref();
        Self {
            number: i64::from(record.number.as_u16()),
            state: record.state.as_str().to_owned(),
            until_at: record.state.until().map(millis),
            discarded: record
                .state
                .discard_reason()
                .map(|reason| reason.as_str().to_owned()),
            last_error: record.last_error.clone(),
            tries: i64::from(record.tries),
            holder: lease.map(|l| l.holder.as_str().to_owned()),
            token: lease.map(|l| l.token.as_i64()),
            granted_at: lease.map(|l| millis(l.granted_at)),
            expires_at: lease.map(|l| millis(l.expires_at)),
            lapses_at: record.lapses_at(lapse_backoff).map(millis),
        }
    }
}

impl ReceiptRow {
    pub(crate) fn stored(self, task: &TaskRef) -> Result<StoredReceipt> {
        let bad = |_| corrupt("receipt row");
        let attempt = attempt_number(self.attempt).ok_or_else(|| corrupt("receipt row"))?;
        let token = FencingToken::new(self.token).map_err(bad)?;
        let receipt = Receipt {
            task: task.id.clone(),
            version: task.version,
            attempt,
            token,
            principal: self.principal.parse().map_err(bad)?,
            idempotency_key: self.idempotency_key.parse().map_err(bad)?,
            artifact: ArtifactKey::for_grant(&task.id, attempt, token),
            digest: self.digest.parse().map_err(bad)?,
            accepted_at: from_millis(self.accepted_at),
        };
        Ok(StoredReceipt {
            receipt,
            output: self.output,
        })
    }
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("scopes and grants serialize")
}

/// Names read back from a row; ones this build does not know are skipped,
/// which can only take permissions away.
pub(crate) fn names<T>(json: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
    let raw: Vec<String> =
        serde_json::from_str(json).map_err(|_| corrupt("key scopes or grants"))?;
    Ok(raw.iter().filter_map(|name| parse(name)).collect())
}

pub(crate) fn state_counts(by_state: Vec<(String, i64)>) -> Result<StateCounts> {
    let mut attempts = StateCounts::default();
    for (state, count) in by_state {
        let count = u64::try_from(count).unwrap_or(0);
        match state.parse::<StateName>() {
            Ok(StateName::Ready) => attempts.ready += count,
            Ok(StateName::Leased) => attempts.leased += count,
            Ok(StateName::Done) => attempts.done += count,
            Ok(StateName::Failed) => attempts.failed += count,
            Ok(StateName::Backoff) => attempts.backoff += count,
            Ok(StateName::Discarded) => attempts.discarded += count,
            Ok(StateName::Scheduled) => attempts.scheduled += count,
            Ok(StateName::Cancelled) => attempts.cancelled += count,
            Ok(StateName::Waiting) => attempts.waiting += count,
            Err(_) => return Err(corrupt("attempt state")),
        }
    }
    Ok(attempts)
}

/// Queue depths from the three reads behind them: per queue, the claim
/// order's entries claimable now and later, the live leases, and when
/// the first-enqueued claimable task was enqueued (milliseconds).
pub(crate) fn queue_depths(
    claimable: Vec<(String, i64, i64)>,
    leased: Vec<(String, i64)>,
    oldest: Vec<(String, i64)>,
) -> Result<Vec<QueueDepth>> {
    let mut depths = std::collections::BTreeMap::<String, QueueDepth>::new();
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    fn depth(
        depths: &mut std::collections::BTreeMap<String, QueueDepth>,
        queue: String,
    ) -> Result<&mut QueueDepth> {
        let name = QueueName::parse(&queue).map_err(|_| corrupt("a task's queue"))?;
        Ok(depths
            .entry(queue)
            .or_insert_with(|| QueueDepth::empty(name)))
    }
    for (queue, now, later) in claimable {
        let entry = depth(&mut depths, queue)?;
        entry.ready += count(now);
        entry.delayed += count(later);
    }
    for (queue, leases) in leased {
        depth(&mut depths, queue)?.leased += count(leases);
    }
    for (queue, enqueued) in oldest {
        depth(&mut depths, queue)?.oldest_ready_at = Some(from_millis(enqueued));
    }
    Ok(depths.into_values().collect())
}

/// The grant an attempt's lease names: all of it but the expiry.
pub(crate) fn grant(attempt: &AttemptRecord) -> Option<(&Principal, FencingToken, DateTime<Utc>)> {
    let lease = attempt.lease.as_ref()?;
    Some((&lease.holder, lease.token, lease.granted_at))
}

/// A `queue_settings` row as stored: the queue, when it was paused, and
/// its limits (`NULL` or 0 for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueSettingsRow {
    pub(crate) queue: String,
    pub(crate) paused_at: Option<i64>,
    pub(crate) queue_limit: Option<i64>,
    pub(crate) partition_limit: Option<i64>,
}

impl QueueSettingsRow {
    /// The row that stores `settings`.
    pub(crate) fn of(settings: &QueueSettings) -> Self {
        Self {
            queue: settings.queue.as_str().to_owned(),
            paused_at: settings.paused_at.map(millis),
            queue_limit: settings.limit.queue.map(|n| i64::from(n.get())),
            partition_limit: settings.limit.per_partition.map(|n| i64::from(n.get())),
        }
    }

    /// The settings it stores.
    pub(crate) fn settings(self) -> Result<QueueSettings> {
        let limit = |value: Option<i64>| match value {
            None => Ok(None),
            Some(value) => u32::try_from(value)
                .map(std::num::NonZeroU32::new)
                .map_err(|_| corrupt("queue limit")),
        };
        Ok(QueueSettings {
            queue: QueueName::parse(&self.queue).map_err(|_| corrupt("queue name"))?,
            paused_at: self.paused_at.map(from_millis),
            limit: ConcurrencyLimit {
                queue: limit(self.queue_limit)?,
                per_partition: limit(self.partition_limit)?,
            },
        })
    }
}

/// A `queue_retention` row as stored: the queue and its keep times in
/// milliseconds by final state (`NULL`: kept forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueRetentionRow {
    pub(crate) queue: String,
    pub(crate) done_ms: Option<i64>,
    pub(crate) discarded_ms: Option<i64>,
    pub(crate) cancelled_ms: Option<i64>,
}

impl QueueRetentionRow {
    /// The keep times of a row, in the columns' order.
    pub(crate) fn columns(retention: &tessera_lease::Retention) -> [Option<i64>; 3] {
        let ms = |keep: Option<Duration>| keep.map(|keep| keep.as_millis() as i64);
        [
            ms(retention.done),
            ms(retention.discarded),
            ms(retention.cancelled),
        ]
    }

    /// The queue and keep times it stores.
    pub(crate) fn retention(self) -> Result<(QueueName, tessera_lease::Retention)> {
        let keep = |value: Option<i64>| match value {
            None => Ok(None),
            Some(ms) => u64::try_from(ms)
                .map(|ms| Some(Duration::from_millis(ms)))
                .map_err(|_| corrupt("keep time")),
        };
        let retention = tessera_lease::Retention {
            done: keep(self.done_ms)?,
            discarded: keep(self.discarded_ms)?,
            cancelled: keep(self.cancelled_ms)?,
        };
        retention.check().map_err(|_| corrupt("keep time"))?;
        Ok((
            QueueName::parse(&self.queue).map_err(|_| corrupt("queue name"))?,
            retention,
        ))
    }
}

/// Claim candidates in claim order, each task once, about `limit` of
/// them: `search(priority, limit)` gives a priority's due entries of the
/// claim index (task row id, `claimable_at`) and of the lapsed leases
/// (task row id, `lapses_at`), each in its index order and at most
/// `limit`. Priorities are searched highest first until `limit` are found.
pub(crate) fn claim_candidates(
    limit: usize,
    mut search: impl FnMut(u8, usize) -> Result<(Vec<(i64, Option<i64>)>, Vec<(i64, i64)>)>,
) -> Result<Vec<TaskHandle>> {
    let mut keys: Vec<ClaimKey<i64>> = Vec::new();
    for priority in tessera_lease::priorities() {
        let (indexed, lapsed) = search(priority, limit)?;
        keys.extend(
            indexed
                .into_iter()
                .map(|(id, at)| ClaimKey::new(priority, claimable_from_column(at), id)),
        );
        keys.extend(
            lapsed
                .into_iter()
                .map(|(id, at)| ClaimKey::lapsed(priority, from_millis(at), id)),
        );
        if keys.len() >= limit {
            break;
        }
    }
    keys.sort();
    let mut seen = std::collections::HashSet::new();
    Ok(keys
        .into_iter()
        .filter(|key| seen.insert(key.sequence))
        .map(|key| TaskHandle(key.sequence))
        .collect())
}

/// The task a claim takes, from the first due entry of the claim index
/// (`indexed`) and the first due lapsed lease that could come before it
/// (`first_lapsed` from a priority floor: its task row id, lapse time and
/// priority), in the lease rules' claim order; `by_id` reads a lapsed
/// lease's task row.
pub(crate) fn next_claimable(
    indexed: Option<TaskRow>,
    first_lapsed: impl FnOnce(u8) -> Result<Option<(i64, i64, i64)>>,
    by_id: impl FnOnce(i64) -> Result<Option<TaskRow>>,
) -> Result<Option<TaskRow>> {
    let priority = |value: i64| u8::try_from(value).map_err(|_| corrupt("task priority"));
    let indexed_key = match &indexed {
        Some(row) => Some(ClaimKey::new(
            priority(row.priority)?,
            claimable_from_column(row.claimable_at),
            row.id,
        )),
        None => None,
    };
    // A ready task beats every lapse of its priority: search above it only.
    let floor = indexed_key.map_or(Some(0), |key| key.lapse_floor());
    let lapsed = match floor {
        None => None,
        Some(floor) => match first_lapsed(floor)? {
            Some((task, at, of)) => Some(ClaimKey::lapsed(priority(of)?, from_millis(at), task)),
            None => None,
        },
    };
    match (
        first_claimable(indexed_key.as_ref(), lapsed.as_ref()),
        lapsed,
    ) {
        (Some(ClaimSource::Claimable), _) => Ok(indexed),
        (Some(ClaimSource::Lapsed), Some(key)) => by_id(key.sequence),
        _ => Ok(None),
    }
}

/// The writes of a batch of acknowledgements, one per change in order,
/// each with the receipts of its task. A receipt of a task the batch did
/// not change is a broken batch, refused rather than lost.
pub(crate) fn acknowledged_writes(
    changes: &[super::TaskChange<'_>],
    receipts: &[super::NewReceipt<'_>],
) -> Result<Vec<TaskWrites>> {
    if let Some(stray) = receipts
        .iter()
        .find(|new| !changes.iter().any(|change| change.handle == new.handle))
    {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            None,
            format!(
                "a receipt of task row {} the batch did not change",
                stray.handle.0
            ),
        ));
    }
    changes
        .iter()
        .map(|change| {
            TaskWrites::between(change.before, change.after, change.at).with_receipts(
                receipts
                    .iter()
                    .filter(|new| new.handle == change.handle)
                    .map(|new| (new.receipt, new.output)),
            )
        })
        .collect()
}

/// One attempt's write, with the narrowest statement that stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptWrite {
    /// Only its state (and lapse time) moved.
    State(AttemptRow),
    /// Only its lease's expiry (and lapse time) moved: a heartbeat.
    Expiry(AttemptRow),
    /// Anything else: every column.
    Whole(AttemptRow),
}

/// What a lease rule changed in a task, as rows to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskWrites {
    pub(crate) attempts: Vec<AttemptWrite>,
    /// The new token counter, if it moved.
    pub(crate) last_token: Option<i64>,
    /// The new claim-index column, if it moved.
    pub(crate) claimable_at: Option<Option<i64>>,
    /// The new number of tries, if an operator's retry raised it.
    pub(crate) max_tries: Option<i64>,
    /// When the change was made: the `changed_at` its state and whole
    /// attempt writes set (`None`: keep the stored one).
    pub(crate) changed_at: Option<i64>,
    /// A heartbeat's progress value for an attempt (its number and JSON
    /// text), written with its lease's expiry.
    pub(crate) progress: Option<(i64, String)>,
    /// The receipts accepted for attempts whose state this writes, by
    /// attempt number: each is written by its attempt's state write, so
    /// the write that ends an attempt is also its receipt.
    pub(crate) receipts: Vec<(i64, ReceiptColumns)>,
}

impl TaskWrites {
    /// The writes that take a task stored as `before` to `after`, made
    /// at `at`.
    pub(crate) fn between(before: &TaskRecord, after: &TaskRecord, at: DateTime<Utc>) -> Self {
        let mut writes = Self {
            changed_at: Some(millis(at)),
            ..Self::default()
        };
        for (old, new) in before.attempts.iter().zip(&after.attempts) {
            if old == new {
                continue;
            }
            let row = AttemptRow::from_record(new, after.lapse_backoff);
            writes
                .attempts
                .push(if old.lease == new.lease && old.tries == new.tries {
                    AttemptWrite::State(row)
                } else if row.expires_at.is_some()
                    && old.state == new.state
                    && old.tries == new.tries
                    && grant(old) == grant(new)
                {
                    AttemptWrite::Expiry(row)
                } else {
                    AttemptWrite::Whole(row)
                });
        }
        if before.last_token != after.last_token {
            writes.last_token = Some(after.last_token.map_or(0, FencingToken::as_i64));
        }
        let claimable = claimable_column(after);
        if claimable_column(before) != claimable {
            writes.claimable_at = Some(claimable);
        }
        if before.max_tries != after.max_tries {
            writes.max_tries = Some(i64::from(after.max_tries));
        }
        writes
    }

    /// The writes that store again what the claim order keeps of `record`:
    /// its leased attempts whole, and its claim column.
    pub(crate) fn resync(record: &TaskRecord) -> Self {
        Self {
            attempts: record
                .attempts
                .iter()
                .filter(|attempt| attempt.state == TaskState::Leased)
                .map(|attempt| {
                    AttemptWrite::Whole(AttemptRow::from_record(attempt, record.lapse_backoff))
                })
                .collect(),
            last_token: None,
            claimable_at: Some(claimable_column(record)),
            max_tries: None,
            changed_at: None,
            progress: None,
            receipts: Vec::new(),
        }
    }

    /// Adds the receipts accepted for this task's attempts, each of an
    /// attempt whose state this writes (a submission ends its attempt).
    /// A receipt of an attempt without a state write is a broken batch,
    /// refused rather than lost.
    pub(crate) fn with_receipts<'r>(
        mut self,
        receipts: impl IntoIterator<Item = (&'r Receipt, Option<&'r [u8]>)>,
    ) -> Result<Self> {
        for (receipt, output) in receipts {
            let number = i64::from(receipt.attempt.as_u16());
            let written = self
                .attempts
                .iter()
                .any(|write| matches!(write, AttemptWrite::State(row) if row.number == number));
            if !written {
                return Err(StorageError::new(
                    StorageErrorKind::Other,
                    None,
                    "a receipt of an attempt whose state was not written",
                ));
            }
            self.receipts
                .push((number, ReceiptColumns::of(receipt, output)));
        }
        Ok(self)
    }

    /// The receipt the state write of attempt `number` carries.
    pub(crate) fn receipt(&self, number: i64) -> Option<&ReceiptColumns> {
        self.receipts
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, columns)| columns)
    }

    /// Whether there is nothing to write.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.attempts.is_empty()
            && self.last_token.is_none()
            && self.claimable_at.is_none()
            && self.max_tries.is_none()
            && self.progress.is_none()
    }
}

#[cfg(test)]
mod tests;
