//! The claim admission controller through its public API, with time driven by
//! hand.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tessera_admission::{
    Admission, AdmissionConfig, Event, Offer, Permit, RejectReason, Rejection, Ticket,
};

/// Tests start at a real instant and move time by hand from there.
#[allow(clippy::disallowed_methods)]
fn start() -> Instant {
    Instant::now()
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn gate(config: AdmissionConfig) -> (Admission<&'static str>, Instant) {
    let t0 = start();
    (Admission::new(config, t0).unwrap(), t0)
}

fn config(initial: u32, max_pending: usize) -> AdmissionConfig {
    AdmissionConfig {
        initial_concurrency: initial,
        max_pending,
        ..AdmissionConfig::default()
    }
}

#[track_caller]
fn admitted(offer: Offer) -> Permit {
    match offer {
        Offer::Admitted(permit) => permit,
        other => panic!("expected admission, got {other:?}"),
    }
}

#[track_caller]
fn queued(offer: Offer) -> Ticket {
    match offer {
        Offer::Queued(ticket) => ticket,
        other => panic!("expected queueing, got {other:?}"),
    }
}

#[track_caller]
fn rejected(offer: Offer) -> Rejection {
    match offer {
        Offer::Rejected(rejection) => rejection,
        other => panic!("expected rejection, got {other:?}"),
    }
}

#[track_caller]
fn granted(event: Option<Event>) -> (Ticket, Permit, Duration) {
    match event {
        Some(Event::Granted {
            ticket,
            permit,
            waited,
        }) => (ticket, permit, waited),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[track_caller]
fn rejected_event(event: Option<Event>) -> (Ticket, Rejection) {
    match event {
        Some(Event::Rejected { ticket, rejection }) => (ticket, rejection),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// A small discrete-event simulation: every admitted or granted claim runs
/// for `service`, and time jumps to the next release.
struct Simulation {
    gate: Admission<&'static str>,
    now: Instant,
    running: VecDeque<(Instant, Permit)>,
    waiting: usize,
    granted: usize,
    rejected: usize,
}

impl Simulation {
    fn new(config: AdmissionConfig) -> Self {
        let (gate, now) = gate(config);
        Self {
            gate,
            now,
            running: VecDeque::new(),
            waiting: 0,
            granted: 0,
            rejected: 0,
        }
    }

    fn offer(&mut self, principal: &'static str, service: Duration) {
        match self.gate.offer(principal, self.now) {
            Offer::Admitted(permit) => {
                self.granted += 1;
                self.running.push_back((self.now + service, permit));
            }
            Offer::Queued(_) => self.waiting += 1,
            Offer::Rejected(_) => self.rejected += 1,
        }
        self.drain(service);
    }

    fn drain(&mut self, service: Duration) {
        while let Some(event) = self.gate.poll_event(self.now) {
            self.waiting -= 1;
            match event {
                Event::Granted { permit, .. } => {
                    self.granted += 1;
                    self.running.push_back((self.now + service, permit));
                }
                Event::Rejected { .. } => self.rejected += 1,
            }
        }
    }

    /// Releases everything due by `until`, in order, granting as it goes.
    fn run_until(&mut self, until: Instant, service: Duration) {
        while let Some(&(due, _)) = self.running.front() {
            if due > until {
                break;
            }
            let (due, permit) = self.running.pop_front().unwrap();
            self.now = self.now.max(due);
            self.gate.release(permit, self.now);
            self.drain(service);
        }
        self.now = self.now.max(until);
        self.drain(service);
    }
}

#[test]
fn healthy_traffic_beyond_sixty_a_minute_is_never_rejected() {
    let mut sim = Simulation::new(AdmissionConfig::default());
    let t0 = sim.now;
    // A burst of 500 claims at once, then 10 a second for two minutes, from
    // one key: 1,700 claims, each taking 50 ms.
    for _ in 0..500 {
        sim.offer("worker", ms(50));
    }
    for tick in 1..=1200 {
        sim.run_until(t0 + ms(100 * tick), ms(50));
        sim.offer("worker", ms(50));
    }
    sim.run_until(t0 + Duration::from_secs(200), ms(50));
    assert_eq!(sim.rejected, 0);
    assert_eq!(sim.granted, 1700);
    assert_eq!(sim.gate.stats().in_flight, 0);
}

#[test]
fn fair_waiting_grants_a_light_principal_within_the_next_two_grants() {
    let (mut gate, t0) = gate(config(1, 2048));
    let mut permit = admitted(gate.offer("heavy", t0));
    for _ in 0..500 {
        queued(gate.offer("heavy", t0));
    }
    let light = queued(gate.offer("light", t0 + ms(1)));
    let mut grants = Vec::new();
    for step in 1..=2 {
        let now = t0 + ms(10 * step);
        gate.release(permit, now);
        let (ticket, next, _) = granted(gate.poll_event(now));
        assert!(
            gate.poll_event(now).is_none(),
            "limit 1: one grant per release"
        );
        grants.push(ticket);
        permit = next;
    }
    assert!(grants.contains(&light), "{grants:?} lacks {light:?}");
}

#[test]
fn fifo_within_a_principal() {
    let (mut gate, t0) = gate(config(1, 2048));
    let mut permit = admitted(gate.offer("a", t0));
    let tickets: Vec<_> = (0..5).map(|_| queued(gate.offer("a", t0))).collect();
    for (step, expected) in tickets.iter().enumerate() {
        let now = t0 + ms(step as u64 + 1);
        gate.release(permit, now);
        let (ticket, next, _) = granted(gate.poll_event(now));
        assert_eq!(ticket, *expected);
        permit = next;
    }
}

#[test]
fn cancellation_removes_a_waiter_and_ends_its_ticket_once() {
    let (mut gate, t0) = gate(config(1, 2048));
    let permit = admitted(gate.offer("a", t0));
    let first = queued(gate.offer("a", t0));
    let second = queued(gate.offer("b", t0));
    assert!(gate.cancel(first));
    assert!(!gate.cancel(first), "already cancelled");
    assert_eq!(gate.stats().pending, 1);
    assert_eq!(gate.stats().waiting_principals, 1);

    gate.release(permit, t0 + ms(5));
    let (ticket, permit, _) = granted(gate.poll_event(t0 + ms(5)));
    assert_eq!(ticket, second, "the cancelled claim is skipped");
    assert!(!gate.cancel(second), "already granted");
    assert!(gate.poll_event(t0 + ms(5)).is_none());

    // A rejection not yet pulled has ended the ticket too.
    let third = queued(gate.offer("c", t0 + ms(5)));
    let deadline = gate.poll_timeout().unwrap();
    gate.release(permit, deadline);
    assert!(!gate.cancel(third), "expired at the release");
    let (ticket, rejection) = rejected_event(gate.poll_event(deadline));
    assert_eq!(
        (ticket, rejection.reason()),
        (third, RejectReason::WaitExpired)
    );
    assert!(gate.poll_event(deadline).is_none());
}

#[test]
fn queue_bound_rejects_beyond_max_pending() {
    let (mut gate, t0) = gate(config(1, 3));
    let _permit = admitted(gate.offer("a", t0));
    for _ in 0..3 {
        queued(gate.offer("a", t0));
    }
    let rejection = rejected(gate.offer("a", t0));
    assert_eq!(rejection.reason(), RejectReason::QueueFull);
    assert_eq!(rejection.status(), 429);
    assert_eq!(rejection.code(), "rate_limited");
    assert!(rejection.retry_after() >= Duration::from_secs(1));
    assert!(rejection.retry_after() <= Duration::from_secs(10));
    assert_eq!(gate.stats().pending, 3);
    assert!(gate.poll_event(t0).is_none());
}

#[test]
fn expiry_rejects_at_the_deadline_and_never_grants_afterwards() {
    let (mut gate, t0) = gate(config(1, 2048));
    let permit = admitted(gate.offer("a", t0));
    let early = queued(gate.offer("b", t0));
    let late = queued(gate.offer("c", t0 + ms(1)));
    let deadline = t0 + Duration::from_secs(10);
    assert_eq!(gate.poll_timeout(), Some(deadline));

    // Just before the deadline nothing happens.
    assert!(gate.poll_event(deadline - ms(1)).is_none());
    // Capacity frees at the very instant of the deadline: the expired waiter
    // is rejected, the next one is granted.
    gate.release(permit, deadline);
    let (ticket, rejection) = rejected_event(gate.poll_event(deadline));
    assert_eq!(ticket, early);
    assert_eq!(rejection.reason(), RejectReason::WaitExpired);
    assert!(rejection.retry_after() >= Duration::from_secs(1));
    let (ticket, permit, waited) = granted(gate.poll_event(deadline));
    assert_eq!(ticket, late);
    assert_eq!(waited, Duration::from_secs(10) - ms(1));
    assert!(gate.poll_event(deadline).is_none());
    assert_eq!(gate.poll_timeout(), None);
    assert!(!gate.cancel(early));

    // A waiter whose deadline passed while nobody polled is still never
    // granted, however late the capacity comes.
    let stale = queued(gate.offer("d", deadline));
    gate.release(permit, deadline + Duration::from_secs(60));
    let (ticket, _) = rejected_event(gate.poll_event(deadline + Duration::from_secs(60)));
    assert_eq!(ticket, stale);
    assert!(
        gate.poll_event(deadline + Duration::from_secs(60))
            .is_none()
    );
    assert_eq!(gate.stats().in_flight, 0);
}

#[test]
fn release_grants_nothing_until_poll_event() {
    let (mut gate, t0) = gate(config(1, 2048));
    let permit = admitted(gate.offer("a", t0));
    let ticket = queued(gate.offer("b", t0));
    gate.release(permit, t0 + ms(3));
    assert_eq!(gate.stats().in_flight, 0);
    assert_eq!(gate.stats().pending, 1);
    let (granted_ticket, _permit, waited) = granted(gate.poll_event(t0 + ms(3)));
    assert_eq!((granted_ticket, waited), (ticket, ms(3)));
    assert_eq!(gate.stats().in_flight, 1);
}

#[test]
fn service_time_excludes_the_wait() {
    let (mut gate, t0) = gate(config(1, 2048));
    let first = admitted(gate.offer("a", t0));
    queued(gate.offer("a", t0));
    gate.release(first, t0 + Duration::from_secs(5));
    let (_, second, waited) = granted(gate.poll_event(t0 + Duration::from_secs(5)));
    assert_eq!(waited, Duration::from_secs(5));
    assert_eq!(second.admitted_at(), t0 + Duration::from_secs(5));
    gate.release(second, t0 + Duration::from_secs(10));
    // Both samples were 5 s of service; the wait never entered the average.
    assert_eq!(gate.stats().latency_average, Some(Duration::from_secs(5)));
}

#[test]
fn latency_reduction_takes_one_step_per_interval() {
    let (mut gate, t0) = gate(config(32, 2048));
    let mut permits: Vec<_> = (0..32).map(|_| admitted(gate.offer("a", t0))).collect();
    // Slow claims: 1 s of service against a 0.5 s target.
    let t1 = t0 + Duration::from_secs(1);
    for _ in 0..10 {
        gate.release(permits.pop().unwrap(), t1);
    }
    assert_eq!(gate.stats().limit, 22, "32 × 0.7, once");
    gate.release(permits.pop().unwrap(), t1 + ms(499));
    assert_eq!(gate.stats().limit, 22, "still inside the interval");
    gate.release(permits.pop().unwrap(), t1 + ms(500));
    assert_eq!(gate.stats().limit, 15, "22 × 0.7 in the next interval");
    // Admitted work was never cancelled: the rest are still in flight.
    assert_eq!(gate.stats().in_flight, 20);
    assert_eq!(permits.len(), 20);
    // With in-flight above the limit nobody new is admitted.
    queued(gate.offer("b", t1 + ms(500)));
    assert!(gate.poll_event(t1 + ms(500)).is_none());
}

#[test]
fn recovery_healthy_saturated_work_climbs_back() {
    let mut sim = Simulation::new(AdmissionConfig {
        initial_concurrency: 12,
        max_concurrency: 16,
        ..AdmissionConfig::default()
    });
    let t0 = sim.now;
    // Slow work drags the limit down.
    let slow = Duration::from_secs(2);
    for _ in 0..40 {
        sim.offer("a", slow);
    }
    sim.run_until(t0 + Duration::from_secs(6), slow);
    assert!(sim.gate.stats().limit < 12);
    sim.run_until(t0 + Duration::from_secs(60), slow);
    assert_eq!(sim.gate.stats().in_flight, 0);
    // Some of the slow burst waited past max_wait; from here on nothing may.
    sim.rejected = 0;

    // Healthy work fast enough to keep up, one claim at a time: once the
    // average has caught up with it, the limit does not move.
    let healthy = ms(10);
    let t1 = sim.now;
    let mut low = 0;
    for step in 1..=100 {
        sim.offer("b", healthy);
        sim.run_until(t1 + ms(50 * step), healthy);
        if step == 20 {
            low = sim.gate.stats().limit;
            assert!(sim.gate.stats().latency_average < Some(ms(500)));
        }
    }
    assert!(low < 12);
    assert_eq!(
        sim.gate.stats().limit,
        low,
        "healthy, unsaturated: unchanged"
    );

    // Healthy and saturated: a standing queue. One step per interval.
    let t2 = sim.now;
    let mut limits = vec![sim.gate.stats().limit];
    for step in 1..=40 {
        while sim.gate.stats().pending < 50 {
            sim.offer("c", healthy);
        }
        sim.run_until(t2 + ms(250 * step), healthy);
        limits.push(sim.gate.stats().limit);
    }
    assert!(
        limits.windows(2).all(|w| w[1] >= w[0] && w[1] - w[0] <= 1),
        "{limits:?}"
    );
    assert_eq!(
        *limits.last().unwrap(),
        16,
        "climbs back, capped at the maximum"
    );
    assert_eq!(sim.rejected, 0);
}

#[test]
fn legacy_quota_is_off_by_default() {
    let (mut gate, t0) = gate(config(1, 2048));
    assert_eq!(gate.config().claims_per_minute, 0);
    let mut permit = admitted(gate.offer("a", t0));
    for n in 1..=200 {
        let now = t0 + ms(n * 10);
        gate.release(permit, now);
        permit = admitted(gate.offer("a", now));
    }
}

#[test]
fn legacy_quota_rejects_a_principal_beyond_its_claims_per_minute() {
    let (mut gate, t0) = gate(AdmissionConfig {
        claims_per_minute: 60,
        ..config(32, 2048)
    });
    for n in 0..60 {
        match gate.offer("a", t0) {
            Offer::Admitted(_) if n < 32 => {}
            Offer::Queued(_) if n >= 32 => {}
            other => panic!("claim {n}: {other:?}"),
        }
    }
    let rejection = rejected(gate.offer("a", t0));
    assert_eq!(rejection.reason(), RejectReason::ClaimsPerMinute);
    assert_eq!(rejection.retry_after(), Duration::from_secs(1));
    assert_eq!(rejection.status(), 429);
    assert_eq!(
        gate.stats().pending,
        28,
        "the rejected claim was not queued"
    );
    // Per principal: others are unaffected.
    queued(gate.offer("b", t0));
    // One more claim a second afterwards.
    assert!(!matches!(
        gate.offer("a", t0 + Duration::from_secs(1)),
        Offer::Rejected(_)
    ));
    assert_eq!(
        rejected(gate.offer("a", t0 + Duration::from_secs(1))).reason(),
        RejectReason::ClaimsPerMinute
    );
}

#[test]
fn fair_share_evicts_the_newest_waiter_of_the_largest_holder() {
    let (mut gate, t0) = gate(config(1, 4));
    let _permit = admitted(gate.offer("x", t0));
    let heavy: Vec<_> = (0..4).map(|_| queued(gate.offer("heavy", t0))).collect();
    assert_eq!(gate.stats().pending, 4);

    // "light" holds 0 of its share of 4 / 2 = 2: heavy's newest gives way.
    let light1 = queued(gate.offer("light", t0));
    let (ticket, rejection) = rejected_event(gate.poll_event(t0));
    assert_eq!(ticket, heavy[3]);
    assert_eq!(rejection.reason(), RejectReason::FairShare);
    assert_eq!(
        rejection.reason().to_string(),
        "fair share of waiting slots"
    );
    assert_eq!(rejection.status(), 429);
    assert!(!gate.cancel(heavy[3]));

    // Holding 1 of 2, again below its share.
    let light2 = queued(gate.offer("light", t0));
    let (ticket, _) = rejected_event(gate.poll_event(t0));
    assert_eq!(ticket, heavy[2]);

    // Holding its share (2 of 4 with 2 principals): no further eviction.
    let rejection = rejected(gate.offer("light", t0));
    assert_eq!(rejection.reason(), RejectReason::QueueFull);
    // Neither may "heavy", at its share, take anything back.
    assert_eq!(
        rejected(gate.offer("heavy", t0)).reason(),
        RejectReason::QueueFull
    );
    assert!(gate.poll_event(t0).is_none());
    let stats = gate.stats();
    assert_eq!((stats.pending, stats.waiting_principals), (4, 2));
    for ticket in [heavy[0], heavy[1], light1, light2] {
        assert!(gate.cancel(ticket), "{ticket:?} still waits");
    }
}

#[test]
fn a_lone_principal_may_fill_every_slot() {
    let (mut gate, t0) = gate(config(1, 5));
    let _permit = admitted(gate.offer("solo", t0));
    let tickets: Vec<_> = (0..5).map(|_| queued(gate.offer("solo", t0))).collect();
    assert_eq!(
        rejected(gate.offer("solo", t0)).reason(),
        RejectReason::QueueFull
    );
    assert!(
        gate.poll_event(t0).is_none(),
        "it evicts nobody, itself included"
    );
    assert_eq!(gate.stats().pending, 5);
    // The moment someone else arrives, the lone principal shares.
    queued(gate.offer("other", t0));
    let (ticket, _) = rejected_event(gate.poll_event(t0));
    assert_eq!(ticket, tickets[4]);
    assert_eq!(gate.stats().pending, 5);
}

#[test]
fn an_overflowing_drain_estimate_gives_the_longest_retry_after() {
    // No practical wait bound, and one claim that ran for 2^63 s: the drain
    // estimate overflows a `Duration` and falls back to `max_wait`.
    let now = start();
    let span = Duration::from_secs(1 << 62);
    let (Some(early), Some(late)) = (now.checked_sub(span), now.checked_add(span)) else {
        return; // this platform's `Instant` cannot span 2^63 s
    };
    let config = AdmissionConfig {
        initial_concurrency: 1,
        max_pending: 1,
        max_wait: Duration::MAX,
        ..AdmissionConfig::default()
    };
    let mut gate = Admission::new(config, early).unwrap();
    let permit = admitted(gate.offer("a", early));
    gate.release(permit, late);
    let _running = admitted(gate.offer("a", late));
    let _waiting = queued(gate.offer("b", late));
    let rejection = rejected(gate.offer("b", late));
    assert_eq!(rejection.reason(), RejectReason::QueueFull);
    // Rounding up must saturate, not wrap around to a one-second hint.
    assert_eq!(rejection.retry_after_seconds(), u64::MAX);
    assert_eq!(
        gate.stats().latency_average,
        Some(Duration::from_secs(1 << 63))
    );
}

#[test]
fn poll_timeout_names_the_oldest_deadline() {
    let (mut gate, t0) = gate(AdmissionConfig {
        max_wait: Duration::from_secs(3),
        ..config(1, 2048)
    });
    assert_eq!(gate.poll_timeout(), None);
    let _permit = admitted(gate.offer("a", t0));
    let first = queued(gate.offer("a", t0 + ms(100)));
    queued(gate.offer("b", t0 + ms(200)));
    assert_eq!(gate.poll_timeout(), Some(t0 + ms(3100)));
    assert!(gate.cancel(first));
    assert_eq!(gate.poll_timeout(), Some(t0 + ms(3200)));
    // Spurious and early calls are harmless.
    assert!(gate.poll_event(t0 + ms(300)).is_none());
    assert_eq!(gate.stats().pending, 1);
}

#[test]
fn stats_report_limit_load_and_average() {
    let (mut gate, t0) = gate(config(2, 2048));
    let stats = gate.stats();
    assert_eq!(
        (
            stats.limit,
            stats.in_flight,
            stats.pending,
            stats.latency_average
        ),
        (2, 0, 0, None)
    );
    let a = admitted(gate.offer("a", t0));
    let _b = admitted(gate.offer("b", t0));
    queued(gate.offer("c", t0));
    queued(gate.offer("c", t0));
    queued(gate.offer("d", t0));
    gate.release(a, t0 + ms(40));
    let stats = gate.stats();
    assert_eq!(stats.in_flight, 1);
    assert_eq!(stats.pending, 3);
    assert_eq!(stats.waiting_principals, 2);
    assert_eq!(stats.latency_average, Some(ms(40)));
    let json = serde_json::to_value(stats).unwrap();
    assert_eq!(json["latency_average"], 0.04);
    assert_eq!(
        serde_json::from_value::<tessera_admission::Stats>(json).unwrap(),
        stats
    );
}

#[test]
fn tickets_order_by_arrival() {
    let (mut gate, t0) = gate(config(1, 2048));
    let _permit = admitted(gate.offer("a", t0));
    let first = queued(gate.offer("b", t0));
    let second = queued(gate.offer("a", t0));
    assert!(first < second);
    assert!(first.sequence() < second.sequence());
}
