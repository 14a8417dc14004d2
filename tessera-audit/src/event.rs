//! The audit event: one redacted row per successful action.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{Error, IpHash, Namespace, Principal, Resource};

/// Declares an enum whose variants have stable names, used by serde,
/// `as_str`, `Display` and `FromStr` alike so they can never disagree.
macro_rules! named_enum {
    (
        $(#[$doc:meta])* $name:ident, $unknown:ident,
        $( $(#[$vdoc:meta])* $variant:ident = $text:literal, )+
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vdoc])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stable name, as stored and serialized.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(name: &str) -> Result<Self, Error> {
                match name {
                    $( $text => Ok(Self::$variant), )+
                    _ => Err(Error::$unknown(name.to_owned())),
                }
            }
        }
    };
}

named_enum!(
    /// What a request did. The names are stable: they are stored in audit rows
    /// and counters and read back with [`FromStr`].
    Action, UnknownAction,
    /// Put a task into a namespace queue.
    Enqueue = "enqueue",
    /// Put a batch of tasks into a namespace queue, in one transaction.
    EnqueueBatch = "enqueue_batch",
    /// Ask for a lease on a ready task.
    Claim = "claim",
    /// Long-poll a queue for work.
    WaitForWork = "wait_for_work",
    /// Extend a lease.
    Heartbeat = "heartbeat",
    /// Submit a result under a lease.
    Submit = "submit",
    /// Give up a task under a lease, to be retried after a backoff.
    Fail = "fail",
    /// An operator put a task's failed, discarded or cancelled attempts
    /// back to ready.
    RetryTask = "retry_task",
    /// An operator cancelled a task's unfinished attempts.
    CancelTask = "cancel_task",
    /// An operator cancelled every task a filter matches, one batch of
    /// tasks per row.
    CancelTasks = "cancel_tasks",
    /// An operator retried every task a filter matches, one batch of tasks
    /// per row.
    RetryTasks = "retry_tasks",
    /// List a namespace's tasks by state.
    ListTasks = "list_tasks",
    /// Pause a queue: claims on it come back empty until it is resumed.
    PauseQueue = "pause_queue",
    /// Resume a paused queue.
    ResumeQueue = "resume_queue",
    /// Set a queue's concurrency limits.
    SetQueueLimits = "set_queue_limits",
    /// Set or clear a queue's own keep times for finished work.
    SetQueueRetention = "set_queue_retention",
    /// Hand a leased task back to its queue for a while without spending
    /// its try.
    Snooze = "snooze",
    /// Read a queue's settings.
    ReadQueueSettings = "read_queue_settings",
    /// Read a task.
    ReadTask = "read_task",
    /// Read an execution receipt.
    ReadReceipt = "read_receipt",
    /// List the attempts of a brief.
    ListAttempts = "list_attempts",
    /// Read a namespace's health.
    ReadHealth = "read_health",
    /// Read audit events and counters.
    ReadAudit = "read_audit",
    /// Create an API key.
    CreateKey = "create_key",
    /// List API keys.
    ListKeys = "list_keys",
    /// Revoke an API key.
    RevokeKey = "revoke_key",
    /// Set an API key's expiry.
    ExpireKey = "expire_key",
    /// Mint an anonymous session.
    MintSession = "mint_session",
    /// Resolve a key to its principal.
    Authenticate = "authenticate",
    /// Internal pre-check: is the key valid.
    VerifyKey = "verify_key",
    /// Internal pre-check: does the key's scope cover the store.
    VerifyStoreScope = "verify_store_scope",
    /// Internal pre-check: may the caller write this blob.
    AuthorizeBlobWrite = "authorize_blob_write",
    /// Internal pre-check: may the caller write this object.
    AuthorizeObjectWrite = "authorize_object_write",
    /// Create or replace a periodic schedule.
    PutSchedule = "put_schedule",
    /// Read a periodic schedule.
    ReadSchedule = "read_schedule",
    /// List a namespace's periodic schedules.
    ListSchedules = "list_schedules",
    /// Pause a periodic schedule.
    PauseSchedule = "pause_schedule",
    /// Resume a paused periodic schedule.
    ResumeSchedule = "resume_schedule",
    /// Delete a periodic schedule.
    DeleteSchedule = "delete_schedule",
    /// A scheduler fired one run-at of a schedule: enqueued its task.
    FireSchedule = "fire_schedule",
    /// Retention purged a queue's finished tasks past their keep time.
    PurgeTasks = "purge_tasks",
);

named_enum!(
    /// How a request ended. The names are stable and match the error codes a
    /// host returns, so a counter row reads like the response it counts.
    Outcome, UnknownOutcome,
    /// It succeeded.
    Ok = "ok",
    /// A claim found the queue empty.
    Empty = "empty",
    /// No valid key: missing, unknown, expired or revoked (`401`).
    Unauthorized = "unauthorized",
    /// The key lacks the grant or scope (`403`).
    Forbidden = "forbidden",
    /// What it named does not exist (`404`).
    NotFound = "not_found",
    /// A call under a fencing token named a task purged after its
    /// retention (`410`).
    TaskPurged = "task_purged",
    /// The request contradicts the current state in a way none of the
    /// conflicts below names (`409 conflict`).
    Conflict = "conflict",
    /// The idempotency key was used with a different payload (`409`).
    IdempotencyConflict = "idempotency_conflict",
    /// A later grant superseded the fencing token (`409`).
    StaleToken = "stale_token",
    /// The fencing token was never granted for the task (`409`).
    UnknownToken = "unknown_token",
    /// The lease is held by another principal (`409`).
    WrongHolder = "wrong_holder",
    /// The lease expired (`409`).
    LeaseExpired = "lease_expired",
    /// The lease ended (`409`).
    LeaseEnded = "lease_ended",
    /// An operator cancelled the task (`409`).
    TaskCancelled = "task_cancelled",
    /// The task exists already (`409`).
    TaskExists = "task_exists",
    /// No attempt of the task is left to claim (`409`).
    TaskFinished = "task_finished",
    /// No attempt of the task is claimable yet (`409`).
    NotReady = "not_ready",
    /// An operator's retry found nothing to retry (`409`).
    NothingToRetry = "nothing_to_retry",
    /// An operator's cancel found every attempt final (`409`).
    NothingToCancel = "nothing_to_cancel",
    /// Every fencing token the task can hold has been granted (`409`).
    TokensExhausted = "tokens_exhausted",
    /// The request was malformed (`400`).
    InvalidInput = "invalid_input",
    /// Overload: claim admission refused it (`429`).
    RateLimited = "rate_limited",
    /// Storage refused the write for a provider allowance (`503`).
    StorageQuotaExhausted = "storage_quota_exhausted",
    /// Any other storage fault.
    StorageError = "storage_error",
);

/// One redacted audit row for a successful action.
///
/// Redacted by construction: every field is a type that cannot hold a key, a
/// secret or a raw address. The address appears only as an [`IpHash`], and a
/// principal only by its identifier.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use tessera_audit::{Action, AuditEvent, Namespace, Principal, Resource};
///
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
/// let event = AuditEvent::new(now, Principal::new("worker-7")?, Namespace::new("main")?, Action::ReadReceipt)
///     .with_resource(Resource::new("run:42")?);
/// assert_eq!(event.resource.as_ref().map(Resource::as_str), Some("run:42"));
/// # Ok::<(), tessera_audit::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AuditEvent {
    /// When it happened (wall clock).
    pub time: DateTime<Utc>,
    /// Who acted.
    pub principal: Principal,
    /// Where.
    pub namespace: Namespace,
    /// What was done.
    pub action: Action,
    /// How it ended; [`Outcome::Ok`] for the rows a successful action writes.
    pub outcome: Outcome,
    /// What it acted on, if one thing (a read of an execution record names its run).
    pub resource: Option<Resource>,
    /// The daily-rotated hash of the caller's address group, if known.
    pub ip_hash: Option<IpHash>,
}

impl AuditEvent {
    /// A successful action with no resource and no address hash.
    pub fn new(
        time: DateTime<Utc>,
        principal: Principal,
        namespace: Namespace,
        action: Action,
    ) -> Self {
        Self {
            time,
            principal,
            namespace,
            action,
            outcome: Outcome::Ok,
            resource: None,
            ip_hash: None,
        }
    }

    /// Names the resource acted on.
    pub fn with_resource(mut self, resource: Resource) -> Self {
        self.resource = Some(resource);
        self
    }

    /// Records the caller's hashed address group.
    pub fn with_ip_hash(mut self, ip_hash: IpHash) -> Self {
        self.ip_hash = Some(ip_hash);
        self
    }

    /// Sets the outcome.
    pub fn with_outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = outcome;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_every_form() {
        for &action in Action::ALL {
            let json = serde_json::to_string(&action).unwrap();
            assert_eq!(json, format!("\"{}\"", action.as_str()));
            assert_eq!(serde_json::from_str::<Action>(&json).unwrap(), action);
            assert_eq!(action.as_str().parse::<Action>().unwrap(), action);
            assert_eq!(action.to_string(), action.as_str());
        }
        for &outcome in Outcome::ALL {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&json).unwrap(), outcome);
            assert_eq!(outcome.as_str().parse::<Outcome>().unwrap(), outcome);
        }
    }

    #[test]
    fn names_are_distinct_and_stable() {
        let mut names: Vec<_> = Action::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Action::ALL.len());
        // Stored rows depend on these exact spellings.
        assert_eq!(Action::WaitForWork.as_str(), "wait_for_work");
        assert_eq!(Action::AuthorizeBlobWrite.as_str(), "authorize_blob_write");
        assert_eq!(Outcome::RateLimited.as_str(), "rate_limited");
        assert_eq!(
            Outcome::StorageQuotaExhausted.as_str(),
            "storage_quota_exhausted"
        );
    }

    #[test]
    fn unknown_names_are_errors() {
        assert_eq!(
            "launch".parse::<Action>(),
            Err(Error::UnknownAction("launch".into()))
        );
        assert_eq!(
            "Ok".parse::<Outcome>(),
            Err(Error::UnknownOutcome("Ok".into()))
        );
    }
}
