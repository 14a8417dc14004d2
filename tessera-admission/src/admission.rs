//! The claim admission controller: an adaptive concurrency window in front of
//! a fair waiting room.

use std::collections::VecDeque;
use std::hash::Hash;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::aimd::Aimd;
use crate::queue::WaitQueue;
use crate::quota::Quota;
use crate::{AdmissionConfig, ConfigError, RejectReason, Rejection, Ticket};

/// Decides which new claims run now, which wait and which are turned away.
///
/// `P` identifies a principal (an API key, an account); waiting principals
/// take turns, and each principal's claims are served oldest first. Only new
/// claims belong here: heartbeats, submissions, reads and recovery bypass it.
///
/// # Driving it
///
/// Inputs are [`offer`](Self::offer), [`release`](Self::release) and
/// [`cancel`](Self::cancel). Grants and the rejection of waiters are outputs,
/// pulled with [`poll_event`](Self::poll_event):
///
/// - A waiter is granted only inside `poll_event(now)`, and only while
///   in-flight is below the limit. `release` frees capacity but grants
///   nothing by itself, so after every input call, drain `poll_event(now)`
///   until it returns `None`.
/// - Waiters past `max_wait` are rejected before anyone is granted at the
///   same `now`, so a waiter is never granted at or after its deadline, even
///   if capacity frees at that very instant.
/// - When nothing else happens, call `poll_event` again at
///   [`poll_timeout`](Self::poll_timeout) (the oldest waiter's deadline).
///   Early or spurious calls are harmless.
///
/// `now` never needs to be exact: an instant earlier than one already seen
/// counts as the latest one seen, so threads that read the clock before
/// taking a shared lock cannot move time backwards.
///
/// Inside, time is whole nanoseconds since the `now` given to
/// [`new`](Self::new): each call turns its `now` into that count at most
/// once (not at all when time has not moved on), and every deadline,
/// interval and service time after that is integer arithmetic. Instants
/// more than about 584 years after `new` count as that horizon.
///
/// # Permits must be released
///
/// A [`Permit`] holds one unit of capacity until it is passed to
/// [`release`](Self::release). Dropping it instead leaks that unit for the
/// life of the controller; hosts should wrap it in a guard that releases on
/// every path.
///
/// # `Retry-After`
///
/// Queue rejections estimate how long the waiting room takes to drain. By
/// Little's law, with the window full, claims finish at about `limit /
/// average service time` a second, so the estimate is
/// `(pending + 1) × average service time / limit` (the target stands in for
/// the average before the first release). A quota rejection uses the time
/// until the principal's allowance has a claim again. Either is clamped to
/// `[1 s, max_wait]` and rounded up to whole seconds.
///
/// # Cost
///
/// Every call is O(1) (one hash lookup of the principal), apart from
/// O(log n) in principals for the legacy quota when it is on. Expiry handles
/// each waiter once, oldest first. Memory is bounded by `max_pending`
/// waiters and their principals.
#[derive(Debug)]
pub struct Admission<P> {
    config: AdmissionConfig,
    aimd: Aimd,
    in_flight: u32,
    queue: WaitQueue<P>,
    quota: Option<Quota<P>>,
    /// Rejections of waiters not yet pulled. Grants are never stored: each is
    /// decided inside `poll_event`, at the `now` it is delivered.
    events: VecDeque<Event>,
    /// The instant the controller's clock counts from: `new`'s `now`.
    origin: Instant,
    /// The latest instant seen.
    latest: Instant,
    /// `latest` in nanoseconds since `origin`.
    latest_nanos: u64,
    /// `config.max_wait` in nanoseconds.
    max_wait: u64,
}

impl<P: Hash + Eq + Clone> Admission<P> {
    /// A controller with the limit at `initial_concurrency`, nobody in flight
    /// and nobody waiting. Fails if `config` does not
    /// [`validate`](AdmissionConfig::validate).
    pub fn new(config: AdmissionConfig, now: Instant) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            aimd: Aimd::new(&config, 0),
            quota: Quota::new(config.claims_per_minute),
            max_wait: nanos(config.max_wait),
            config,
            in_flight: 0,
            queue: WaitQueue::new(),
            events: VecDeque::new(),
            origin: now,
            latest: now,
            latest_nanos: 0,
        })
    }

    /// A new claim of `principal` arrives.
    ///
    /// Admitted at once when in-flight is below the limit and nobody waits;
    /// otherwise queued. Rejected only for overload: the principal's legacy
    /// quota is spent, or the queue is full and no other principal holds more
    /// than its fair share of it.
    ///
    /// When the queue is full and `principal` holds fewer than
    /// `max_pending / waiting principals` (itself counted), the principal
    /// holding the most, which then holds more than that share, gives up its
    /// newest waiter (an [`Event::Rejected`] with
    /// [`RejectReason::FairShare`]) and this claim is queued; the total never
    /// grows. A principal alone may fill every slot.
    pub fn offer(&mut self, principal: P, now: Instant) -> Offer {
        let now = self.advance(now);
        if let Some(quota) = &self.quota {
            if let Err(wait) = quota.check(&principal, now) {
                return Offer::Rejected(Rejection::new(
                    RejectReason::ClaimsPerMinute,
                    wait.min(self.config.max_wait),
                ));
            }
        }
        if self.queue.is_empty() && self.in_flight < self.aimd.limit() {
            if let Some(quota) = &mut self.quota {
                quota.charge(principal, now);
            }
            return Offer::Admitted(self.admit(now));
        }
        if self.queue.len() >= self.config.max_pending {
            if let Err(rejection) = self.make_room_for(&principal) {
                return Offer::Rejected(rejection);
            }
        }
        if let Some(quota) = &mut self.quota {
            quota.charge(principal.clone(), now);
        }
        self.aimd.saturate();
        Offer::Queued(self.queue.push(principal, now))
    }

    /// A claim of `principal` admitted only if [`offer`](Self::offer)
    /// would admit it at once: its quota allows it, nobody waits and
    /// in-flight is below the limit. Admitted, it is exactly that offer
    /// (the quota charged, a slot taken). Otherwise `None`, and nothing
    /// changes: no ticket, no quota charge, no saturation signal, no
    /// eviction. For a claim made only if it costs no one a wait, such as
    /// one a submission carries on its way.
    pub fn try_admit(&mut self, principal: P, now: Instant) -> Option<Permit> {
        let now = self.advance(now);
        if let Some(quota) = &self.quota {
            if quota.check(&principal, now).is_err() {
                return None;
            }
        }
        if !self.queue.is_empty() || self.in_flight >= self.aimd.limit() {
            return None;
        }
        if let Some(quota) = &mut self.quota {
            quota.charge(principal, now);
        }
        Some(self.admit(now))
    }

    /// An admitted claim finished, successfully or not.
    ///
    /// Its service time, from [`Permit::admitted_at`] to `now` (never the
    /// time it waited), feeds the latency average. The freed capacity is
    /// granted by the next [`poll_event`](Self::poll_event).
    pub fn release(&mut self, permit: Permit, now: Instant) {
        let at = self.clock(now);
        let service = if at < u64::MAX {
            at.saturating_sub(permit.admitted) as f64 / NANOS_PER_SECOND
        } else {
            // Past the horizon only the instants still tell the span.
            self.latest
                .saturating_duration_since(permit.admitted_at)
                .as_secs_f64()
        };
        self.aimd.record(service);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.tick(at);
    }

    /// Withdraws a waiting claim whose client left. Returns `false` if the
    /// ticket had already ended: granted, rejected (including a rejection
    /// not yet pulled with [`poll_event`](Self::poll_event)) or cancelled.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        self.queue.remove(ticket).is_some()
    }

    /// The next grant or rejection of a waiter, if any.
    ///
    /// First rejects waiters whose deadline has come, then hands out the
    /// rejections queued so far, then grants the next waiter in turn if
    /// in-flight is below the limit. Call it until it returns `None` after
    /// every input and when [`poll_timeout`](Self::poll_timeout) passes.
    pub fn poll_event(&mut self, now: Instant) -> Option<Event> {
        let now = self.advance(now);
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        if self.in_flight >= self.aimd.limit() {
            return None;
        }
        let (ticket, arrived) = self.queue.pop_next()?;
        Some(Event::Granted {
            ticket,
            permit: self.admit(now),
            waited: Duration::from_nanos(now.saturating_sub(arrived)),
        })
    }

    /// When the oldest waiter's deadline comes, or `None` if nobody waits.
    /// The driver calls [`poll_event`](Self::poll_event) then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (_, arrived) = self.queue.oldest()?;
        self.origin
            .checked_add(Duration::from_nanos(arrived))?
            .checked_add(self.config.max_wait)
    }

    /// The current limit, load and latency average.
    pub fn stats(&self) -> Stats {
        Stats {
            limit: self.aimd.limit(),
            in_flight: self.in_flight,
            pending: self.queue.len(),
            waiting_principals: self.queue.principals(),
            latency_average: self.aimd.average(),
        }
    }

    /// The settings this controller runs with.
    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Moves the clock to `now` unless it is already past it, and returns
    /// the clock in nanoseconds since `origin`. Converts only when time
    /// moved on: an instant comparison is cheaper than a subtraction.
    fn clock(&mut self, now: Instant) -> u64 {
        if now > self.latest {
            self.latest = now;
            self.latest_nanos = nanos(now.saturating_duration_since(self.origin));
        }
        self.latest_nanos
    }

    /// Moves time to `now`: rejects expired waiters and lets the limit
    /// adjust. Returns the clock in nanoseconds.
    fn advance(&mut self, now: Instant) -> u64 {
        let now = self.clock(now);
        self.tick(now);
        now
    }

    /// Rejects waiters whose deadline is at or before `now` (nanoseconds),
    /// forgets spent quotas and lets the limit adjust.
    fn tick(&mut self, now: u64) {
        // Arrival order is deadline order: every waiter has the same max_wait.
        while let Some((ticket, arrived)) = self.queue.oldest() {
            match arrived.checked_add(self.max_wait) {
                Some(deadline) if deadline <= now => {}
                _ => break,
            }
            self.queue.remove(ticket);
            let rejection = self.queue_rejection(RejectReason::WaitExpired);
            self.events.push_back(Event::Rejected { ticket, rejection });
        }
        if let Some(quota) = &mut self.quota {
            quota.forget(now);
        }
        let busy = !self.queue.is_empty() || self.in_flight >= self.aimd.limit();
        self.aimd.tick(now, busy);
    }

    /// A permit admitted at `now`, the clock in nanoseconds.
    fn admit(&mut self, now: u64) -> Permit {
        self.in_flight += 1;
        if self.in_flight >= self.aimd.limit() {
            self.aimd.saturate();
        }
        Permit {
            admitted_at: self.latest,
            admitted: now,
        }
    }

    /// Frees a slot of a full queue for `principal` if it holds less than its
    /// fair share, or says why not.
    fn make_room_for(&mut self, principal: &P) -> Result<(), Rejection> {
        let held = self.queue.held_by(principal) as u128;
        let principals = (self.queue.principals() + usize::from(held == 0)) as u128;
        let slots = self.config.max_pending as u128;
        // `held < slots / principals`, without rounding.
        if held * principals < slots {
            if let Some((newest, most)) = self.queue.largest() {
                if most as u128 * principals > slots {
                    self.queue.remove(newest);
                    let rejection = self.queue_rejection(RejectReason::FairShare);
                    self.events.push_back(Event::Rejected {
                        ticket: newest,
                        rejection,
                    });
                    return Ok(());
                }
            }
        }
        Err(self.queue_rejection(RejectReason::QueueFull))
    }

    /// A rejection whose `Retry-After` is the time the queue takes to drain.
    fn queue_rejection(&self, reason: RejectReason) -> Rejection {
        // Little's law: claims finish at about limit / average service time.
        let seconds = (self.queue.len() as f64 + 1.0) * self.aimd.service_estimate()
            / f64::from(self.aimd.limit());
        let drain = Duration::try_from_secs_f64(seconds).unwrap_or(self.config.max_wait);
        Rejection::new(reason, drain.min(self.config.max_wait))
    }
}

const NANOS_PER_SECOND: f64 = 1e9;

/// `duration` in whole nanoseconds, saturating at `u64::MAX` (about 584
/// years): the unit of the controller's clock.
pub(crate) fn nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}

/// One unit of admitted capacity; pass it to [`Admission::release`] when the
/// claim finishes.
///
/// Not `Clone`: each permit is released once. Dropping it without releasing
/// leaks its capacity (see [`Admission`]).
#[derive(Debug)]
#[must_use = "a permit holds capacity until it is passed to Admission::release"]
pub struct Permit {
    admitted_at: Instant,
    /// `admitted_at` on the controller's clock, in nanoseconds.
    admitted: u64,
}

impl Permit {
    /// When the claim was admitted or granted: the start of its service
    /// time.
    pub fn admitted_at(&self) -> Instant {
        self.admitted_at
    }
}

/// What became of an [`Admission::offer`].
#[derive(Debug)]
#[must_use]
pub enum Offer {
    /// Run the claim now; release the permit when it finishes. The wait was
    /// zero.
    Admitted(Permit),
    /// The claim waits; its grant or rejection comes from
    /// [`Admission::poll_event`].
    Queued(Ticket),
    /// Answer `429 rate_limited` now.
    Rejected(Rejection),
}

/// An outcome for a waiting claim, pulled with [`Admission::poll_event`].
#[derive(Debug)]
#[must_use]
pub enum Event {
    /// The claim may run now.
    Granted {
        /// The waiting claim.
        ticket: Ticket,
        /// Its capacity; release it when the claim finishes.
        permit: Permit,
        /// How long it waited (`X-Claim-Wait-Ms`).
        waited: Duration,
    },
    /// The claim is turned away: `429 rate_limited`.
    Rejected {
        /// The waiting claim.
        ticket: Ticket,
        /// Why, and when to retry.
        rejection: Rejection,
    },
}

impl Event {
    /// The claim this event ends.
    pub fn ticket(&self) -> Ticket {
        match self {
            Self::Granted { ticket, .. } | Self::Rejected { ticket, .. } => *ticket,
        }
    }
}

/// A snapshot of an [`Admission`] controller, for metrics and the
/// `X-Claim-Concurrency` header (`limit`).
///
/// Serialized, `latency_average` is seconds as a number, or null.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stats {
    /// The current concurrency limit.
    pub limit: u32,
    /// Claims admitted or granted and not yet released. May exceed `limit`
    /// right after a decrease: admitted work is never cancelled.
    pub in_flight: u32,
    /// Claims waiting.
    pub pending: usize,
    /// Principals with at least one claim waiting.
    pub waiting_principals: usize,
    /// The exponentially weighted average service time; `None` before the
    /// first release.
    #[serde(with = "crate::seconds::optional_number")]
    pub latency_average: Option<Duration>,
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start at a real instant, then move time by hand
mod tests {
    use super::*;

    fn gate(config: AdmissionConfig) -> (Admission<u32>, Instant) {
        let now = Instant::now();
        (Admission::new(config, now).unwrap(), now)
    }

    #[test]
    fn retry_after_follows_the_drain_estimate_and_is_capped() {
        let (mut gate, now) = gate(AdmissionConfig {
            initial_concurrency: 2,
            max_pending: 100,
            ..AdmissionConfig::default()
        });
        let permit = match gate.offer(0, now) {
            Offer::Admitted(permit) => permit,
            other => panic!("{other:?}"),
        };
        gate.release(permit, now + Duration::from_millis(100));
        // 0.1 s average, limit 2: 20 claims a second.
        for _ in 0..59 {
            let _ = gate.offer(1, now);
        }
        assert_eq!(
            gate.queue_rejection(RejectReason::QueueFull).retry_after(),
            Duration::from_secs(3),
            "57 waiting + 1 at 20/s"
        );
        for _ in 0..100 {
            let _ = gate.offer(1, now);
        }
        assert_eq!(
            gate.queue_rejection(RejectReason::QueueFull).retry_after(),
            Duration::from_secs(6)
        );
        gate.aimd.record(100.0);
        assert_eq!(
            gate.queue_rejection(RejectReason::QueueFull).retry_after(),
            Duration::from_secs(10),
            "capped at max_wait"
        );
    }

    #[test]
    fn the_clock_counts_whole_nanoseconds_and_saturates_at_its_horizon() {
        assert_eq!(nanos(Duration::ZERO), 0);
        assert_eq!(nanos(Duration::new(1, 500)), 1_000_000_500);
        assert_eq!(
            nanos(Duration::from_secs(u64::MAX / 1_000_000_000)),
            18_446_744_073_000_000_000
        );
        assert_eq!(
            nanos(Duration::from_secs(u64::MAX / 1_000_000_000 + 1)),
            u64::MAX
        );
        assert_eq!(nanos(Duration::MAX), u64::MAX);
    }

    #[test]
    fn an_earlier_instant_changes_nothing_and_a_later_one_moves_the_clock() {
        let (mut gate, now) = gate(AdmissionConfig::default());
        let later = now + Duration::from_millis(1500);
        assert_eq!(gate.clock(later), 1_500_000_000);
        assert_eq!(gate.clock(now), 1_500_000_000);
        assert_eq!(gate.clock(later + Duration::from_nanos(1)), 1_500_000_001);
    }

    #[test]
    fn time_never_moves_backwards() {
        let (mut gate, now) = gate(AdmissionConfig {
            initial_concurrency: 1,
            ..AdmissionConfig::default()
        });
        let _held = gate.offer(0, now);
        let later = now + Duration::from_secs(1);
        let ticket = match gate.offer(1, later) {
            Offer::Queued(ticket) => ticket,
            other => panic!("{other:?}"),
        };
        let _ = gate.offer(2, now);
        // The stale instant counts as `later`: both share one deadline order.
        assert_eq!(gate.poll_timeout(), Some(later + Duration::from_secs(10)));
        assert!(gate.cancel(ticket));
        assert_eq!(gate.poll_timeout(), Some(later + Duration::from_secs(10)));
    }
}
