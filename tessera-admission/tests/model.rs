//! Model test: random sequences of offer, try-admit, release, cancel, time
//! and polling against the invariants of the admission controller.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_admission::{
    Admission, AdmissionConfig, Event, Offer, Permit, RejectReason, Rejection, Ticket,
};

/// Tests start at a real instant and move time by hand from there.
#[allow(clippy::disallowed_methods)]
fn start() -> Instant {
    Instant::now()
}

#[derive(Debug, Clone)]
enum Op {
    Offer(u8),
    /// A claim admitted only if it costs no one a wait.
    TryAdmit(u8),
    /// Release the n-th held permit (modulo how many are held).
    Release(usize),
    /// Cancel the n-th ticket ever issued (modulo how many).
    Cancel(usize),
    Advance(Duration),
    /// Pull events until there are none.
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..4).prop_map(Op::Offer),
        2 => (0u8..4).prop_map(Op::TryAdmit),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (0u64..1500).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        3 => Just(Op::Drain),
    ]
}

fn config() -> impl Strategy<Value = AdmissionConfig> {
    (
        1u32..4,
        0u32..4,
        1u32..3,
        1usize..7,
        1u64..5,
        100u64..1000,
        prop_oneof![2 => Just(0u32), 1 => 1u32..4],
    )
        .prop_map(
            |(initial, headroom, min, max_pending, max_wait, target, per_minute)| AdmissionConfig {
                initial_concurrency: initial.max(min),
                max_concurrency: initial.max(min) + headroom,
                min_concurrency: min,
                max_pending,
                max_wait: Duration::from_secs(max_wait),
                target: Duration::from_millis(target),
                claims_per_minute: per_minute,
                ewma_weight: 0.3,
            },
        )
}

struct Model {
    config: AdmissionConfig,
    gate: Admission<u8>,
    now: Instant,
    held: Vec<Permit>,
    issued: Vec<Ticket>,
    /// Tickets not ended as far as the caller has been told: principal and
    /// arrival.
    waiting: BTreeMap<Ticket, (u8, Instant)>,
    ended: HashSet<Ticket>,
    /// `cancel` said the ticket had ended; its event must still come.
    refused: HashSet<Ticket>,
}

impl Model {
    fn check_rejection(&self, rejection: &Rejection) {
        assert_eq!(rejection.status(), 429);
        assert_eq!(rejection.code(), "rate_limited");
        let most = self.config.max_wait.as_secs_f64().ceil().max(1.0);
        let retry = rejection.retry_after().as_secs_f64();
        assert!((1.0..=most).contains(&retry), "{rejection:?}");
    }

    fn check_stats(&self) {
        let stats = self.gate.stats();
        assert!(stats.pending <= self.config.max_pending, "{stats:?}");
        assert!(
            (self.config.min_concurrency..=self.config.max_concurrency).contains(&stats.limit),
            "{stats:?}"
        );
        assert_eq!(stats.in_flight as usize, self.held.len());
    }

    fn end(&mut self, ticket: Ticket) -> (u8, Instant) {
        assert!(self.ended.insert(ticket), "{ticket:?} ended twice");
        self.refused.remove(&ticket);
        self.waiting
            .remove(&ticket)
            .unwrap_or_else(|| panic!("{ticket:?} was not waiting"))
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Offer(principal) => match self.gate.offer(principal, self.now) {
                Offer::Admitted(permit) => {
                    let stats = self.gate.stats();
                    assert_eq!(stats.pending, 0, "admitted past waiters");
                    assert!(stats.in_flight <= stats.limit);
                    self.held.push(permit);
                }
                Offer::Queued(ticket) => {
                    assert!(!self.issued.contains(&ticket));
                    self.issued.push(ticket);
                    self.waiting.insert(ticket, (principal, self.now));
                }
                Offer::Rejected(rejection) => {
                    self.check_rejection(&rejection);
                    match rejection.reason() {
                        RejectReason::QueueFull => {
                            assert_eq!(self.gate.stats().pending, self.config.max_pending)
                        }
                        RejectReason::ClaimsPerMinute => {
                            assert!(self.config.claims_per_minute > 0)
                        }
                        other => panic!("an offer rejected for {other:?}"),
                    }
                }
            },
            Op::TryAdmit(principal) => {
                let before = self.gate.stats();
                match self.gate.try_admit(principal, self.now) {
                    Some(permit) => {
                        let stats = self.gate.stats();
                        assert_eq!(stats.pending, 0, "admitted past waiters");
                        assert!(stats.in_flight <= stats.limit);
                        assert_eq!(stats.in_flight, before.in_flight + 1);
                        self.held.push(permit);
                    }
                    None => {
                        // Declined: no slot taken, no ticket queued (time
                        // moving on may only have ended waiters).
                        let after = self.gate.stats();
                        assert_eq!(after.in_flight, before.in_flight);
                        assert!(after.pending <= before.pending);
                        let blocked = after.pending > 0
                            || after.in_flight >= after.limit
                            || self.config.claims_per_minute > 0;
                        assert!(blocked, "declined with room: {after:?}");
                    }
                }
            }
            Op::Release(n) => {
                if !self.held.is_empty() {
                    let permit = self.held.swap_remove(n % self.held.len());
                    assert!(permit.admitted_at() <= self.now);
                    self.gate.release(permit, self.now);
                }
            }
            Op::Cancel(n) => {
                if !self.issued.is_empty() {
                    let ticket = self.issued[n % self.issued.len()];
                    if self.gate.cancel(ticket) {
                        self.end(ticket);
                    } else if !self.ended.contains(&ticket) {
                        // Its rejection waits to be pulled.
                        self.refused.insert(ticket);
                    }
                }
            }
            Op::Advance(by) => self.now += by,
            Op::Drain => {
                while let Some(event) = self.gate.poll_event(self.now) {
                    self.event(event);
                }
                // Everything pulled: the caller's view and the controller's agree.
                assert!(self.refused.is_empty(), "{:?} never ended", self.refused);
                assert_eq!(self.gate.stats().pending, self.waiting.len());
                assert!(self.gate.poll_timeout().is_none_or(|t| t > self.now));
                let stats = self.gate.stats();
                if stats.pending > 0 {
                    assert!(stats.in_flight >= stats.limit, "idle capacity: {stats:?}");
                }
            }
        }
        self.check_stats();
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Granted {
                ticket,
                permit,
                waited,
            } => {
                let stats = self.gate.stats();
                assert!(
                    stats.in_flight <= stats.limit,
                    "granted at the limit: {stats:?}"
                );
                assert!(
                    !self.refused.contains(&ticket),
                    "granted after cancel refused"
                );
                let (principal, arrived) = self.end(ticket);
                assert!(
                    self.now < arrived + self.config.max_wait,
                    "granted at or after its deadline"
                );
                assert_eq!(waited, self.now - arrived);
                assert_eq!(permit.admitted_at(), self.now);
                // FIFO per principal: no older ticket of the same principal waits.
                let older = self
                    .waiting
                    .iter()
                    .find(|(t, (p, _))| *p == principal && **t < ticket);
                assert!(older.is_none(), "{ticket:?} overtook {older:?}");
                self.held.push(permit);
            }
            Event::Rejected { ticket, rejection } => {
                self.check_rejection(&rejection);
                let (_, arrived) = self.end(ticket);
                match rejection.reason() {
                    RejectReason::WaitExpired => {
                        assert!(self.now >= arrived + self.config.max_wait)
                    }
                    RejectReason::FairShare => {}
                    other => panic!("a waiter rejected for {other:?}"),
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_for_any_sequence(
        config in config(),
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let now = start();
        let mut model = Model {
            gate: Admission::new(config.clone(), now).unwrap(),
            config,
            now,
            held: Vec::new(),
            issued: Vec::new(),
            waiting: BTreeMap::new(),
            ended: HashSet::new(),
            refused: HashSet::new(),
        };
        for op in ops {
            model.step(op);
        }
        // Wind down: every ticket ends exactly once.
        model.step(Op::Drain);
        while !model.held.is_empty() || !model.waiting.is_empty() {
            model.step(Op::Release(0));
            model.step(Op::Advance(Duration::from_millis(100)));
            model.step(Op::Drain);
        }
        prop_assert_eq!(model.ended.len(), model.issued.len());
        prop_assert!(model.gate.poll_timeout().is_none());
    }
}
