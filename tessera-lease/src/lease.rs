//! Leases.

use chrono::{DateTime, Utc};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::name::AttemptNumber;
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
///
/// Serialized with its [`artifact`](Self::artifact) key as one more field,
/// so a worker reading the JSON knows where to write its output. The key is
/// derived from the lease, so reading it back checks it: an `artifact` that
/// names another grant is an error, and a missing one is derived.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    task: TaskId,
    attempt: AttemptNumber,
    holder: Principal,
    token: FencingToken,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

/// [`Lease`] on the wire: its fields and its artifact key.
#[derive(Serialize)]
struct LeaseOut<'a> {
    task: &'a TaskId,
    attempt: AttemptNumber,
    holder: &'a Principal,
    token: FencingToken,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    artifact: ArtifactKey,
}

/// [`Lease`] read back; the artifact key is optional and checked.
#[derive(Deserialize)]
struct LeaseIn {
    task: TaskId,
    attempt: AttemptNumber,
    holder: Principal,
    token: FencingToken,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    #[serde(default)]
    artifact: Option<ArtifactKey>,
}

impl Serialize for Lease {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        LeaseOut {
            task: &self.task,
            attempt: self.attempt,
            holder: &self.holder,
            token: self.token,
            granted_at: self.granted_at,
            expires_at: self.expires_at,
            artifact: self.artifact(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Lease {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = LeaseIn::deserialize(deserializer)?;
        let lease = Self {
            task: wire.task,
            attempt: wire.attempt,
            holder: wire.holder,
            token: wire.token,
            granted_at: wire.granted_at,
            expires_at: wire.expires_at,
        };
        match wire.artifact {
            Some(artifact) if artifact != lease.artifact() => Err(D::Error::custom(
                "artifact key does not match the lease's task, attempt and token",
            )),
            _ => Ok(lease),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        let record = LeaseRecord {
            holder: Principal::parse("worker-7").unwrap(),
            token: FencingToken::new(7).unwrap(),
            granted_at: "2026-10-29T12:00:00Z".parse().unwrap(),
            expires_at: "2026-10-29T12:05:00Z".parse().unwrap(),
        };
        let attempt = AttemptNumber::new(2).unwrap();
        Lease::new(&TaskId::parse("render-42").unwrap(), attempt, &record)
    }

    #[test]
    fn json_carries_the_artifact_key_and_round_trips() {
        let lease = lease();
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(json["artifact"], "render-42.a2.t7");
        assert_eq!(json["token"], 7);
        assert_eq!(serde_json::from_value::<Lease>(json).unwrap(), lease);
    }

    #[test]
    fn reading_back_checks_the_artifact_key() {
        let lease = lease();
        let mut json = serde_json::to_value(&lease).unwrap();
        json["artifact"] = "render-42.a2.t8".into();
        assert!(serde_json::from_value::<Lease>(json.clone()).is_err());
        json.as_object_mut().unwrap().remove("artifact");
        assert_eq!(serde_json::from_value::<Lease>(json).unwrap(), lease);
    }
}
