//! The seam's read and write transactions on SQLite: each operation of
//! [`ReadTransaction`] and [`WriteTransaction`] as statements, and the rows
//! they read turned back into domain records.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter, CounterKey, Minute, Resource};
use tessera_lease::{
    AttemptNumber, AttemptRecord, BriefVersion, ClaimKey, ClaimSource, ClaimableAt, FencingToken,
    IdempotencyKey, LeaseRecord, Namespace, Principal, QueueName, Receipt, StateName, TaskId,
    TaskRecord, TaskState, first_claimable,
};

use super::access::{self as keys, KeyRow};
use super::audit::{self as events, CounterRow, EventRow};
use super::connection::{Reader, Writer};
use super::session as meta;
use super::statements::{from_millis, millis};
use super::tasks::{self as sql, AttemptRow, NewReceipt, ReceiptRow, TaskRow};
use crate::backend::{
    KeyChange, LimitWindow, LoadedTask, NamespaceKind, NewKey, NewTask, Purge, ReadTransaction,
    Result, StoredKey, TaskHandle, WriteTransaction,
};
use crate::error::{StorageError, StorageErrorKind};
use crate::key::KeyId;
use crate::model::access::{Grant, KeyInfo, PrincipalId, PrincipalKind, Scope};
use crate::model::health::StateCounts;
use crate::model::task::{Brief, StoredReceipt, TaskRef};

/// A stored value this build cannot read back.
fn corrupt(what: &str) -> StorageError {
    StorageError::new(
        StorageErrorKind::Corrupt,
        None,
        format!("unreadable {what}"),
    )
}

fn count(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The claim index's column: 0 while an attempt is ready, the earliest
/// backoff end otherwise, `NULL` when the lease rules say none
/// ([`TaskRecord::claimable_at`]).
fn claimable_column(record: &TaskRecord) -> Option<i64> {
    record.claimable_at().map(|at| match at {
        ClaimableAt::Ready => 0,
        ClaimableAt::At(time) => millis(time),
    })
}

fn claimable_from_column(value: Option<i64>) -> ClaimableAt {
    match value {
        None | Some(0) => ClaimableAt::Ready,
        Some(at) => ClaimableAt::At(from_millis(at)),
    }
}

impl TaskRow {
    fn loaded(mut self, attempts: Vec<AttemptRow>) -> Result<LoadedTask> {
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
            record: self.record(attempts)?,
        })
    }

    fn record(&self, attempts: Vec<AttemptRow>) -> Result<TaskRecord> {
        Ok(TaskRecord {
            id: TaskId::parse(&self.task_id).map_err(|_| corrupt("task row"))?,
            version: u32::try_from(self.version)
                .ok()
                .and_then(|v| BriefVersion::new(v).ok())
                .ok_or_else(|| corrupt("task version"))?,
            lapse_backoff: Duration::from_millis(
                u64::try_from(self.lapse_backoff_ms).map_err(|_| corrupt("task row"))?,
            ),
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
    fn record(&self) -> Result<AttemptRecord> {
        let bad = || corrupt("attempt row");
        let name: StateName = self.state.parse().map_err(|_| bad())?;
        let state =
            TaskState::from_parts(name, self.until_at.map(from_millis)).map_err(|_| bad())?;
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
            number: u16::try_from(self.number)
                .ok()
                .and_then(|n| AttemptNumber::new(n).ok())
                .ok_or_else(bad)?,
            state,
            tries: u32::try_from(self.tries).map_err(|_| bad())?,
            lease,
        })
    }

    /// The row of `record`, an attempt of a task with `lapse_backoff`.
    fn from_record(record: &AttemptRecord, lapse_backoff: Duration) -> Self {
        let lease = record.lease.as_ref();
        Self {
            number: i64::from(record.number.as_u16()),
            state: record.state.as_str().to_owned(),
            until_at: record.state.until().map(millis),
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
    fn stored(self, task: &TaskRef) -> Result<StoredReceipt> {
        let bad = |_| corrupt("receipt row");
        let receipt = Receipt {
            task: task.id.clone(),
            version: task.version,
            attempt: u16::try_from(self.attempt)
                .ok()
                .and_then(|n| AttemptNumber::new(n).ok())
                .ok_or_else(|| corrupt("receipt row"))?,
            token: FencingToken::new(self.token).map_err(bad)?,
            principal: self.principal.parse().map_err(bad)?,
            idempotency_key: self.idempotency_key.parse().map_err(bad)?,
            artifact: self.artifact.parse().map_err(bad)?,
            digest: self.digest.parse().map_err(bad)?,
            accepted_at: from_millis(self.accepted_at),
        };
        Ok(StoredReceipt {
            receipt,
            output: self.output,
        })
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("scopes and grants serialize")
}

/// Names read back from a row; ones this build does not know are skipped,
/// which can only take permissions away.
fn names<T>(json: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
    let raw: Vec<String> =
        serde_json::from_str(json).map_err(|_| corrupt("key scopes or grants"))?;
    Ok(raw.iter().filter_map(|name| parse(name)).collect())
}

impl KeyRow {
    fn info(&self) -> Result<KeyInfo> {
        let bad = || corrupt("key row");
        Ok(KeyInfo {
            key_id: KeyId::parse(&self.key_id).map_err(|_| bad())?,
            principal: PrincipalId(self.principal_id),
            kind: PrincipalKind::parse(&self.kind).ok_or_else(bad)?,
            account: self.account.clone(),
            label: self.label.clone(),
            scopes: names(&self.scopes, Scope::parse)?,
            grants: names(&self.grants, |name| Grant::parse(name).ok())?,
            created_at: from_millis(self.created_at),
            expires_at: self.expires_at.map(from_millis),
            revoked_at: self.revoked_at.map(from_millis),
            last_used_at: self.last_used_at.map(from_millis),
        })
    }
}

impl EventRow {
    fn from_event(event: &AuditEvent) -> Self {
        Self {
            at: millis(event.time),
            principal: event.principal.as_str().to_owned(),
            namespace: event.namespace.as_str().to_owned(),
            action: event.action.as_str().to_owned(),
            outcome: event.outcome.as_str().to_owned(),
            resource: event.resource.as_ref().map(|r| r.as_str().to_owned()),
            ip_hash: event.ip_hash.as_ref().map(|h| h.as_str().to_owned()),
        }
    }

    fn event(&self) -> Result<AuditEvent> {
        let bad = |_| corrupt("audit row");
        Ok(AuditEvent {
            time: from_millis(self.at),
            principal: tessera_audit::Principal::new(&self.principal).map_err(bad)?,
            namespace: tessera_audit::Namespace::new(&self.namespace).map_err(bad)?,
            action: self.action.parse().map_err(bad)?,
            outcome: self.outcome.parse().map_err(bad)?,
            resource: self
                .resource
                .as_deref()
                .map(Resource::new)
                .transpose()
                .map_err(bad)?,
            ip_hash: self
                .ip_hash
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(bad)?,
        })
    }
}

/// A counter minute as stored: minutes since the Unix epoch.
fn minute_number(start: DateTime<Utc>) -> i64 {
    millis(start).div_euclid(60_000)
}

impl CounterRow {
    fn from_counter(counter: &Counter) -> Self {
        let key = &counter.key;
        Self {
            minute: minute_number(key.minute().start()),
            principal: key
                .principal()
                .map_or_else(String::new, |p| p.as_str().to_owned()),
            namespace: key.namespace().as_str().to_owned(),
            action: key.action().as_str().to_owned(),
            outcome: key.outcome().as_str().to_owned(),
            count: i64::try_from(counter.count).unwrap_or(i64::MAX),
        }
    }

    fn counter(&self) -> Result<Counter> {
        let bad = |_| corrupt("counter row");
        let start = self
            .minute
            .checked_mul(60_000)
            .and_then(DateTime::from_timestamp_millis)
            .ok_or_else(|| corrupt("counter row"))?;
        let principal = match self.principal.as_str() {
            "" => None,
            name => Some(tessera_audit::Principal::new(name).map_err(bad)?),
        };
        Ok(Counter {
            key: CounterKey::new(
                Minute::from_start(start).map_err(bad)?.start(),
                principal,
                tessera_audit::Namespace::new(&self.namespace).map_err(bad)?,
                self.action.parse().map_err(bad)?,
                self.outcome.parse().map_err(bad)?,
            ),
            count: u64::try_from(self.count).unwrap_or(0),
        })
    }
}

/// A task row with its attempts.
fn load(reader: &Reader<'_>, row: TaskRow) -> Result<LoadedTask> {
    let attempts = sql::attempts_of_task(reader, row.id)?;
    row.loaded(attempts)
}

fn state_counts(by_state: Vec<(String, i64)>) -> Result<StateCounts> {
    let mut attempts = StateCounts::default();
    for (state, count) in by_state {
        let count = u64::try_from(count).unwrap_or(0);
        match state.parse::<StateName>() {
            Ok(StateName::Ready) => attempts.ready += count,
            Ok(StateName::Leased) => attempts.leased += count,
            Ok(StateName::Done) => attempts.done += count,
            Ok(StateName::Failed) => attempts.failed += count,
            Ok(StateName::Backoff) => attempts.backoff += count,
            Err(_) => return Err(corrupt("attempt state")),
        }
    }
    Ok(attempts)
}

impl ReadTransaction for Reader<'_> {
    fn key(&self, key_id: &KeyId) -> Result<Option<StoredKey>> {
        keys::key_by_key_id(self, key_id.as_str())?
            .map(|row| {
                Ok(StoredKey {
                    info: row.info()?,
                    secret_hash: row.secret_hash,
                })
            })
            .transpose()
    }

    fn keys(
        &self,
        principal: Option<PrincipalId>,
        after: Option<&KeyId>,
        limit: usize,
    ) -> Result<Vec<KeyInfo>> {
        let after = after.map_or("", KeyId::as_str);
        let rows = match principal {
            Some(principal) => keys::keys_of_principal(self, principal.0, after, count(limit))?,
            None => keys::keys_all(self, after, count(limit))?,
        };
        rows.iter().map(KeyRow::info).collect()
    }

    fn principal(&self, principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>> {
        keys::principal_by_id(self, principal.0)?
            .map(|(kind, account)| {
                let kind = PrincipalKind::parse(&kind).ok_or_else(|| corrupt("principal kind"))?;
                Ok((kind, account))
            })
            .transpose()
    }

    fn events(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<AuditEvent>> {
        events::events(self, principal, millis(since), count(limit))?
            .iter()
            .map(EventRow::event)
            .collect()
    }

    fn counters(
        &self,
        principal: Option<&str>,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Counter>> {
        events::counters(self, principal, minute_number(since), count(limit))?
            .iter()
            .map(CounterRow::counter)
            .collect()
    }

    fn namespace_exists(&self, namespace: &Namespace) -> Result<bool> {
        Ok(sql::namespace_exists(self, namespace.as_str())?)
    }

    fn task(&self, task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>> {
        let row = sql::task_by_ref(
            self,
            task.namespace.as_str(),
            task.id.as_str(),
            i64::from(task.version.as_u32()),
            with_brief,
        )?;
        row.map(|row| load(self, row)).transpose()
    }

    fn find_task(&self, task: &TaskRef) -> Result<Option<TaskHandle>> {
        let row = sql::task_by_ref(
            self,
            task.namespace.as_str(),
            task.id.as_str(),
            i64::from(task.version.as_u32()),
            false,
        )?;
        Ok(row.map(|row| TaskHandle(row.id)))
    }

    /// Two index searches, `tasks_claimable` and `attempts_leased`, and
    /// the chosen task's row; the lease rules' claim order decides.
    fn next_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<Option<LoadedTask>> {
        let (namespace, queue, now) = (namespace.as_str(), queue.as_str(), millis(now));
        let indexed = sql::oldest_claimable(self, namespace, queue, now)?;
        let indexed_key = indexed
            .as_ref()
            .map(|row| ClaimKey::new(claimable_from_column(row.claimable_at), row.id));
        // A ready task is first whatever lapsed: no second search.
        let lapsed = match indexed_key {
            Some(ClaimKey {
                at: ClaimableAt::Ready,
                ..
            }) => None,
            _ => sql::oldest_lapsed(self, namespace, queue, now)?,
        };
        let lapsed_key = lapsed.map(|(task, at)| ClaimKey::lapsed(from_millis(at), task));
        let row = match first_claimable(indexed_key.as_ref(), lapsed_key.as_ref()) {
            Some(ClaimSource::Claimable) => indexed,
            Some(ClaimSource::Lapsed) => {
                let task = lapsed_key.map(|key| key.sequence).unwrap_or_default();
                sql::task_by_id(self, task, true)?
            }
            None => None,
        };
        row.map(|row| load(self, row)).transpose()
    }

    fn has_claimable(
        &self,
        namespace: &Namespace,
        queue: &QueueName,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(sql::has_claimable(
            self,
            namespace.as_str(),
            queue.as_str(),
            millis(now),
        )?)
    }

    fn receipt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        principal: &Principal,
        key: &IdempotencyKey,
    ) -> Result<Option<StoredReceipt>> {
        sql::receipt_by_key(self, principal.as_str(), handle.0, key.as_str())?
            .map(|row| row.stored(task))
            .transpose()
    }

    fn receipts_of_attempt(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        attempt: AttemptNumber,
    ) -> Result<Vec<StoredReceipt>> {
        sql::receipts_of_attempt(self, handle.0, i64::from(attempt.as_u16()))?
            .into_iter()
            .map(|row| row.stored(task))
            .collect()
    }

    fn receipts_of_task(
        &self,
        task: &TaskRef,
        handle: TaskHandle,
        limit: usize,
    ) -> Result<Vec<StoredReceipt>> {
        sql::receipts_of_task(self, handle.0, count(limit))?
            .into_iter()
            .map(|row| row.stored(task))
            .collect()
    }

    /// Attempts per state from the `attempts_state` index and the expired
    /// leases from the namespace's `attempts_leased` entries.
    fn health(&self, namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)> {
        let attempts = state_counts(sql::count_by_state(self, namespace.as_str())?)?;
        let expired = sql::count_lapsed_leases(self, namespace.as_str(), millis(now))?;
        Ok((attempts, u64::try_from(expired).unwrap_or(0)))
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(meta::meta_value(self, key)?)
    }

    fn limit_count(&self, subject: &str, start: DateTime<Utc>) -> Result<u64> {
        let stored = meta::limit_count(self, subject, millis(start))?;
        Ok(u64::try_from(stored).unwrap_or(0))
    }
}

/// A write transaction reads through its own connection, seeing its own
/// writes.
macro_rules! reads_through_writer {
    ($($name:ident($($arg:ident: $type:ty),*) -> $out:ty;)*) => {
        impl ReadTransaction for Writer<'_> {
            $(fn $name(&self, $($arg: $type),*) -> $out {
                let reader: &Reader<'_> = self;
                reader.$name($($arg),*)
            })*
        }
    };
}

reads_through_writer! {
    key(key_id: &KeyId) -> Result<Option<StoredKey>>;
    keys(principal: Option<PrincipalId>, after: Option<&KeyId>, limit: usize) -> Result<Vec<KeyInfo>>;
    principal(principal: PrincipalId) -> Result<Option<(PrincipalKind, String)>>;
    events(principal: Option<&str>, since: DateTime<Utc>, limit: usize) -> Result<Vec<AuditEvent>>;
    counters(principal: Option<&str>, since: DateTime<Utc>, limit: usize) -> Result<Vec<Counter>>;
    namespace_exists(namespace: &Namespace) -> Result<bool>;
    task(task: &TaskRef, with_brief: bool) -> Result<Option<LoadedTask>>;
    find_task(task: &TaskRef) -> Result<Option<TaskHandle>>;
    next_claimable(namespace: &Namespace, queue: &QueueName, now: DateTime<Utc>) -> Result<Option<LoadedTask>>;
    has_claimable(namespace: &Namespace, queue: &QueueName, now: DateTime<Utc>) -> Result<bool>;
    receipt(task: &TaskRef, handle: TaskHandle, principal: &Principal, key: &IdempotencyKey) -> Result<Option<StoredReceipt>>;
    receipts_of_attempt(task: &TaskRef, handle: TaskHandle, attempt: AttemptNumber) -> Result<Vec<StoredReceipt>>;
    receipts_of_task(task: &TaskRef, handle: TaskHandle, limit: usize) -> Result<Vec<StoredReceipt>>;
    health(namespace: &Namespace, now: DateTime<Utc>) -> Result<(StateCounts, u64)>;
    meta(key: &str) -> Result<Option<String>>;
    limit_count(subject: &str, start: DateTime<Utc>) -> Result<u64>;
}

/// The grant an attempt's lease names: all of it but the expiry.
fn grant(attempt: &AttemptRecord) -> Option<(&Principal, FencingToken, DateTime<Utc>)> {
    let lease = attempt.lease.as_ref()?;
    Some((&lease.holder, lease.token, lease.granted_at))
}

impl WriteTransaction for Writer<'_> {
    fn reads(&self) -> &dyn ReadTransaction {
        self
    }

    fn insert_principal(
        &self,
        kind: PrincipalKind,
        account: &str,
        created_at: DateTime<Utc>,
        purge_at: Option<DateTime<Utc>>,
    ) -> Result<PrincipalId> {
        let id = keys::insert_principal(
            self,
            kind.as_str(),
            account,
            millis(created_at),
            purge_at.map(millis),
        )?;
        Ok(PrincipalId(id))
    }

    fn insert_key(&self, key: &NewKey<'_>) -> Result<bool> {
        let inserted = keys::insert_key(
            self,
            &keys::NewKey {
                key_id: key.key_id.as_str(),
                principal_id: key.principal.0,
                secret_hash: key.secret_hash,
                label: key.label,
                scopes: &to_json(&key.scopes),
                grants: &to_json(&key.grants),
                created_at: millis(key.created_at),
                expires_at: key.expires_at.map(millis),
                purge_at: key.purge_at.map(millis),
            },
        )?;
        Ok(inserted.is_some())
    }

    fn change_key(&self, key_id: &KeyId, change: KeyChange) -> Result<()> {
        match change {
            KeyChange::Revoke(at) => keys::revoke_key(self, key_id.as_str(), millis(at))?,
            KeyChange::Expire(at) => keys::expire_key(self, key_id.as_str(), millis(at))?,
        }
        Ok(())
    }

    fn touch_principal(&self, principal: PrincipalId, at: DateTime<Utc>) -> Result<()> {
        Ok(keys::touch_principal(self, principal.0, millis(at))?)
    }

    fn insert_event(&self, event: &AuditEvent) -> Result<()> {
        Ok(events::insert_event(self, &EventRow::from_event(event))?)
    }

    fn add_counter(&self, counter: &Counter) -> Result<()> {
        Ok(events::add_to_counter(
            self,
            &CounterRow::from_counter(counter),
        )?)
    }

    fn purge(&self, what: Purge, threshold: DateTime<Utc>, limit: usize) -> Result<usize> {
        let (statement, threshold) = match what {
            Purge::Keys => (events::PURGE_KEYS, millis(threshold)),
            Purge::Principals => (events::PURGE_PRINCIPALS, millis(threshold)),
            Purge::Limits => (events::PURGE_LIMITS, millis(threshold)),
            Purge::Events => (events::PURGE_EVENTS, millis(threshold)),
            Purge::Counters => (events::PURGE_COUNTERS, minute_number(threshold)),
        };
        Ok(events::purge(self, statement, threshold, count(limit))?)
    }

    fn insert_namespace(
        &self,
        namespace: &Namespace,
        kind: NamespaceKind,
        at: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(sql::insert_namespace(
            self,
            namespace.as_str(),
            kind.as_str(),
            millis(at),
        )?)
    }

    fn insert_task(&self, task: &NewTask<'_>) -> Result<bool> {
        let reference = task.task;
        let inserted = sql::insert_task(
            self,
            &sql::NewTask {
                namespace: reference.namespace.as_str(),
                queue: task.queue.as_str(),
                task_id: reference.id.as_str(),
                version: i64::from(reference.version.as_u32()),
                brief: task.brief,
                brief_format: task.brief_format,
                alternatives: i64::from(task.spec.alternatives),
                lapse_backoff_ms: duration_millis(task.spec.lapse_backoff),
                created_at: millis(task.created_at),
                enqueued_by: task.enqueued_by,
            },
        )?;
        let Some(id) = inserted else {
            return Ok(false);
        };
        for number in 1..=task.spec.alternatives {
            sql::insert_attempt(
                self,
                id,
                i64::from(number),
                reference.namespace.as_str(),
                task.queue.as_str(),
            )?;
        }
        Ok(true)
    }

    /// Writes the attempts of `after` that differ from `before`, each with
    /// the narrowest statement that covers the change, and the task's token
    /// counter and claim time if they changed.
    fn save_task(&self, handle: TaskHandle, before: &TaskRecord, after: &TaskRecord) -> Result<()> {
        let id = handle.0;
        for (old, new) in before.attempts.iter().zip(&after.attempts) {
            if old == new {
                continue;
            }
            let row = AttemptRow::from_record(new, after.lapse_backoff);
            if old.lease == new.lease && old.tries == new.tries {
                sql::update_attempt_state(self, id, &row)?;
            } else if row.expires_at.is_some()
                && old.state == new.state
                && old.tries == new.tries
                && grant(old) == grant(new)
            {
                // Only the expiry moves on a heartbeat.
                sql::extend_attempt(self, id, &row)?;
            } else {
                sql::update_attempt(self, id, &row)?;
            }
        }
        let claimable = claimable_column(after);
        let token = after.last_token.map_or(0, FencingToken::as_i64);
        match (
            before.last_token != after.last_token,
            claimable_column(before) != claimable,
        ) {
            (true, true) => sql::update_task(self, id, token, claimable)?,
            (true, false) => sql::update_token(self, id, token)?,
            (false, true) => sql::update_claimable(self, id, claimable)?,
            (false, false) => {}
        }
        Ok(())
    }

    fn resync_task(&self, handle: TaskHandle, record: &TaskRecord) -> Result<()> {
        for attempt in &record.attempts {
            if attempt.state == TaskState::Leased {
                let row = AttemptRow::from_record(attempt, record.lapse_backoff);
                sql::update_attempt(self, handle.0, &row)?;
            }
        }
        sql::update_claimable(self, handle.0, claimable_column(record))?;
        Ok(())
    }

    fn lapsed_tasks(
        &self,
        namespace: &Namespace,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<LoadedTask>> {
        let mut ids = sql::lapsed_leases(self, namespace.as_str(), millis(now), count(limit))?;
        // A task with several lapsed attempts is listed once per attempt.
        ids.sort_unstable();
        ids.dedup();
        let mut tasks = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(row) = sql::task_by_id(self, id, false)? {
                tasks.push(load(self, row)?);
            }
        }
        Ok(tasks)
    }

    fn insert_receipt(
        &self,
        handle: TaskHandle,
        receipt: &Receipt,
        output: Option<&[u8]>,
    ) -> Result<()> {
        Ok(sql::insert_receipt(
            self,
            &NewReceipt {
                task: handle.0,
                attempt: i64::from(receipt.attempt.as_u16()),
                token: receipt.token.as_i64(),
                principal: receipt.principal.as_str(),
                idempotency_key: receipt.idempotency_key.as_str(),
                artifact: receipt.artifact.as_str(),
                digest: &receipt.digest.to_string(),
                accepted_at: millis(receipt.accepted_at),
                output,
            },
        )?)
    }

    fn insert_meta(&self, key: &str, value: &str) -> Result<()> {
        Ok(meta::insert_meta(self, key, value)?)
    }

    fn bump_limit(&self, window: &LimitWindow<'_>) -> Result<()> {
        Ok(meta::bump_limit(
            self,
            window.subject,
            millis(window.start),
            millis(window.end),
        )?)
    }

    fn optional(&self, work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<()>) -> bool {
        self.run_optional(|writer| work(writer))
    }
}

#[cfg(test)]
mod tests {
    use tessera_audit::{Action, Outcome};
    use tessera_lease::{Retry, Task, TaskSpec};

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap()
            + chrono::TimeDelta::seconds(seconds)
    }

    #[test]
    fn the_claim_columns_hold_the_lease_rules_values() {
        let who = Principal::parse("p1").unwrap();
        let spec = TaskSpec {
            alternatives: 2,
            lapse_backoff: Duration::from_secs(5),
        };
        let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
        assert_eq!(claimable_column(task.record()), Some(0));
        task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
        assert_eq!(
            claimable_column(task.record()),
            Some(0),
            "attempt 2 is ready"
        );
        let second = task.claim(&who, at(1), Duration::from_secs(30)).unwrap();
        // Both leased: out of the claim index; each lease's row holds its
        // lapse plus the lapse backoff.
        assert_eq!(claimable_column(task.record()), None);
        let lapses = |task: &Task| -> Vec<Option<i64>> {
            task.record()
                .attempts
                .iter()
                .map(|a| AttemptRow::from_record(a, spec.lapse_backoff).lapses_at)
                .collect()
        };
        assert_eq!(
            lapses(&task),
            vec![Some(millis(at(35))), Some(millis(at(36)))]
        );
        task.fail(
            &who,
            second.token(),
            at(2),
            Retry::After(Duration::from_secs(10)),
        )
        .unwrap();
        assert_eq!(claimable_column(task.record()), Some(millis(at(12))));
        assert_eq!(
            claimable_from_column(claimable_column(task.record())),
            ClaimableAt::At(at(12))
        );
        assert_eq!(lapses(&task), vec![Some(millis(at(35))), None]);
    }

    #[test]
    fn attempt_rows_round_trip() {
        let who = Principal::parse("p1").unwrap();
        let mut task = Task::new(
            TaskId::parse("t").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap();
        task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
        let record = &task.record().attempts[0];
        let row = AttemptRow::from_record(record, Duration::ZERO);
        assert_eq!(row.lapses_at, row.expires_at, "leased, no lapse backoff");
        assert_eq!(&row.record().unwrap(), record);
        let mut broken = row.clone();
        broken.holder = None;
        assert!(broken.record().is_err());
    }

    #[test]
    fn counter_rows_round_trip() {
        let now = at(30);
        for principal in [Some("p3"), None] {
            let counter = Counter {
                key: CounterKey::new(
                    now,
                    principal.map(|name| tessera_audit::Principal::new(name).unwrap()),
                    tessera_audit::Namespace::new("*").unwrap(),
                    Action::Claim,
                    Outcome::Empty,
                ),
                count: 5,
            };
            let row = CounterRow::from_counter(&counter);
            assert_eq!(row.principal, principal.unwrap_or(""));
            assert_eq!(row.counter().unwrap(), counter);
        }
    }

    #[test]
    fn unknown_stored_names_are_skipped() {
        let scopes = names(r#"["read","teleport"]"#, Scope::parse).unwrap();
        assert_eq!(scopes, vec![Scope::Read]);
        assert!(names("not json", Scope::parse).is_err());
    }
}
