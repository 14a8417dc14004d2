//! The stored forms of access and audit: key rows, audit events and
//! per-minute counters.

use chrono::{DateTime, Utc};
use tessera_audit::{AuditEvent, Counter, CounterKey, Minute, Resource};

use crate::backend::{Result, StoredKey};
use crate::key::KeyId;
use crate::model::access::{Grant, KeyInfo, PrincipalId, PrincipalKind, Scope};
use crate::model::audit::AuditCursor;

use super::{corrupt, from_millis, millis, names};

/// A key row with its principal's columns; times in Unix milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct KeyRow {
    pub(crate) key_id: String,
    pub(crate) principal_id: i64,
    pub(crate) secret_hash: Vec<u8>,
    pub(crate) label: String,
    /// JSON array of scope names.
    pub(crate) scopes: String,
    /// JSON array of grant strings.
    pub(crate) grants: String,
    pub(crate) created_at: i64,
    pub(crate) expires_at: Option<i64>,
    pub(crate) revoked_at: Option<i64>,
    pub(crate) kind: String,
    pub(crate) account: String,
    pub(crate) last_used_at: Option<i64>,
}

/// An audit row as stored; `at` in Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventRow {
    /// The row id when read back (0 in a row to insert): with `at`, where
    /// an audit read goes on after it.
    pub(crate) id: i64,
    pub(crate) at: i64,
    pub(crate) principal: String,
    pub(crate) namespace: String,
    pub(crate) action: String,
    pub(crate) outcome: String,
    pub(crate) resource: Option<String>,
    pub(crate) ip_hash: Option<String>,
}

/// A counter row as stored; `minute` counts minutes since the Unix epoch and
/// `principal` is empty for requests without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CounterRow {
    pub(crate) minute: i64,
    pub(crate) principal: String,
    pub(crate) namespace: String,
    pub(crate) action: String,
    pub(crate) outcome: String,
    pub(crate) count: i64,
}

impl KeyRow {
    pub(crate) fn info(&self) -> Result<KeyInfo> {
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

/// The row id from which every audit row is at or after `at`, and before
/// which every row is older: audit rows are appended in time order, so
/// the time of the first row at or after an id grows with the id, and a
/// binary search of the row ids finds the bound in O(log n) probes of
/// O(log n) each. `span` is the lowest and highest row id (`None` for an
/// empty table); `first_from(id)` the first row at or after `id`, its id
/// and time. Were the clock ever set back, an event written after that
/// could sit below the bound (listings skip it, and retention deletes it
/// only once every row before it is older than the cutoff); none is ever
/// read or deleted early, as both filter by time too.
pub(crate) fn first_event_at_or_after<E>(
    span: Option<(i64, i64)>,
    at: i64,
    mut first_from: impl FnMut(i64) -> std::result::Result<Option<(i64, i64)>, E>,
) -> std::result::Result<i64, E> {
    let Some((mut low, last)) = span else {
        return Ok(0);
    };
    // The answer is in low..=high; high is one past the last row.
    let mut high = last.saturating_add(1);
    while low < high {
        let middle = low + (high - low) / 2;
        match first_from(middle)? {
            Some((_, time)) if time >= at => high = middle,
            Some((id, _)) => low = id.saturating_add(1),
            None => high = middle,
        }
    }
    Ok(low)
}

impl EventRow {
    pub(crate) fn from_event(event: &AuditEvent) -> Self {
        Self {
            id: 0,
            at: millis(event.time),
            principal: event.principal.as_str().to_owned(),
            namespace: event.namespace.as_str().to_owned(),
            action: event.action.as_str().to_owned(),
            outcome: event.outcome.as_str().to_owned(),
            resource: event.resource.as_ref().map(|r| r.as_str().to_owned()),
            ip_hash: event.ip_hash.as_ref().map(|h| h.as_str().to_owned()),
        }
    }

    /// Where an audit read goes on after this row.
    pub(crate) fn cursor(&self) -> AuditCursor {
        AuditCursor {
            at: self.at,
            id: self.id,
        }
    }

    pub(crate) fn event(&self) -> Result<AuditEvent> {
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
pub(crate) fn minute_number(start: DateTime<Utc>) -> i64 {
    millis(start).div_euclid(60_000)
}

impl CounterRow {
    pub(crate) fn from_counter(counter: &Counter) -> Self {
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

    pub(crate) fn counter(&self) -> Result<Counter> {
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

impl KeyRow {
    /// The key as the seam hands it out.
    pub(crate) fn stored(self) -> Result<StoredKey> {
        let info = self.info()?;
        Ok(StoredKey {
            info,
            secret_hash: self.secret_hash,
        })
    }
}
