//! Leases.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::attempt::AttemptNumber;
use crate::name::{ArtifactKey, Principal, TaskId};
use crate::token::FencingToken;

/// A lease as stored with its attempt: who holds it, under which token, and
/// for how long. `expires_at` is exclusive: at that instant the lease has
/// lapsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The principal that claimed.
    pub holder: Principal,
    /// The fencing token of this grant.
    pub token: FencingToken,
    /// When the lease was granted.
    pub granted_at: DateTime<Utc>,
    /// When the lease lapses unless extended.
    pub expires_at: DateTime<Utc>,
}

impl LeaseRecord {
    /// Whether the lease has lapsed at `now`.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at
    }
}

/// A granted or extended lease, as handed to the worker that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    task: TaskId,
    attempt: AttemptNumber,
    holder: Principal,
    token: FencingToken,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

impl Lease {
    pub(crate) fn new(task: &TaskId, attempt: AttemptNumber, record: &LeaseRecord) -> Self {
        Self {
            task: task.clone(),
            attempt,
            holder: record.holder.clone(),
            token: record.token,
            granted_at: record.granted_at,
            expires_at: record.expires_at,
        }
    }

    /// The leased task.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// The leased attempt of the task.
    pub fn attempt(&self) -> AttemptNumber {
        self.attempt
    }

    /// The principal holding the lease.
    pub fn holder(&self) -> &Principal {
        &self.holder
    }

    /// The fencing token the holder must present.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the lease was granted.
    pub fn granted_at(&self) -> DateTime<Utc> {
        self.granted_at
    }

    /// When the lease lapses unless extended (exclusive).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// Whether the lease has lapsed at `now`.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at
    }

    /// The artifact key this grant owns; its receipt will name it.
    pub fn artifact(&self) -> ArtifactKey {
        ArtifactKey::for_grant(&self.task, self.attempt, self.token)
    }
}
