//! Tasks: a versioned brief, its competing attempts and the lease rules.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::attempt::AttemptRecord;
use crate::dependency::ParentEnd;
use crate::error::{Field, LeaseError, Rule};
use crate::lease::{Lease, LeaseRecord};
use crate::name::AttemptNumber;
use crate::name::{ArtifactKey, BriefVersion, Principal, TaskId};
use crate::receipt::{Idempotency, Receipt, Submission, Submitted, decide_idempotency};
use crate::spec::{Failure, MAX_ALTERNATIVES, MAX_PRIORITY, Retry, TaskRecord, TaskSpec};
use crate::state::{DiscardReason, TaskState};
use crate::time;
use crate::token::FencingToken;
use crate::tries::{Jitter, MAX_ERROR_BYTES, MAX_TRIES, retry_backoff};

/// The last error of an attempt cancelled because a parent its task
/// needed done ended otherwise ([`Task::cancel_waiting`]).
pub const PARENT_FAILED: &str = "parent_failed";

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
    /// A new task with every attempt ready, scheduled for
    /// [`TaskSpec::not_before`], or waiting for parents
    /// ([`TaskSpec::waits`]).
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
        if let Some(duration) = spec.lease_duration {
            time::check_lease_duration(duration, Field::LeaseDuration)?;
        }
        let attempts = (1..=spec.alternatives)
            .map(|n| {
                let mut attempt = AttemptRecord::new(AttemptNumber(n));
                if spec.waits {
                    attempt.state = TaskState::Waiting {
                        not_before: spec.not_before,
                    };
                } else if let Some(at) = spec.not_before {
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
            lease_duration: spec.lease_duration,
            deadline: spec.deadline,
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
    /// no try left; a priority above [`MAX_PRIORITY`]; an own lease length
    /// of zero or above [`MAX_LEASE_DURATION`](crate::MAX_LEASE_DURATION);
    /// and an error text over [`MAX_ERROR_BYTES`].
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
        if record
            .lease_duration
            .is_some_and(|d| time::check_lease_duration(d, Field::LeaseDuration).is_err())
        {
            return invalid("a task's lease is 1 ms to MAX_LEASE_DURATION");
        }
        for (index, attempt) in record.attempts.iter().enumerate() {
            if attempt.number.index() != index {
                return invalid("attempts must be numbered 1, 2, ... in order");
            }
            if attempt.tries > record.max_tries
                || (attempt.tries == record.max_tries
                    && matches!(
                        attempt.state,
                        TaskState::Ready
                            | TaskState::Backoff { .. }
                            | TaskState::Scheduled { .. }
                            | TaskState::Waiting { .. }
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
                // A cancel or a deadline may end an attempt never claimed.
                let unclaimed_end = matches!(
                    attempt.state,
                    TaskState::Cancelled
                        | TaskState::Discarded {
                            reason: DiscardReason::DeadlineExceeded
                        }
                );
                if (attempt.state.is_final() && !unclaimed_end)
                    || attempt.state == TaskState::Leased
                {
                    return invalid("a leased or final attempt needs its lease");
                }
                continue;
            };
            if attempt.tries == 0 && attempt.state == TaskState::Leased {
                // Any other state may follow a snooze, which gives its try
                // back and leaves the lease's record behind.
                return invalid("a leased attempt was tried at least once");
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

    /// Whether every attempt is still waiting to run (ready, scheduled, or
    /// backing off), none leased or final: what a unique task's duplicate
    /// may still change ([`Holder::waiting`](crate::Holder::waiting)).
    pub fn is_waiting(&self) -> bool {
        self.0
            .attempts
            .iter()
            .all(|a| crate::UniqueStates::WAITING.contains(a.state.name()))
    }

    /// A waiting task's new not-before time, from a duplicate that
    /// replaces or debounces it ([`Duplicate::Replace`](crate::Duplicate)):
    /// every attempt becomes scheduled for `not_before`, or ready if
    /// `None`; one still waiting for parents keeps waiting, with the new
    /// not-before time. Tries, tokens and leases are kept. Returns the
    /// attempts.
    ///
    /// Errors: [`TaskFinished`](LeaseError::TaskFinished), changing
    /// nothing, if an attempt is leased or final: a duplicate reschedules
    /// only a task that [`is_waiting`](Self::is_waiting).
    pub fn reschedule(
        &mut self,
        not_before: Option<DateTime<Utc>>,
    ) -> Result<Vec<AttemptNumber>, LeaseError> {
        if !self.is_waiting() {
            return Err(LeaseError::TaskFinished);
        }
        let state = match not_before {
            Some(at) => TaskState::Scheduled { at },
            None => TaskState::Ready,
        };
        Ok(self
            .0
            .attempts
            .iter_mut()
            .map(|attempt| {
                attempt.state = match attempt.state {
                    TaskState::Waiting { .. } => TaskState::Waiting { not_before },
                    _ => state,
                };
                attempt.number
            })
            .collect())
    }

    /// When an attempt can next be claimed: `now` if one can be claimed now,
    /// the earliest backoff end or lapse otherwise, `None` once finished,
    /// at or past the task's deadline, or when no attempt can be claimed
    /// before it.
    pub fn next_claimable_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.past_deadline(now) {
            return None;
        }
        self.0
            .attempts
            .iter()
            .filter_map(|attempt| self.claimable_at(attempt))
            .min()
            .map(|at| at.max(now))
            .filter(|at| self.0.deadline.is_none_or(|deadline| *at < deadline))
    }

    /// The state an attempt waits in after `holder` snoozed its lease
    /// `token` for `delay`, if that snooze took effect and the attempt was
    /// not granted again: its latest lease is `token`, held by `holder`,
    /// ended by the snooze (the lease record's end is the snooze's time),
    /// and it waits until that time plus `delay` (or is ready, for a
    /// delay of zero, with its lease ended by `now`). `None` otherwise: a
    /// lease ended by a failure report, a lapse or another delay is not
    /// this snooze. A retried snooze answers this state again, and
    /// changes nothing.
    pub fn snoozed(
        &self,
        holder: &Principal,
        token: FencingToken,
        delay: Duration,
        now: DateTime<Utc>,
    ) -> Option<TaskState> {
        let attempt = self.0.attempts.iter().find(|attempt| {
            attempt
                .lease
                .as_ref()
                .is_some_and(|lease| lease.token == token && &lease.holder == holder)
        })?;
        let lease = attempt.lease.as_ref()?;
        let ended = lease.expires_at;
        let fits = match attempt.state {
            // The snooze ended the lease at `until - delay` (or just after
            // its grant, for a snooze at the grant's own time).
            TaskState::Backoff { until } => TimeDelta::from_std(delay)
                .ok()
                .and_then(|delay| until.checked_sub_signed(delay))
                .is_some_and(|at| {
                    at == ended
                        || (at == lease.granted_at
                            && ended == lease.granted_at + TimeDelta::milliseconds(1))
                }),
            TaskState::Ready => delay.is_zero() && ended <= now,
            _ => false,
        };
        fits.then_some(attempt.state)
    }

    /// Whether an attempt claimable from `at` could still run: the task
    /// has no deadline, or `at` is before it.
    pub fn can_run_from(&self, at: DateTime<Utc>) -> bool {
        !self.past_deadline(at)
    }

    /// The task's own lease length, or `default` (the store's) without one.
    pub fn lease_duration(&self, default: Duration) -> Duration {
        self.0.lease_duration.unwrap_or(default)
    }

    /// The task's deadline, if it has one.
    pub fn deadline(&self) -> Option<DateTime<Utc>> {
        self.0.deadline
    }

    /// Whether the task's deadline has come at `now`.
    pub fn past_deadline(&self, now: DateTime<Utc>) -> bool {
        self.0.deadline.is_some_and(|deadline| now >= deadline)
    }

    /// Grants a lease on the lowest-numbered claimable attempt: one that is
    /// ready, whose backoff or schedule has ended, or whose lease lapsed (and
    /// whose lapse backoff has passed) with a try left. The new token is the task's
    /// next, and the grant is one of the attempt's tries.
    ///
    /// The lease is granted at `now`, or at the attempt's latest grant if
    /// that was later: a claim whose time reads earlier (a clock behind
    /// another's, or a time read before a wait for the server) still
    /// stamps its lease after the one it follows, so an attempt's leases
    /// start in token order, and the lease runs the task's own lease length
    /// ([`TaskSpec::lease_duration`]), or `lease_duration` without one,
    /// from its grant, ending at the task's deadline at the latest.
    ///
    /// Errors: [`TaskFinished`](LeaseError::TaskFinished) (also at or
    /// past the deadline, which [`expire`](Self::expire) records),
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
        let lease_duration = self.lease_duration(lease_duration);
        let index = self
            .0
            .attempts
            .iter()
            .position(|a| self.claimable_at(a).is_some_and(|at| at <= now))
            .filter(|_| !self.past_deadline(now));
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
        let granted_at = self.0.attempts[index]
            .lease
            .as_ref()
            .map_or(now, |latest| latest.granted_at.max(now));
        if self.past_deadline(granted_at) {
            return Err(LeaseError::TaskFinished);
        }
        let expires_at = time::add(granted_at, lease_duration)?;
        let expires_at = self
            .0
            .deadline
            .map_or(expires_at, |deadline| expires_at.min(deadline));
        let record = LeaseRecord {
            holder: holder.clone(),
            token,
            granted_at,
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
    /// shortens it, and never past the task's deadline. The task's own
    /// lease length ([`TaskSpec::lease_duration`]) replaces `extension`
    /// when it has one. Returns the lease as it now stands (unchanged if the
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
        let extension = self.lease_duration(extension);
        let TaskRecord {
            id,
            attempts,
            last_token,
            deadline,
            ..
        } = &mut self.0;
        let live = live_attempt(attempts, *last_token, holder, token, now)?;
        let candidate = time::add(now, extension)?;
        let candidate = deadline.map_or(candidate, |deadline| candidate.min(deadline));
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
    /// discards it ([`DiscardReason::Failed`]) instead. [`Retry::Snooze`]
    /// gives the lease's try back and makes the attempt claimable after its
    /// delay, on any try. The report's error
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
        if let Retry::After(backoff) | Retry::Snooze(backoff) = failure.retry {
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
            Retry::Snooze(delay) => {
                // The try this lease took is given back, and the lease
                // record says when it ended: a retried snooze knows it by
                // that time plus its delay ([`Task::snoozed`]).
                *live.tries = live.tries.saturating_sub(1);
                live.lease.expires_at = now.max(live.lease.granted_at + TimeDelta::milliseconds(1));
                Some(delay)
            }
            _ if *live.tries >= max_tries => None,
            Retry::After(backoff) => Some(backoff),
            Retry::Backoff => Some(retry_backoff(*live.tries, jitter)),
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

    /// The task's last parent ended as it needed: every attempt still
    /// [`Waiting`](TaskState::Waiting) becomes ready, or scheduled for its
    /// not-before time if that is after `now`. Returns the attempts that
    /// changed (empty: none was waiting, nothing to write).
    #[must_use = "the attempts that changed must be written"]
    pub fn unblock(&mut self, now: DateTime<Utc>) -> Vec<AttemptNumber> {
        let mut changed = Vec::new();
        for attempt in &mut self.0.attempts {
            let TaskState::Waiting { not_before } = attempt.state else {
                continue;
            };
            attempt.state = match not_before {
                Some(at) if at > now => TaskState::Scheduled { at },
                _ => TaskState::Ready,
            };
            changed.push(attempt.number);
        }
        changed
    }

    /// The task has parents that have not ended (an operator retried it
    /// while it waited): every attempt ready, backing off or scheduled
    /// waits for them again, a scheduled one keeping its time. Returns the
    /// attempts that changed.
    #[must_use = "the attempts that changed must be written"]
    pub fn wait_for_parents(&mut self) -> Vec<AttemptNumber> {
        let mut changed = Vec::new();
        for attempt in &mut self.0.attempts {
            let not_before = match attempt.state {
                TaskState::Ready | TaskState::Backoff { .. } => None,
                TaskState::Scheduled { at } => Some(at),
                _ => continue,
            };
            attempt.state = TaskState::Waiting { not_before };
            changed.push(attempt.number);
        }
        changed
    }

    /// A parent the task needed done ended otherwise: every attempt still
    /// [`Waiting`](TaskState::Waiting) is cancelled, its last error
    /// [`PARENT_FAILED`]. Returns the attempts that changed (empty: none
    /// was waiting, nothing to write).
    #[must_use = "the attempts that changed must be written"]
    pub fn cancel_waiting(&mut self) -> Vec<AttemptNumber> {
        let mut changed = Vec::new();
        for attempt in &mut self.0.attempts {
            if let TaskState::Waiting { .. } = attempt.state {
                attempt.state = TaskState::Cancelled;
                attempt.last_error = Some(PARENT_FAILED.to_owned());
                changed.push(attempt.number);
            }
        }
        changed
    }

    /// How the task ended, as a task waiting for it sees it
    /// ([`TaskRecord::end`]).
    pub fn end(&self) -> Option<ParentEnd> {
        self.0.end()
    }

    /// Applies what the passing of time alone changes: a lapsed lease makes
    /// its attempt ready, or puts it in backoff until `expires_at +
    /// lapse_backoff`, or discards it ([`DiscardReason::Lapsed`]) if that
    /// was its last try; an ended backoff or schedule makes its attempt
    /// ready. At or past the task's deadline, every attempt not final
    /// whose lease (if any) has expired is discarded instead
    /// ([`DiscardReason::DeadlineExceeded`]). Returns
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
        let past_deadline = self.past_deadline(now);
        for attempt in &mut self.0.attempts {
            let next = match (attempt.state, &attempt.lease) {
                // A lease never runs past the deadline, so one held then
                // has expired (unless a clock stepped back: it ends when
                // it expires).
                (TaskState::Leased, Some(lease)) if past_deadline && lease.is_expired(now) => {
                    TaskState::Discarded {
                        reason: DiscardReason::DeadlineExceeded,
                    }
                }
                (
                    TaskState::Ready
                    | TaskState::Backoff { .. }
                    | TaskState::Scheduled { .. }
                    | TaskState::Waiting { .. },
                    _,
                ) if past_deadline => TaskState::Discarded {
                    reason: DiscardReason::DeadlineExceeded,
                },
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
            | TaskState::Cancelled
            | TaskState::Waiting { .. } => None,
        }
    }
}

/// The attempt holding a live lease, borrowed for one rule to change.
struct LiveAttempt<'a> {
    number: AttemptNumber,
    tries: &'a mut u32,
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
            tries,
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
mod tests;
