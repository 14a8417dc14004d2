//! Tasks: a versioned brief, its competing attempts and the lease rules.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::attempt::{AttemptNumber, AttemptRecord};
use crate::error::{Field, LeaseError};
use crate::lease::{Lease, LeaseRecord};
use crate::name::{ArtifactKey, Principal, TaskId};
use crate::receipt::{Idempotency, Receipt, Submission, Submitted, decide_idempotency};
use crate::state::TaskState;
use crate::time;
use crate::token::FencingToken;

/// The most competing attempts one task may have.
pub const MAX_ALTERNATIVES: u16 = 32;

/// The version of a task's brief, from 1. Receipts name it so alternatives
/// of different versions are never compared with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct BriefVersion(u32);

impl BriefVersion {
    /// The first version of a brief.
    pub const FIRST: Self = Self(1);

    /// Accepts a positive version.
    pub fn new(value: u32) -> Result<Self, LeaseError> {
        if value == 0 {
            return Err(LeaseError::OutOfRange {
                field: Field::Version,
                value: 0,
                max: i64::from(u32::MAX),
            });
        }
        Ok(Self(value))
    }

    /// The version number.
    pub fn as_u32(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for BriefVersion {
    type Error = LeaseError;

    fn try_from(value: u32) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<BriefVersion> for u32 {
    fn from(version: BriefVersion) -> Self {
        version.0
    }
}

impl fmt::Display for BriefVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How a new task is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskSpec {
    /// How many competing attempts the brief gets, 1 to [`MAX_ALTERNATIVES`].
    pub alternatives: u16,
    /// How long an attempt waits after its lease lapses before it can be
    /// claimed again; zero (the default) makes it ready at once.
    pub lapse_backoff: Duration,
}

impl Default for TaskSpec {
    fn default() -> Self {
        Self {
            alternatives: 1,
            lapse_backoff: Duration::ZERO,
        }
    }
}

/// What a failure report asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retry {
    /// Give the attempt up: it becomes [`TaskState::Failed`].
    Never,
    /// Retry after this backoff (zero: ready at once), at most
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF).
    After(Duration),
}

/// A task as stored: the columns of a `tasks` row plus its `attempts` rows.
///
/// Plain data for the store to read and write; [`Task::restore`] checks it
/// before any rule runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task (the brief's id).
    pub id: TaskId,
    /// The brief version its attempts solve.
    pub version: BriefVersion,
    /// Wait after a lapsed lease before the attempt is claimable again.
    pub lapse_backoff: Duration,
    /// The highest fencing token ever granted for this task; `None` (stored
    /// as 0) before the first claim. The next grant gets the one after it.
    pub last_token: Option<FencingToken>,
    /// The competing attempts, numbered 1, 2, … in order.
    pub attempts: Vec<AttemptRecord>,
}

/// A task whose record has been checked: the lease rules live here.
///
/// # Model
///
/// A task is one versioned brief. It has 1 to [`MAX_ALTERNATIVES`] competing
/// attempts; the attempt is the unit that is leased, heartbeat, submitted
/// and failed, and each has its own state, lease, artifact key and receipt.
/// One fencing-token counter serves the whole task, so tokens strictly
/// increase per task across every grant of every attempt, and a token names
/// exactly one grant: heartbeat, submit and fail find their attempt by token.
///
/// Every rule either applies completely or returns an error and changes
/// nothing, so a store can load the record, apply one rule inside its
/// transaction and write the record back only on `Ok`.
///
/// # Time
///
/// Times are wall-clock `DateTime<Utc>` passed in, because leases outlive
/// the process. The wall clock may step backwards; the rules never move a
/// lease's expiry earlier (a heartbeat sets `max(expiry, now + extension)`)
/// and never date a receipt before its lease was granted.
///
/// Calls scan the task's attempts, at most [`MAX_ALTERNATIVES`], so each is
/// O(1) in the number of tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TaskRecord", into = "TaskRecord")]
pub struct Task(TaskRecord);

impl Task {
    /// A new task with every attempt ready.
    pub fn new(id: TaskId, version: BriefVersion, spec: TaskSpec) -> Result<Self, LeaseError> {
        if spec.alternatives == 0 || spec.alternatives > MAX_ALTERNATIVES {
            return Err(LeaseError::OutOfRange {
                field: Field::Alternatives,
                value: i64::from(spec.alternatives),
                max: i64::from(MAX_ALTERNATIVES),
            });
        }
        time::check_backoff(spec.lapse_backoff)?;
        let attempts = (1..=spec.alternatives)
            .map(|n| AttemptRecord::new(AttemptNumber(n)))
            .collect();
        Ok(Self(TaskRecord {
            id,
            version,
            lapse_backoff: spec.lapse_backoff,
            last_token: None,
            attempts,
        }))
    }

    /// Checks a stored record and wraps it.
    ///
    /// Rejects (as [`LeaseError::InvalidRecord`]) attempts that are not
    /// numbered 1, 2, … up to [`MAX_ALTERNATIVES`]; a leased, done or failed
    /// attempt without a lease; a lease token above `last_token` or shared by
    /// two attempts; a lease that does not end after it starts; and a lease
    /// on an attempt never tried.
    pub fn restore(record: TaskRecord) -> Result<Self, LeaseError> {
        let invalid = |reason| Err(LeaseError::InvalidRecord { reason });
        let count = record.attempts.len();
        if count == 0 || count > usize::from(MAX_ALTERNATIVES) {
            return invalid("a task has 1 to MAX_ALTERNATIVES attempts");
        }
        if time::check_backoff(record.lapse_backoff).is_err() {
            return invalid("lapse backoff longer than MAX_BACKOFF");
        }
        for (index, attempt) in record.attempts.iter().enumerate() {
            if attempt.number.index() != index {
                return invalid("attempts must be numbered 1, 2, ... in order");
            }
            let Some(lease) = &attempt.lease else {
                if matches!(
                    attempt.state,
                    TaskState::Leased | TaskState::Done | TaskState::Failed
                ) {
                    return invalid("a leased, done or failed attempt needs its lease");
                }
                continue;
            };
            if attempt.tries == 0 {
                return invalid("an attempt with a lease was tried at least once");
            }
            if record.last_token.is_none_or(|last| lease.token > last) {
                return invalid("a lease token is above the task's last token");
            }
            if lease.expires_at <= lease.granted_at {
                return invalid("a lease must expire after it is granted");
            }
            // Quadratic, but over at most MAX_ALTERNATIVES attempts.
            let shared = record.attempts[..index]
                .iter()
                .any(|other| other.lease.as_ref().is_some_and(|o| o.token == lease.token));
            if shared {
                return invalid("two attempts share a fencing token");
            }
        }
        Ok(Self(record))
    }

    /// The checked record, for the store to write.
    pub fn record(&self) -> &TaskRecord {
        &self.0
    }

    /// Unwraps the checked record.
    pub fn into_record(self) -> TaskRecord {
        self.0
    }

    /// The task's id.
    pub fn id(&self) -> &TaskId {
        &self.0.id
    }

    /// The brief version.
    pub fn version(&self) -> BriefVersion {
        self.0.version
    }

    /// The highest token granted so far.
    pub fn last_token(&self) -> Option<FencingToken> {
        self.0.last_token
    }

    /// Every attempt, in number order.
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.0.attempts
    }

    /// One attempt, if the task has it.
    pub fn attempt(&self, number: AttemptNumber) -> Option<&AttemptRecord> {
        self.0.attempts.get(number.index())
    }

    /// The attempt's lease if it is live at `now`: held and not expired.
    pub fn live_lease(&self, number: AttemptNumber, now: DateTime<Utc>) -> Option<Lease> {
        let attempt = self.attempt(number)?;
        let lease = attempt.lease.as_ref()?;
        (attempt.state == TaskState::Leased && !lease.is_expired(now))
            .then(|| Lease::new(&self.0.id, number, lease))
    }

    /// Whether every attempt is done or failed; the comparison step may run.
    pub fn is_finished(&self) -> bool {
        self.0.attempts.iter().all(|a| a.state.is_final())
    }

    /// When an attempt can next be claimed: `now` if one can be claimed now,
    /// the earliest backoff end or lapse otherwise, `None` once finished.
    pub fn next_claimable_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.0
            .attempts
            .iter()
            .filter_map(|attempt| self.claimable_at(attempt))
            .min()
            .map(|at| at.max(now))
    }

    /// Grants a lease on the lowest-numbered claimable attempt: one that is
    /// ready, whose backoff has ended, or whose lease lapsed (and whose lapse
    /// backoff has passed). The new token is the task's next.
    ///
    /// Errors: [`TaskFinished`](LeaseError::TaskFinished),
    /// [`NoAttemptReady`](LeaseError::NoAttemptReady) with the time one will
    /// be, an invalid `lease_duration` (zero or above
    /// [`MAX_LEASE_DURATION`](crate::MAX_LEASE_DURATION)).
    pub fn claim(
        &mut self,
        holder: &Principal,
        now: DateTime<Utc>,
        lease_duration: Duration,
    ) -> Result<Lease, LeaseError> {
        time::check_lease_duration(lease_duration, Field::LeaseDuration)?;
        let index = self
            .0
            .attempts
            .iter()
            .position(|a| self.claimable_at(a).is_some_and(|at| at <= now));
        let Some(index) = index else {
            return Err(match self.next_claimable_at(now) {
                Some(next_at) => LeaseError::NoAttemptReady { next_at },
                None => LeaseError::TaskFinished,
            });
        };
        let token = match self.0.last_token {
            None => FencingToken::FIRST,
            Some(last) => last.next().ok_or(LeaseError::TokensExhausted)?,
        };
        let expires_at = time::add(now, lease_duration)?;
        let record = LeaseRecord {
            holder: holder.clone(),
            token,
            granted_at: now,
            expires_at,
        };
        self.0.last_token = Some(token);
        let attempt = &mut self.0.attempts[index];
        attempt.state = TaskState::Leased;
        attempt.tries = attempt.tries.saturating_add(1);
        let lease = Lease::new(&self.0.id, attempt.number, &record);
        attempt.lease = Some(record);
        Ok(lease)
    }

    /// Extends the live lease `token` held by `holder` to
    /// `max(expiry, now + extension)`, so a clock that stepped backwards never
    /// shortens it. Returns the lease as it now stands (unchanged if the
    /// expiry already lies further out).
    ///
    /// Errors: those of [`Task::submit`]'s lease check, and an invalid
    /// `extension` (zero or above [`MAX_LEASE_DURATION`](crate::MAX_LEASE_DURATION)).
    pub fn heartbeat(
        &mut self,
        holder: &Principal,
        token: FencingToken,
        now: DateTime<Utc>,
        extension: Duration,
    ) -> Result<Lease, LeaseError> {
        time::check_lease_duration(extension, Field::Extension)?;
        let index = self.live_attempt(holder, token, now)?;
        let candidate = time::add(now, extension)?;
        let attempt = &mut self.0.attempts[index];
        let lease = attempt
            .lease
            .as_mut()
            .expect("a live attempt has a lease");
        lease.expires_at = lease.expires_at.max(candidate);
        Ok(Lease::new(&self.0.id, attempt.number, lease))
    }

    /// Accepts a submission, or replays its receipt.
    ///
    /// `stored` is the receipt the store found under the submission's
    /// (principal, task, idempotency key). The idempotency rule runs first
    /// ([`decide_idempotency`]): the same digest returns that receipt
    /// unchanged as [`Submitted::Replayed`], even after the lease ended; a
    /// different digest is [`IdempotencyConflict`](LeaseError::IdempotencyConflict).
    ///
    /// A fresh submission needs the live lease of its token, held by its
    /// principal. Its attempt becomes done, and the receipt names the
    /// attempt, the token, the grant's artifact key and `max(now, granted_at)`.
    ///
    /// Errors for the lease check (shared with heartbeat and fail):
    /// [`UnknownToken`](LeaseError::UnknownToken),
    /// [`StaleToken`](LeaseError::StaleToken) (its attempt was granted again),
    /// [`WrongHolder`](LeaseError::WrongHolder),
    /// [`LeaseEnded`](LeaseError::LeaseEnded) (the attempt is done, failed or
    /// waiting after a failure report),
    /// [`LeaseExpired`](LeaseError::LeaseExpired). A
    /// [`ReceiptMismatch`](LeaseError::ReceiptMismatch) means `stored` is
    /// not this submission's receipt.
    pub fn submit(
        &mut self,
        submission: &Submission,
        stored: Option<&Receipt>,
        now: DateTime<Utc>,
    ) -> Result<Submitted, LeaseError> {
        if let Some(receipt) = stored {
            if receipt.task != self.0.id
                || receipt.principal != submission.principal
                || receipt.idempotency_key != submission.key
            {
                return Err(LeaseError::ReceiptMismatch);
            }
        }
        match decide_idempotency(stored, submission) {
            Idempotency::Replay(receipt) => return Ok(Submitted::Replayed(receipt)),
            Idempotency::Conflict => return Err(LeaseError::IdempotencyConflict),
            Idempotency::Fresh => {}
        }
        let index = self.live_attempt(&submission.principal, submission.token, now)?;
        let attempt = &mut self.0.attempts[index];
        let lease = attempt.lease.as_ref().expect("a live attempt has a lease");
        let receipt = Receipt {
            task: self.0.id.clone(),
            version: self.0.version,
            attempt: attempt.number,
            token: lease.token,
            principal: submission.principal.clone(),
            idempotency_key: submission.key.clone(),
            artifact: ArtifactKey::for_grant(&self.0.id, attempt.number, lease.token),
            digest: submission.digest,
            accepted_at: now.max(lease.granted_at),
        };
        attempt.state = TaskState::Done;
        Ok(Submitted::Accepted(receipt))
    }

    /// Ends the live lease `token` held by `holder` with a failure report:
    /// [`Retry::Never`] fails the attempt for good, [`Retry::After`] puts it
    /// in backoff until `now + backoff` (ready at once for zero). Returns the
    /// attempt's new state.
    ///
    /// Errors: those of [`Task::submit`]'s lease check, and a backoff above
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF).
    pub fn fail(
        &mut self,
        holder: &Principal,
        token: FencingToken,
        now: DateTime<Utc>,
        retry: Retry,
    ) -> Result<TaskState, LeaseError> {
        let state = match retry {
            Retry::Never => TaskState::Failed,
            Retry::After(backoff) => {
                time::check_backoff(backoff)?;
                if backoff.is_zero() {
                    TaskState::Ready
                } else {
                    TaskState::Backoff {
                        until: time::add(now, backoff)?,
                    }
                }
            }
        };
        let index = self.live_attempt(holder, token, now)?;
        self.0.attempts[index].state = state;
        Ok(state)
    }

    /// Applies what the passing of time alone changes: a lapsed lease makes
    /// its attempt ready, or puts it in backoff until `expires_at +
    /// lapse_backoff`; an ended backoff makes its attempt ready. Returns the
    /// attempts that changed (empty: nothing to write).
    ///
    /// Optional: [`Task::claim`] treats lapsed leases and ended backoffs the
    /// same way whether or not this ran, so it only keeps stored states
    /// current for reads and indexes.
    #[must_use = "the attempts that changed must be written"]
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<AttemptNumber> {
        let mut changed = Vec::new();
        let lapse_backoff = self.0.lapse_backoff;
        for attempt in &mut self.0.attempts {
            let next = match (attempt.state, &attempt.lease) {
                (TaskState::Leased, Some(lease)) if lease.is_expired(now) => {
                    let until = lapse_end(lease.expires_at, lapse_backoff);
                    if until <= now {
                        TaskState::Ready
                    } else {
                        TaskState::Backoff { until }
                    }
                }
                (TaskState::Backoff { until }, _) if until <= now => TaskState::Ready,
                _ => continue,
            };
            attempt.state = next;
            changed.push(attempt.number);
        }
        changed
    }

    /// The finished alternatives: for each done attempt, in number order, the
    /// receipt it was accepted with, picked out of `receipts` (any receipts
    /// the store holds for the task; others are ignored). This is the input
    /// of a comparison step.
    ///
    /// O(r log r) in the number of receipts passed.
    pub fn alternatives<'r>(
        &self,
        receipts: impl IntoIterator<Item = &'r Receipt>,
    ) -> Vec<&'r Receipt> {
        let mut chosen: Vec<&Receipt> = receipts
            .into_iter()
            .filter(|receipt| {
                receipt.task == self.0.id
                    && receipt.version == self.0.version
                    && self.attempt(receipt.attempt).is_some_and(|attempt| {
                        attempt.state == TaskState::Done
                            && attempt.lease.as_ref().map(|l| l.token) == Some(receipt.token)
                    })
            })
            .collect();
        chosen.sort_by_key(|receipt| receipt.attempt);
        // One accepted submission per attempt; duplicates are copies of it.
        chosen.dedup_by_key(|receipt| receipt.attempt);
        chosen
    }

    /// The earliest time `attempt` may be claimed, `None` if never again.
    fn claimable_at(&self, attempt: &AttemptRecord) -> Option<DateTime<Utc>> {
        match (attempt.state, &attempt.lease) {
            (TaskState::Ready, _) => Some(DateTime::<Utc>::MIN_UTC),
            (TaskState::Backoff { until }, _) => Some(until),
            (TaskState::Leased, Some(lease)) => {
                Some(lapse_end(lease.expires_at, self.0.lapse_backoff))
            }
            (TaskState::Leased, None) | (TaskState::Done | TaskState::Failed, _) => None,
        }
    }

    /// Finds the attempt whose live lease is `token`, held by `holder`.
    fn live_attempt(
        &self,
        holder: &Principal,
        token: FencingToken,
        now: DateTime<Utc>,
    ) -> Result<usize, LeaseError> {
        let found = self.0.attempts.iter().enumerate().find_map(|(index, attempt)| {
            let lease = attempt.lease.as_ref()?;
            (lease.token == token).then_some((index, attempt, lease))
        });
        let Some((index, attempt, lease)) = found else {
            // Tokens are granted in order, so one at or below the last was
            // granted and then superseded on its attempt.
            return Err(if self.0.last_token.is_some_and(|last| token <= last) {
                LeaseError::StaleToken { token }
            } else {
                LeaseError::UnknownToken { token }
            });
        };
        if lease.holder != *holder {
            return Err(LeaseError::WrongHolder { token });
        }
        let ended = LeaseError::LeaseEnded {
            token,
            attempt: attempt.number,
            state: attempt.state.name(),
        };
        if attempt.state.is_final() {
            return Err(ended);
        }
        if lease.is_expired(now) {
            return Err(LeaseError::LeaseExpired {
                token,
                expired_at: lease.expires_at,
            });
        }
        if attempt.state != TaskState::Leased {
            return Err(ended);
        }
        Ok(index)
    }
}

/// When an attempt whose lease lapsed at `expires_at` becomes claimable.
fn lapse_end(expires_at: DateTime<Utc>, lapse_backoff: Duration) -> DateTime<Utc> {
    time::add(expires_at, lapse_backoff).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl TryFrom<TaskRecord> for Task {
    type Error = LeaseError;

    fn try_from(record: TaskRecord) -> Result<Self, Self::Error> {
        Self::restore(record)
    }
}

impl From<Task> for TaskRecord {
    fn from(task: Task) -> Self {
        task.0
    }
}
