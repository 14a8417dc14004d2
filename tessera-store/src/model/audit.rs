//! What audit rows and counters record, and the audit read's shapes.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::{Action, AuditEvent, Counter, CounterKey, IpHash, Outcome, Resource};
use tessera_lease::Namespace;

use crate::error::Error;
use crate::model::access::{Caller, PrincipalId};

/// The namespace recorded for actions that are not in one (key management,
/// authentication). No namespace name can be `*`.
pub const STORE_NAMESPACE: &str = "*";

/// The most events, and separately the most counters, one audit read
/// returns.
pub const MAX_AUDIT_ROWS: usize = 1000;

/// Who did what where: the fields an audit row or a counter shares.
#[derive(Debug, Clone)]
pub(crate) struct ActionScope {
    pub(crate) principal: Option<PrincipalId>,
    namespace: Option<Namespace>,
    action: Action,
    ip_hash: Option<IpHash>,
}

impl ActionScope {
    pub(crate) fn new(
        principal: Option<PrincipalId>,
        namespace: Option<&Namespace>,
        action: Action,
    ) -> Self {
        Self {
            principal,
            namespace: namespace.cloned(),
            action,
            ip_hash: None,
        }
    }

    /// `caller` doing `action`, with its address hash.
    pub(crate) fn of(caller: &Caller, namespace: Option<&Namespace>, action: Action) -> Self {
        Self {
            principal: Some(caller.principal()),
            namespace: namespace.cloned(),
            action,
            ip_hash: caller.ip_hash().cloned(),
        }
    }

    /// The same scope with the caller's hashed address group.
    /// The action.
    pub(crate) fn action(&self) -> Action {
        self.action
    }

    /// The namespace, if the action is in one.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn namespace(&self) -> Option<&Namespace> {
        self.namespace.as_ref()
    }

    pub(crate) fn with_ip_hash(mut self, ip_hash: IpHash) -> Self {
        self.ip_hash = Some(ip_hash);
        self
    }

    fn audit_namespace(&self) -> tessera_audit::Namespace {
        let name = self
            .namespace
            .as_ref()
            .map_or(STORE_NAMESPACE, Namespace::as_str);
        tessera_audit::Namespace::new(name).expect("namespace names are valid audit identifiers")
    }

    /// The audit row of this action having succeeded at `now`.
    pub(crate) fn event(&self, now: DateTime<Utc>, resource: Option<Resource>) -> AuditEvent {
        let principal = self.principal.map_or_else(
            || tessera_audit::Principal::new("-").expect("a valid identifier"),
            PrincipalId::audit_principal,
        );
        let mut event = AuditEvent::new(now, principal, self.audit_namespace(), self.action);
        event.resource = resource;
        event.ip_hash = self.ip_hash.clone();
        event
    }

    pub(crate) fn counter(&self, now: DateTime<Utc>, outcome: Outcome) -> CounterKey {
        CounterKey::new(
            now,
            self.principal.map(PrincipalId::audit_principal),
            self.audit_namespace(),
            self.action,
            outcome,
        )
    }
}

/// What a write action leaves behind (see [`Store::perform_or_count`](crate::Store::perform_or_count)).
#[derive(Debug, Clone)]
pub(crate) enum Trail {
    /// Its audit row, naming this resource.
    Row(Option<Resource>),
    /// Its audit rows, written with its work.
    Written,
    /// Nothing written; counted with this outcome.
    Count(Outcome),
}

/// Which audit rows [`Store::audit`](crate::Store::audit) returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// Only this principal's rows; `None` is the caller's own, or everyone's
    /// for an admin. Another principal's rows need an admin key.
    pub principal: Option<PrincipalId>,
    /// Only rows at or after this time; rows older than the retention window
    /// are never returned anyway.
    pub since: Option<DateTime<Utc>>,
    /// At most this many events, newest first, and at most this many
    /// counters, newest minute first (1 to [`MAX_AUDIT_ROWS`]).
    pub limit: usize,
    /// Events older than this only: the [`next`](AuditPage::next) of the
    /// page before. A later page has no counters; the first has them all.
    #[serde(default)]
    pub before: Option<AuditCursor>,
}

impl Default for AuditQuery {
    fn default() -> Self {
        Self {
            principal: None,
            since: None,
            limit: 100,
            before: None,
        }
    }
}

/// An audit read: events of successful actions and counters of the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    /// Newest first.
    pub events: Vec<AuditEvent>,
    /// Newest minute first.
    pub counters: Vec<Counter>,
    /// Where the next page of older events starts, if this one was full.
    #[serde(default)]
    pub next: Option<AuditCursor>,
}

/// Where an audit read goes on: before the oldest event of the page
/// before. Opaque; it travels as text (`Display` and `FromStr`, and so in
/// serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct AuditCursor {
    /// The event's time, in Unix milliseconds, and its row id.
    pub(crate) at: i64,
    pub(crate) id: i64,
}

impl fmt::Display for AuditCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.at, self.id)
    }
}

impl FromStr for AuditCursor {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let (at, id) = crate::model::cursor_parts(text, "audit cursor")?;
        Ok(Self { at, id })
    }
}

impl From<AuditCursor> for String {
    fn from(cursor: AuditCursor) -> Self {
        cursor.to_string()
    }
}

impl TryFrom<String> for AuditCursor {
    type Error = Error;

    fn try_from(text: String) -> Result<Self, Error> {
        text.parse()
    }
}

/// What one [`Store::maintain`](crate::Store::maintain) call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    /// Counter rows written (each a row upserted).
    pub counters_written: u64,
    /// Whether a retention run started (at most once per retention
    /// interval, five minutes by default).
    pub retention_ran: bool,
    /// Expired rows retention deleted, finished tasks' rows included.
    pub rows_deleted: u64,
    /// Finished tasks retention purged (each with its attempts, receipts
    /// and unique slot, counted in `rows_deleted`).
    pub tasks_purged: u64,
}

/// This store's latest retention run: when it started and what it
/// deleted ([`Store::last_retention`](crate::Store::last_retention)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionSummary {
    /// When the run started.
    pub ran_at: DateTime<Utc>,
    /// Finished tasks it purged.
    pub tasks_purged: u64,
    /// Rows it deleted, finished tasks' rows included.
    pub rows_deleted: u64,
}
