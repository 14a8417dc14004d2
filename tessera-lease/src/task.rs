//! Tasks: a versioned brief, its competing attempts and the lease rules.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::attempt::{AttemptNumber, AttemptRecord};
use crate::error::{Field, LeaseError, Rule};
use crate::lease::{Lease, LeaseRecord};
use crate::name::{ArtifactKey, Principal, TaskId};
use crate::receipt::{Idempotency, Receipt, Submission, Submitted, decide_idempotency};
use crate::state::{DiscardReason, TaskState};
use crate::time;
use crate::token::FencingToken;
use crate::tries::{DEFAULT_MAX_TRIES, Jitter, MAX_ERROR_BYTES, MAX_TRIES, retry_backoff};

/// The most competing attempts one task may have.
pub const MAX_ALTERNATIVES: u16 = 32;

/// The highest task priority; priorities run from 0 (the default) to this,
/// and a higher one is claimed first.
pub const MAX_PRIORITY: u8 = 3;

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
    /// How many tries each attempt gets, 1 to [`MAX_TRIES`]: a try is a
    /// grant, and one whose lease lapses counts as much as one that fails.
    /// An attempt whose last try lapses, or fails asking for a retry, is
    /// [`TaskState::Discarded`]. [`DEFAULT_MAX_TRIES`] unless set.
    pub max_tries: u32,
    /// 0 (the default) to [`MAX_PRIORITY`]: a claim takes a claimable task
    /// of a higher priority first, and within one priority the claim order
    /// of [`claim_order`](crate::ClaimKey).
    #[serde(default)]
    pub priority: u8,
    /// Not claimable before this time: the attempts start
    /// [`TaskState::Scheduled`] and are ordered by it once it passes, as an
    /// ended backoff is. `None` (the default): ready at once.
    #[serde(default)]
    pub not_before: Option<DateTime<Utc>>,
}

impl Default for TaskSpec {
    fn default() -> Self {
        Self {
            alternatives: 1,
            lapse_backoff: Duration::ZERO,
            max_tries: DEFAULT_MAX_TRIES,
            priority: 0,
            not_before: None,
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
    /// Retry after the default backoff: exponential in the attempt's tries,
    /// with jitter ([`retry_backoff`]).
    Backoff,
}

/// A failure report: what the worker asks for, and what went wrong.
///
/// A [`Retry`] converts into a report without an error text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    /// Whether and when to try again. Past the task's last try, a retry
    /// discards the attempt instead.
    pub retry: Retry,
    /// What went wrong, kept on the attempt as its last error; at most
    /// [`MAX_ERROR_BYTES`] bytes.
    #[serde(default)]
    pub error: Option<String>,
}

impl Failure {
    /// A report asking for `retry`, with an error text.
    pub fn with_error(retry: Retry, error: impl Into<String>) -> Self {
        Self {
            retry,
            error: Some(error.into()),
        }
    }
}

impl From<Retry> for Failure {
    fn from(retry: Retry) -> Self {
        Self { retry, error: None }
    }
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
    /// How many tries each attempt gets ([`TaskSpec::max_tries`]).
    #[serde(default = "default_max_tries")]
    pub max_tries: u32,
    /// The task's priority ([`TaskSpec::priority`]).
    #[serde(default)]
    pub priority: u8,
    /// The highest fencing token ever granted for this task; `None` (stored
    /// as 0) before the first claim. The next grant gets the one after it.
    pub last_token: Option<FencingToken>,
    /// The competing attempts, numbered 1, 2, … in order.
    pub attempts: Vec<AttemptRecord>,
}

fn default_max_tries() -> u32 {
    DEFAULT_MAX_TRIES
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
/// and never date a receipt before its lease was granted. A lapse that
/// [`Task::expire`] recorded stays recorded if the clock then steps back; one
/// not yet recorded is judged by the `now` of each call.
///
/// Calls scan the task's attempts, at most [`MAX_ALTERNATIVES`], so each is
/// O(1) in the number of tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TaskRecord", into = "TaskRecord")]
pub struct Task(TaskRecord);

impl Task {
    /// A new task with every attempt ready, or scheduled for
    /// [`TaskSpec::not_before`].
    ///
    /// Errors: [`OutOfRange`](LeaseError::OutOfRange) for the alternatives,
    /// tries or priority, and a lapse backoff above
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF).
    pub fn new(id: TaskId, version: BriefVersion, spec: TaskSpec) -> Result<Self, LeaseError> {
        if spec.alternatives == 0 || spec.alternatives > MAX_ALTERNATIVES {
            return Err(LeaseError::OutOfRange {
                field: Field::Alternatives,
                value: i64::from(spec.alternatives),
                max: i64::from(MAX_ALTERNATIVES),
            });
        }
        time::check_backoff(spec.lapse_backoff)?;
        check_max_tries(spec.max_tries)?;
        check_priority(spec.priority)?;
        let attempts = (1..=spec.alternatives)
            .map(|n| {
                let mut attempt = AttemptRecord::new(AttemptNumber(n));
                if let Some(at) = spec.not_before {
                    attempt.state = TaskState::Scheduled { at };
                }
                attempt
            })
            .collect();
        Ok(Self(TaskRecord {
            id,
            version,
            lapse_backoff: spec.lapse_backoff,
            max_tries: spec.max_tries,
            priority: spec.priority,
            last_token: None,
            attempts,
        }))
    }

    /// Checks a stored record and wraps it.
    ///
    /// Rejects (as [`LeaseError::InvalidRecord`]) attempts that are not
    /// numbered 1, 2, … up to [`MAX_ALTERNATIVES`]; a leased or final
    /// attempt without a lease; a lease token above `last_token` or shared by
    /// two attempts; a lease that does not end after it starts; a lease on
    /// an attempt never tried; `max_tries` outside 1 to [`MAX_TRIES`]; more
    /// tries than `max_tries`, or a ready, backoff or scheduled attempt with
    /// no try left; a priority above [`MAX_PRIORITY`]; and an error text
    /// over [`MAX_ERROR_BYTES`].
    pub fn restore(record: TaskRecord) -> Result<Self, LeaseError> {
        let invalid = |reason| Err(LeaseError::InvalidRecord { reason });
        let count = record.attempts.len();
        if count == 0 || count > usize::from(MAX_ALTERNATIVES) {
            return invalid("a task has 1 to MAX_ALTERNATIVES attempts");
        }
        if time::check_backoff(record.lapse_backoff).is_err() {
            return invalid("lapse backoff longer than MAX_BACKOFF");
        }
        if check_max_tries(record.max_tries).is_err() {
            return invalid("a task allows 1 to MAX_TRIES tries");
        }
        if check_priority(record.priority).is_err() {
            return invalid("a task's priority is 0 to MAX_PRIORITY");
        }
        for (index, attempt) in record.attempts.iter().enumerate() {
            if attempt.number.index() != index {
                return invalid("attempts must be numbered 1, 2, ... in order");
            }
            if attempt.tries > record.max_tries
                || (attempt.tries == record.max_tries
                    && matches!(
                        attempt.state,
                        TaskState::Ready | TaskState::Backoff { .. } | TaskState::Scheduled { .. }
                    ))
            {
                return invalid("an attempt out of tries is leased or final");
            }
            if attempt
                .last_error
                .as_ref()
                .is_some_and(|error| error.len() > MAX_ERROR_BYTES)
            {
                return invalid("an error text longer than MAX_ERROR_BYTES");
            }
            let Some(lease) = &attempt.lease else {
                // A cancel may end an attempt never claimed.
                if (attempt.state.is_final() && attempt.state != TaskState::Cancelled)
                    || attempt.state == TaskState::Leased
                {
                    return invalid("a leased or final attempt needs its lease");
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

    /// How many tries each attempt gets.
    pub fn max_tries(&self) -> u32 {
        self.0.max_tries
    }

    /// The task's priority, 0 to [`MAX_PRIORITY`].
    pub fn priority(&self) -> u8 {
        self.0.priority
    }

    /// Whether every attempt is final (done, failed, discarded or
    /// cancelled); the comparison step may run.
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
    /// ready, whose backoff or schedule has ended, or whose lease lapsed (and
    /// whose lapse backoff has passed) with a try left. The new token is the task's
    /// next, and the grant is one of the attempt's tries.
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
        let TaskRecord {
            id,
            attempts,
            last_token,
            ..
        } = &mut self.0;
        let live = live_attempt(attempts, *last_token, holder, token, now)?;
        let candidate = time::add(now, extension)?;
        live.lease.expires_at = live.lease.expires_at.max(candidate);
        Ok(Lease::new(id, live.number, live.lease))
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
    /// [`TaskCancelled`](LeaseError::TaskCancelled),
    /// [`LeaseEnded`](LeaseError::LeaseEnded) (the attempt is done, failed,
    /// discarded or waiting after a failure report),
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
        let TaskRecord {
            id,
            version,
            attempts,
            last_token,
            ..
        } = &mut self.0;
        let live = live_attempt(
            attempts,
            *last_token,
            &submission.principal,
            submission.token,
            now,
        )?;
        let receipt = Receipt {
            task: id.clone(),
            version: *version,
            attempt: live.number,
            token: live.lease.token,
            principal: submission.principal.clone(),
            idempotency_key: submission.key.clone(),
            artifact: ArtifactKey::for_grant(id, live.number, live.lease.token),
            digest: submission.digest,
            accepted_at: now.max(live.lease.granted_at),
        };
        *live.state = TaskState::Done;
        Ok(Submitted::Accepted(receipt))
    }

    /// Ends the live lease `token` held by `holder` with a failure report:
    /// [`Retry::Never`] fails the attempt for good; [`Retry::After`] puts it
    /// in backoff until `now + backoff` (ready at once for zero), and
    /// [`Retry::Backoff`] until `now` plus [`retry_backoff`] of its tries,
    /// drawn from `jitter`. A retry asked for on the attempt's last try
    /// discards it ([`DiscardReason::Failed`]) instead. The report's error
    /// text becomes the attempt's last error. Returns the attempt's new
    /// state.
    ///
    /// Errors: those of [`Task::submit`]'s lease check, a backoff above
    /// [`MAX_BACKOFF`](crate::MAX_BACKOFF) and an error text above
    /// [`MAX_ERROR_BYTES`].
    pub fn fail(
        &mut self,
        holder: &Principal,
        token: FencingToken,
        now: DateTime<Utc>,
        failure: impl Into<Failure>,
        jitter: &mut Jitter,
    ) -> Result<TaskState, LeaseError> {
        let failure = failure.into();
        if let Retry::After(backoff) = failure.retry {
            time::check_backoff(backoff)?;
        }
        if let Some(error) = &failure.error {
            if error.len() > MAX_ERROR_BYTES {
                return Err(LeaseError::InvalidInput {
                    field: Field::Error,
                    len: error.len(),
                    rule: Rule::TooLong {
                        max: MAX_ERROR_BYTES,
                    },
                });
            }
        }
        let max_tries = self.0.max_tries;
        let live = live_attempt(&mut self.0.attempts, self.0.last_token, holder, token, now)?;
        let backoff = match failure.retry {
            Retry::Never => None,
            _ if live.tries >= max_tries => None,
            Retry::After(backoff) => Some(backoff),
            Retry::Backoff => Some(retry_backoff(live.tries, jitter)),
        };
        let state = match backoff {
            None if failure.retry == Retry::Never => TaskState::Failed,
            None => TaskState::Discarded {
                reason: DiscardReason::Failed,
            },
            Some(backoff) if backoff.is_zero() => TaskState::Ready,
            Some(backoff) => TaskState::Backoff {
                until: time::add(now, backoff)?,
            },
        };
        *live.state = state;
        if failure.error.is_some() {
            *live.last_error = failure.error;
        }
        Ok(state)
    }

    /// An operator's retry: every failed, discarded or cancelled attempt
    /// becomes ready again, and the task allows at least one more try than
    /// any of them has had. Its next claim grants a fresh token, as every
    /// claim does. Returns the attempts retried.
    ///
    /// Errors: [`NothingToRetry`](LeaseError::NothingToRetry) if no attempt
    /// is failed, discarded or cancelled;
    /// [`OutOfRange`](LeaseError::OutOfRange) if one has had [`MAX_TRIES`]
    /// tries already.
    pub fn retry(&mut self) -> Result<Vec<AttemptNumber>, LeaseError> {
        let dead = |attempt: &&AttemptRecord| attempt.state.is_retryable();
        let Some(most) = self.0.attempts.iter().filter(dead).map(|a| a.tries).max() else {
            return Err(LeaseError::NothingToRetry);
        };
        let needed = most.saturating_add(1);
        check_max_tries(needed)?;
        self.0.max_tries = self.0.max_tries.max(needed);
        let mut retried = Vec::new();
        for attempt in &mut self.0.attempts {
            if dead(&&*attempt) {
                attempt.state = TaskState::Ready;
                retried.push(attempt.number);
            }
        }
        Ok(retried)
    }

    /// An operator's cancel: every attempt not yet final becomes
    /// [`TaskState::Cancelled`], a leased one included. Its holder learns it
    /// at its next heartbeat, submit or failure report
    /// ([`TaskCancelled`](LeaseError::TaskCancelled)), and nothing it sends
    /// is accepted. Returns the attempts cancelled.
    ///
    /// Errors: [`NothingToCancel`](LeaseError::NothingToCancel) if every
    /// attempt is final already.
    pub fn cancel(&mut self) -> Result<Vec<AttemptNumber>, LeaseError> {
        let cancelled: Vec<AttemptNumber> = self
            .0
            .attempts
            .iter_mut()
            .filter(|attempt| !attempt.state.is_final())
            .map(|attempt| {
                attempt.state = TaskState::Cancelled;
                attempt.number
            })
            .collect();
        if cancelled.is_empty() {
            return Err(LeaseError::NothingToCancel);
        }
        Ok(cancelled)
    }

    /// Applies what the passing of time alone changes: a lapsed lease makes
    /// its attempt ready, or puts it in backoff until `expires_at +
    /// lapse_backoff`, or discards it ([`DiscardReason::Lapsed`]) if that
    /// was its last try; an ended backoff or schedule makes its attempt
    /// ready. Returns
    /// the attempts that changed (empty: nothing to write).
    ///
    /// Optional: [`Task::claim`] treats lapsed leases and ended backoffs the
    /// same way whether or not this ran, so it only keeps stored states
    /// current for reads and indexes.
    #[must_use = "the attempts that changed must be written"]
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<AttemptNumber> {
        let mut changed = Vec::new();
        let lapse_backoff = self.0.lapse_backoff;
        let max_tries = self.0.max_tries;
        for attempt in &mut self.0.attempts {
            let next = match (attempt.state, &attempt.lease) {
                (TaskState::Leased, Some(lease))
                    if lease.is_expired(now) && attempt.tries >= max_tries =>
                {
                    TaskState::Discarded {
                        reason: DiscardReason::Lapsed,
                    }
                }
                (TaskState::Leased, Some(lease)) if lease.is_expired(now) => {
                    let until = lapse_end(lease.expires_at, lapse_backoff);
                    if until <= now {
                        TaskState::Ready
                    } else {
                        TaskState::Backoff { until }
                    }
                }
                (TaskState::Backoff { until } | TaskState::Scheduled { at: until }, _)
                    if until <= now =>
                {
                    TaskState::Ready
                }
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
        match attempt.state {
            TaskState::Ready => Some(DateTime::<Utc>::MIN_UTC),
            TaskState::Backoff { until } | TaskState::Scheduled { at: until } => Some(until),
            // A lapse on the last try discards the attempt.
            TaskState::Leased if attempt.tries >= self.0.max_tries => None,
            TaskState::Leased => attempt.lapses_at(self.0.lapse_backoff),
            TaskState::Done
            | TaskState::Failed
            | TaskState::Discarded { .. }
            | TaskState::Cancelled => None,
        }
    }
}

/// The attempt holding a live lease, borrowed for one rule to change.
struct LiveAttempt<'a> {
    number: AttemptNumber,
    tries: u32,
    state: &'a mut TaskState,
    lease: &'a mut LeaseRecord,
    last_error: &'a mut Option<String>,
}

/// Finds the attempt whose live lease is `token`, held by `holder`; the
/// check that heartbeat, submit and fail share.
fn live_attempt<'a>(
    attempts: &'a mut [AttemptRecord],
    last_token: Option<FencingToken>,
    holder: &Principal,
    token: FencingToken,
    now: DateTime<Utc>,
) -> Result<LiveAttempt<'a>, LeaseError> {
    let found = attempts.iter_mut().find_map(|attempt| match attempt {
        AttemptRecord {
            number,
            state,
            tries,
            lease: Some(lease),
            last_error,
        } if lease.token == token => Some(LiveAttempt {
            number: *number,
            tries: *tries,
            state,
            lease,
            last_error,
        }),
        _ => None,
    });
    let Some(live) = found else {
        // Tokens are granted in order, so one at or below the last was
        // granted and then superseded on its attempt.
        return Err(if last_token.is_some_and(|last| token <= last) {
            LeaseError::StaleToken { token }
        } else {
            LeaseError::UnknownToken { token }
        });
    };
    if live.lease.holder != *holder {
        return Err(LeaseError::WrongHolder { token });
    }
    if *live.state == TaskState::Cancelled {
        return Err(LeaseError::TaskCancelled {
            token,
            attempt: live.number,
        });
    }
    let ended = LeaseError::LeaseEnded {
        token,
        attempt: live.number,
        state: live.state.name(),
    };
    if live.state.is_final() {
        return Err(ended);
    }
    if live.lease.is_expired(now) {
        return Err(LeaseError::LeaseExpired {
            token,
            expired_at: live.lease.expires_at,
        });
    }
    if *live.state != TaskState::Leased {
        return Err(ended);
    }
    Ok(live)
}

/// Checks a task's number of tries: 1 to [`MAX_TRIES`].
fn check_max_tries(max_tries: u32) -> Result<(), LeaseError> {
    if max_tries == 0 || max_tries > MAX_TRIES {
        return Err(LeaseError::OutOfRange {
            field: Field::MaxTries,
            value: i64::from(max_tries),
            max: i64::from(MAX_TRIES),
        });
    }
    Ok(())
}

/// Checks a task's priority: 0 to [`MAX_PRIORITY`].
fn check_priority(priority: u8) -> Result<(), LeaseError> {
    if priority > MAX_PRIORITY {
        return Err(LeaseError::OutOfRange {
            field: Field::Priority,
            value: i64::from(priority),
            max: i64::from(MAX_PRIORITY),
        });
    }
    Ok(())
}

/// When an attempt whose lease lapsed at `expires_at` becomes claimable.
pub(crate) fn lapse_end(expires_at: DateTime<Utc>, lapse_backoff: Duration) -> DateTime<Utc> {
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

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::digest::Digest;
    use crate::error::DurationRule;
    use crate::name::IdempotencyKey;
    use crate::state::StateName;
    use crate::time::MAX_BACKOFF;

    const LEASE: Duration = Duration::from_secs(30);

    fn t0() -> DateTime<Utc> {
        "2026-10-29T12:00:00Z".parse().unwrap()
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        t0() + TimeDelta::seconds(seconds)
    }

    fn who(name: &str) -> Principal {
        Principal::parse(name).unwrap()
    }

    fn token(value: i64) -> FencingToken {
        FencingToken::new(value).unwrap()
    }

    fn task_with(spec: TaskSpec) -> Task {
        Task::new(TaskId::parse("task-1").unwrap(), BriefVersion::FIRST, spec).unwrap()
    }

    fn task() -> Task {
        task_with(TaskSpec::default())
    }

    fn alternatives(n: u16) -> Task {
        task_with(TaskSpec {
            alternatives: n,
            ..TaskSpec::default()
        })
    }

    fn submission(principal: &str, token: FencingToken, key: &str, digest: u8) -> Submission {
        Submission {
            principal: who(principal),
            token,
            key: IdempotencyKey::parse(key).unwrap(),
            digest: Digest::from_bytes([digest; 32]),
        }
    }

    fn accept(task: &mut Task, sub: &Submission, now: DateTime<Utc>) -> Receipt {
        match task.submit(sub, None, now) {
            Ok(Submitted::Accepted(receipt)) => receipt,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    /// Runs a rule that must fail and checks that it changed nothing.
    fn refused<T: fmt::Debug>(
        task: &mut Task,
        rule: impl FnOnce(&mut Task) -> Result<T, LeaseError>,
    ) -> LeaseError {
        let before = task.clone();
        let err = rule(task).expect_err("the rule must refuse");
        assert_eq!(*task, before, "a refused rule changed the task");
        err
    }

    fn state(task: &Task, n: u16) -> TaskState {
        task.attempt(AttemptNumber::new(n).unwrap()).unwrap().state
    }

    // -- creation --------------------------------------------------------

    #[test]
    fn a_new_task_has_every_attempt_ready_and_no_token() {
        let task = alternatives(3);
        assert_eq!(task.attempts().len(), 3);
        assert!(task.attempts().iter().all(|a| a.state == TaskState::Ready));
        assert_eq!(task.last_token(), None);
        assert!(!task.is_finished());
        assert_eq!(task.next_claimable_at(t0()), Some(t0()));
    }

    #[test]
    fn alternatives_and_lapse_backoff_are_bounded() {
        let id = TaskId::parse("t").unwrap();
        for n in [0, MAX_ALTERNATIVES + 1] {
            let spec = TaskSpec {
                alternatives: n,
                ..TaskSpec::default()
            };
            assert!(matches!(
                Task::new(id.clone(), BriefVersion::FIRST, spec),
                Err(LeaseError::OutOfRange {
                    field: Field::Alternatives,
                    ..
                })
            ));
        }
        let spec = TaskSpec {
            lapse_backoff: MAX_BACKOFF * 2,
            ..TaskSpec::default()
        };
        assert!(Task::new(id, BriefVersion::FIRST, spec).is_err());
        assert!(BriefVersion::new(0).is_err());
    }

    // -- claim -----------------------------------------------------------

    #[test]
    fn claim_leases_a_ready_attempt_under_the_first_token() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        assert_eq!(lease.token(), FencingToken::FIRST);
        assert_eq!(lease.attempt(), AttemptNumber::FIRST);
        assert_eq!(lease.holder(), &who("a"));
        assert_eq!(lease.granted_at(), t0());
        assert_eq!(lease.expires_at(), at(30));
        assert_eq!(state(&task, 1), TaskState::Leased);
        assert_eq!(task.attempts()[0].tries, 1);
        assert_eq!(task.last_token(), Some(FencingToken::FIRST));
        assert_eq!(task.live_lease(AttemptNumber::FIRST, at(29)), Some(lease));
        assert_eq!(task.live_lease(AttemptNumber::FIRST, at(30)), None);
    }

    #[test]
    fn claim_of_a_held_task_says_when_it_may_lapse() {
        let mut task = task();
        task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| t.claim(&who("b"), at(10), LEASE));
        assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(30) });
    }

    #[test]
    fn claim_rejects_zero_and_overlong_durations() {
        let mut task = task();
        let err = refused(&mut task, |t| t.claim(&who("a"), t0(), Duration::ZERO));
        assert_eq!(
            err,
            LeaseError::InvalidDuration {
                field: Field::LeaseDuration,
                rule: DurationRule::Zero
            }
        );
        let err = refused(&mut task, |t| {
            t.claim(&who("a"), t0(), crate::MAX_LEASE_DURATION * 2)
        });
        assert!(matches!(
            err,
            LeaseError::InvalidDuration {
                rule: DurationRule::TooLong { .. },
                ..
            }
        ));
    }

    #[test]
    fn claim_of_a_finished_task_is_refused() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
        assert!(task.is_finished());
        assert_eq!(task.next_claimable_at(at(2)), None);
        let err = refused(&mut task, |t| t.claim(&who("b"), at(2), LEASE));
        assert_eq!(err, LeaseError::TaskFinished);
    }

    #[test]
    fn a_lapsed_lease_is_claimed_again_under_a_higher_token() {
        let mut task = task();
        let first = task.claim(&who("a"), t0(), LEASE).unwrap();
        let second = task.claim(&who("b"), at(30), LEASE).unwrap();
        assert!(second.token() > first.token());
        assert_eq!(second.holder(), &who("b"));
        assert_eq!(task.attempts()[0].tries, 2);
    }

    #[test]
    fn lapse_backoff_delays_the_next_claim() {
        let mut task = task_with(TaskSpec {
            lapse_backoff: Duration::from_secs(60),
            ..TaskSpec::default()
        });
        task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| t.claim(&who("b"), at(45), LEASE));
        assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(90) });
        assert_eq!(
            task.claim(&who("b"), at(90), LEASE).unwrap().token(),
            token(2)
        );
    }

    #[test]
    fn claim_refuses_when_tokens_are_exhausted() {
        let mut record = task().into_record();
        record.last_token = Some(token(i64::MAX));
        let mut task = Task::restore(record).unwrap();
        let err = refused(&mut task, |t| t.claim(&who("a"), t0(), LEASE));
        assert_eq!(err, LeaseError::TokensExhausted);
    }

    #[test]
    fn claim_refuses_an_expiry_past_the_end_of_time() {
        let mut task = task();
        let err = refused(&mut task, |t| {
            t.claim(&who("a"), DateTime::<Utc>::MAX_UTC, LEASE)
        });
        assert_eq!(err, LeaseError::TimeOutOfRange);
    }

    // -- competing attempts ---------------------------------------------

    #[test]
    fn competing_attempts_each_get_their_own_lease_and_token() {
        let mut task = alternatives(3);
        let leases: Vec<Lease> = ["a", "b", "c"]
            .iter()
            .map(|w| task.claim(&who(w), t0(), LEASE).unwrap())
            .collect();
        let numbers: Vec<u16> = leases.iter().map(|l| l.attempt().as_u16()).collect();
        assert_eq!(numbers, [1, 2, 3]);
        let tokens: Vec<i64> = leases.iter().map(|l| l.token().as_i64()).collect();
        assert_eq!(tokens, [1, 2, 3]);
        assert_ne!(leases[0].artifact(), leases[1].artifact());
        let err = refused(&mut task, |t| t.claim(&who("d"), at(1), LEASE));
        assert_eq!(err, LeaseError::NoAttemptReady { next_at: at(30) });
    }

    #[test]
    fn one_attempt_lapsing_never_touches_another() {
        let mut task = alternatives(2);
        let a = task.claim(&who("a"), t0(), LEASE).unwrap();
        let b = task.claim(&who("b"), at(10), LEASE).unwrap();
        // a lapses at 30 while b holds until 40; only a is claimable again.
        let c = task.claim(&who("c"), at(35), LEASE).unwrap();
        assert_eq!(c.attempt(), a.attempt());
        assert_eq!(c.token(), token(3));
        // b still submits under its own token although the task's last is 3.
        let receipt = accept(&mut task, &submission("b", b.token(), "kb", 2), at(36));
        assert_eq!(receipt.attempt, b.attempt());
        assert_eq!(state(&task, 1), TaskState::Leased);
        assert_eq!(state(&task, 2), TaskState::Done);
        // a's own lapsed token is stale now that its attempt was granted again.
        let err = refused(&mut task, |t| {
            t.submit(&submission("a", a.token(), "ka", 1), None, at(36))
        });
        assert_eq!(err, LeaseError::StaleToken { token: a.token() });
    }

    // -- heartbeat -------------------------------------------------------

    #[test]
    fn heartbeat_extends_from_now() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let extended = task
            .heartbeat(&who("a"), lease.token(), at(20), LEASE)
            .unwrap();
        assert_eq!(extended.expires_at(), at(50));
        assert_eq!(extended.token(), lease.token());
        assert_eq!(extended.granted_at(), t0());
    }

    #[test]
    fn heartbeat_never_moves_expiry_into_the_past() {
        let mut task = task();
        let lease = task.claim(&who("a"), at(100), LEASE).unwrap();
        // The clock stepped back 60 s: now + extension lies before the expiry.
        let kept = task
            .heartbeat(&who("a"), lease.token(), at(40), Duration::from_secs(5))
            .unwrap();
        assert_eq!(kept.expires_at(), at(130));
    }

    #[test]
    fn heartbeat_at_or_after_expiry_is_refused() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), lease.token(), at(30), LEASE)
        });
        assert_eq!(
            err,
            LeaseError::LeaseExpired {
                token: lease.token(),
                expired_at: at(30)
            }
        );
        // Also after a sweep made the attempt ready.
        assert_eq!(task.expire(at(31)), [AttemptNumber::FIRST]);
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), lease.token(), at(31), LEASE)
        });
        assert!(matches!(err, LeaseError::LeaseExpired { .. }));
    }

    #[test]
    fn heartbeat_by_another_holder_is_refused() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("b"), lease.token(), at(1), LEASE)
        });
        assert_eq!(
            err,
            LeaseError::WrongHolder {
                token: lease.token()
            }
        );
    }

    #[test]
    fn heartbeat_with_a_stale_or_unknown_token_is_refused() {
        let mut task = task();
        let old = task.claim(&who("a"), t0(), LEASE).unwrap();
        task.claim(&who("a"), at(30), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), old.token(), at(31), LEASE)
        });
        assert_eq!(err, LeaseError::StaleToken { token: old.token() });
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), token(3), at(31), LEASE)
        });
        assert_eq!(err, LeaseError::UnknownToken { token: token(3) });
    }

    #[test]
    fn heartbeat_after_the_lease_ended_is_refused() {
        let mut task = alternatives(3);
        let done = task.claim(&who("a"), t0(), LEASE).unwrap();
        let failed = task.claim(&who("a"), t0(), LEASE).unwrap();
        let retried = task.claim(&who("a"), t0(), LEASE).unwrap();
        accept(&mut task, &submission("a", done.token(), "k", 1), at(1));
        task.fail(
            &who("a"),
            failed.token(),
            at(1),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
        .unwrap();
        task.fail(
            &who("a"),
            retried.token(),
            at(1),
            Retry::After(Duration::from_secs(60)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
        for (lease, name) in [
            (&done, StateName::Done),
            (&failed, StateName::Failed),
            (&retried, StateName::Backoff),
        ] {
            let err = refused(&mut task, |t| {
                t.heartbeat(&who("a"), lease.token(), at(2), LEASE)
            });
            assert_eq!(
                err,
                LeaseError::LeaseEnded {
                    token: lease.token(),
                    attempt: lease.attempt(),
                    state: name
                }
            );
        }
    }

    #[test]
    fn heartbeat_rejects_a_zero_extension() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), lease.token(), at(1), Duration::ZERO)
        });
        assert_eq!(
            err,
            LeaseError::InvalidDuration {
                field: Field::Extension,
                rule: DurationRule::Zero
            }
        );
    }

    // -- submit ----------------------------------------------------------

    #[test]
    fn submit_finishes_the_attempt_and_names_everything_in_the_receipt() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let sub = submission("a", lease.token(), "k1", 5);
        let receipt = accept(&mut task, &sub, at(10));
        assert_eq!(receipt.task, *task.id());
        assert_eq!(receipt.version, BriefVersion::FIRST);
        assert_eq!(receipt.attempt, AttemptNumber::FIRST);
        assert_eq!(receipt.token, lease.token());
        assert_eq!(receipt.principal, who("a"));
        assert_eq!(receipt.idempotency_key, sub.key);
        assert_eq!(receipt.artifact, lease.artifact());
        assert_eq!(receipt.digest, sub.digest);
        assert_eq!(receipt.accepted_at, at(10));
        assert_eq!(state(&task, 1), TaskState::Done);
        assert_eq!(task.live_lease(AttemptNumber::FIRST, at(10)), None);
    }

    #[test]
    fn a_receipt_is_never_dated_before_its_grant() {
        let mut task = task();
        let lease = task.claim(&who("a"), at(100), LEASE).unwrap();
        let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(90));
        assert_eq!(receipt.accepted_at, at(100));
    }

    #[test]
    fn same_key_and_digest_replays_without_changing_anything() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let sub = submission("a", lease.token(), "k", 1);
        let receipt = accept(&mut task, &sub, at(1));
        let before = task.clone();
        // Long after the lease would have lapsed.
        let replay = task.submit(&sub, Some(&receipt), at(1000)).unwrap();
        assert_eq!(replay, Submitted::Replayed(receipt.clone()));
        assert_eq!(task, before);
    }

    #[test]
    fn same_key_with_another_digest_conflicts() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
        let err = refused(&mut task, |t| {
            t.submit(
                &submission("a", lease.token(), "k", 2),
                Some(&receipt),
                at(2),
            )
        });
        assert_eq!(err, LeaseError::IdempotencyConflict);
    }

    #[test]
    fn a_stored_receipt_of_another_scope_is_misuse() {
        let mut task = alternatives(2);
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let receipt = accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
        let other = task.claim(&who("b"), at(1), LEASE).unwrap();
        for sub in [
            submission("b", other.token(), "k", 1),
            submission("a", other.token(), "other-key", 1),
        ] {
            let err = refused(&mut task, |t| t.submit(&sub, Some(&receipt), at(2)));
            assert_eq!(err, LeaseError::ReceiptMismatch);
        }
    }

    #[test]
    fn a_done_attempt_refuses_a_second_result() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        accept(&mut task, &submission("a", lease.token(), "k1", 1), at(1));
        let err = refused(&mut task, |t| {
            t.submit(&submission("a", lease.token(), "k2", 2), None, at(2))
        });
        assert_eq!(
            err,
            LeaseError::LeaseEnded {
                token: lease.token(),
                attempt: AttemptNumber::FIRST,
                state: StateName::Done
            }
        );
    }

    #[test]
    fn submit_refuses_expired_foreign_stale_and_unknown_tokens() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.submit(&submission("a", lease.token(), "k", 1), None, at(30))
        });
        assert!(matches!(err, LeaseError::LeaseExpired { .. }));
        let err = refused(&mut task, |t| {
            t.submit(&submission("b", lease.token(), "k", 1), None, at(1))
        });
        assert!(matches!(err, LeaseError::WrongHolder { .. }));
        let err = refused(&mut task, |t| {
            t.submit(&submission("a", token(2), "k", 1), None, at(1))
        });
        assert!(matches!(err, LeaseError::UnknownToken { .. }));
        task.claim(&who("b"), at(31), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.submit(&submission("a", lease.token(), "k", 1), None, at(32))
        });
        assert!(matches!(err, LeaseError::StaleToken { .. }));
    }

    // -- fail ------------------------------------------------------------

    #[test]
    fn fail_never_is_final() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let state = task
            .fail(
                &who("a"),
                lease.token(),
                at(1),
                Retry::Never,
                &mut Jitter::seeded(0),
            )
            .unwrap();
        assert_eq!(state, TaskState::Failed);
        assert!(task.is_finished());
        assert_eq!(
            refused(&mut task, |t| t.claim(&who("b"), at(2), LEASE)),
            LeaseError::TaskFinished
        );
    }

    #[test]
    fn fail_with_backoff_waits_then_grants_a_higher_token() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let state = task
            .fail(
                &who("a"),
                lease.token(),
                at(5),
                Retry::After(Duration::from_secs(60)),
                &mut Jitter::seeded(0),
            )
            .unwrap();
        assert_eq!(state, TaskState::Backoff { until: at(65) });
        assert_eq!(
            refused(&mut task, |t| t.claim(&who("b"), at(64), LEASE)),
            LeaseError::NoAttemptReady { next_at: at(65) }
        );
        assert_eq!(
            task.claim(&who("b"), at(65), LEASE).unwrap().token(),
            token(2)
        );
    }

    #[test]
    fn fail_with_zero_backoff_is_ready_at_once() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let state = task
            .fail(
                &who("a"),
                lease.token(),
                at(5),
                Retry::After(Duration::ZERO),
                &mut Jitter::seeded(0),
            )
            .unwrap();
        assert_eq!(state, TaskState::Ready);
        assert_eq!(
            task.claim(&who("a"), at(5), LEASE).unwrap().token(),
            token(2)
        );
    }

    #[test]
    fn fail_refuses_overlong_backoff_and_bad_tokens() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let err = refused(&mut task, |t| {
            t.fail(
                &who("a"),
                lease.token(),
                at(1),
                Retry::After(MAX_BACKOFF * 2),
                &mut Jitter::seeded(0),
            )
        });
        assert!(matches!(
            err,
            LeaseError::InvalidDuration {
                field: Field::Backoff,
                ..
            }
        ));
        let err = refused(&mut task, |t| {
            t.fail(
                &who("b"),
                lease.token(),
                at(1),
                Retry::Never,
                &mut Jitter::seeded(0),
            )
        });
        assert!(matches!(err, LeaseError::WrongHolder { .. }));
        let err = refused(&mut task, |t| {
            t.fail(
                &who("a"),
                lease.token(),
                at(30),
                Retry::Never,
                &mut Jitter::seeded(0),
            )
        });
        assert!(matches!(err, LeaseError::LeaseExpired { .. }));
    }

    // -- expire ----------------------------------------------------------

    #[test]
    fn expire_makes_a_lapsed_attempt_ready_and_leaves_live_ones() {
        let mut task = alternatives(2);
        task.claim(&who("a"), t0(), LEASE).unwrap();
        task.claim(&who("b"), at(10), LEASE).unwrap();
        assert!(task.expire(at(29)).is_empty());
        assert_eq!(task.expire(at(30)), [AttemptNumber::FIRST]);
        assert_eq!(state(&task, 1), TaskState::Ready);
        assert_eq!(state(&task, 2), TaskState::Leased);
        assert!(
            task.expire(at(30)).is_empty(),
            "a second sweep writes nothing"
        );
    }

    #[test]
    fn expire_applies_the_lapse_backoff_from_the_lapse() {
        let spec = TaskSpec {
            lapse_backoff: Duration::from_secs(60),
            ..TaskSpec::default()
        };
        let mut task = task_with(spec);
        task.claim(&who("a"), t0(), LEASE).unwrap();
        let _ = task.expire(at(40));
        assert_eq!(state(&task, 1), TaskState::Backoff { until: at(90) });
        assert_eq!(task.expire(at(90)), [AttemptNumber::FIRST]);
        assert_eq!(state(&task, 1), TaskState::Ready);
        // A late sweep goes straight to ready, as a claim would see it.
        let mut late = task_with(spec);
        late.claim(&who("a"), t0(), LEASE).unwrap();
        let _ = late.expire(at(500));
        assert_eq!(state(&late, 1), TaskState::Ready);
    }

    #[test]
    fn expire_ends_elapsed_backoffs_only() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        task.fail(
            &who("a"),
            lease.token(),
            at(1),
            Retry::After(Duration::from_secs(10)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
        assert!(task.expire(at(10)).is_empty());
        assert_eq!(task.expire(at(11)), [AttemptNumber::FIRST]);
        assert_eq!(state(&task, 1), TaskState::Ready);
    }

    #[test]
    fn a_recorded_lapse_survives_the_clock_stepping_back() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        let _ = task.expire(at(30));
        let err = refused(&mut task, |t| {
            t.heartbeat(&who("a"), lease.token(), at(25), LEASE)
        });
        assert_eq!(
            err,
            LeaseError::LeaseEnded {
                token: lease.token(),
                attempt: AttemptNumber::FIRST,
                state: StateName::Ready
            }
        );
        assert_eq!(task.live_lease(AttemptNumber::FIRST, at(25)), None);
    }

    #[test]
    fn expire_leaves_final_attempts_alone() {
        let mut task = task();
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        accept(&mut task, &submission("a", lease.token(), "k", 1), at(1));
        assert!(task.expire(at(10_000)).is_empty());
        assert_eq!(state(&task, 1), TaskState::Done);
    }

    // -- alternatives ----------------------------------------------------

    #[test]
    fn alternatives_lists_each_finished_attempt_once_in_order() {
        let mut task = alternatives(3);
        let l1 = task.claim(&who("a"), t0(), LEASE).unwrap();
        let l2 = task.claim(&who("b"), t0(), LEASE).unwrap();
        let l3 = task.claim(&who("c"), t0(), LEASE).unwrap();
        let r2 = accept(&mut task, &submission("b", l2.token(), "k", 2), at(1));
        let r1 = accept(&mut task, &submission("a", l1.token(), "k", 1), at(2));
        task.fail(
            &who("c"),
            l3.token(),
            at(3),
            Retry::Never,
            &mut Jitter::seeded(0),
        )
        .unwrap();
        let mut foreign = r1.clone();
        foreign.task = TaskId::parse("other").unwrap();
        let mut old_version = r1.clone();
        old_version.version = BriefVersion::new(2).unwrap();
        let mut stale = r2.clone();
        stale.token = token(9);
        let stored = [
            r2.clone(),
            foreign,
            r1.clone(),
            old_version,
            stale,
            r2.clone(),
        ];
        assert_eq!(task.alternatives(&stored), [&r1, &r2]);
        assert!(task.is_finished());
    }

    // -- records ---------------------------------------------------------

    #[test]
    fn records_round_trip_through_restore_and_serde() {
        let mut task = alternatives(2);
        let lease = task.claim(&who("a"), t0(), LEASE).unwrap();
        task.fail(
            &who("a"),
            lease.token(),
            at(1),
            Retry::After(Duration::from_secs(5)),
            &mut Jitter::seeded(0),
        )
        .unwrap();
        task.claim(&who("b"), at(2), LEASE).unwrap();
        assert_eq!(Task::restore(task.record().clone()).unwrap(), task);
        let json = serde_json::to_string(&task).unwrap();
        assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), task);
    }

    #[test]
    fn restore_rejects_each_broken_invariant() {
        let mut base = alternatives(2);
        base.claim(&who("a"), t0(), LEASE).unwrap();
        base.claim(&who("b"), t0(), LEASE).unwrap();
        let base = base.into_record();
        type Breakage = fn(&mut TaskRecord);
        let breakages: [(&str, Breakage); 9] = [
            ("no attempts", |r| r.attempts.clear()),
            ("misnumbered", |r| {
                r.attempts[1].number = AttemptNumber::FIRST
            }),
            ("leased without lease", |r| r.attempts[0].lease = None),
            ("untried lease", |r| r.attempts[0].tries = 0),
            ("token above last", |r| r.last_token = Some(token(1))),
            ("no last token", |r| r.last_token = None),
            ("shared token", |r| {
                let lease = r.attempts[0].lease.clone();
                r.attempts[1].lease = lease;
            }),
            ("empty lease", |r| {
                let lease = r.attempts[0].lease.as_mut().unwrap();
                lease.expires_at = lease.granted_at;
            }),
            ("long backoff", |r| r.lapse_backoff = MAX_BACKOFF * 2),
        ];
        for (name, breakage) in breakages {
            let mut record = base.clone();
            breakage(&mut record);
            assert!(
                matches!(Task::restore(record), Err(LeaseError::InvalidRecord { .. })),
                "{name} was accepted"
            );
        }
        assert!(Task::restore(base).is_ok());
    }
}
