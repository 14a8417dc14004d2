//! The admission fuzzing harness: a small operation language decoded from a
//! stream of choices, and a checker that drives [`Admission`] with it and
//! asserts the controller's invariants after every step.
//!
//! The fuzz target in `fuzz/` includes this file and feeds the choices from
//! libFuzzer's bytes through `arbitrary`; the proptest at the bottom feeds
//! random ones, so the decoder and the checker also run in the normal test
//! suite. Where `model.rs` checks the rules one step at a time, this checker
//! also keeps a mirror of the waiting room (arrival order, the rotation of
//! principals, the rejections not yet pulled) and predicts every grant and
//! every rejection exactly. Only a fair-share eviction between principals
//! holding equally many waiters leaves the victim open; predictions then
//! pause until the queue is empty again.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tessera_admission::{
    Admission, AdmissionConfig, Event, Offer, Permit, RejectReason, Rejection, Ticket,
};

/// Operations in one scenario at most, so every input stays quick.
const MAX_OPS: usize = 1_000;

/// Where a scenario's choices come from.
pub(crate) trait Choices {
    /// A number in `0..=max`; 0 once the input has run out.
    fn pick(&mut self, max: u32) -> u32;
    /// Whether another operation follows.
    fn more(&mut self) -> bool;
}

/// Settings and a sequence of operations.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) config: AdmissionConfig,
    pub(crate) ops: Vec<Op>,
}

/// One input to the controller, or to the clock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Offer(u8),
    /// Release the n-th held permit (modulo how many are held).
    Release(u8),
    /// Cancel the n-th newest ticket ever issued (modulo how many).
    Cancel(u8),
    Advance(Duration),
    /// Jump to `poll_timeout`, as a driver's timer would.
    Timeout,
    /// Pull events until there are none.
    Drain,
}

/// Time steps: small ones, the defaults' interval and deadline, and long
/// ones that expire every waiter.
const STEPS_MS: [u64; 8] = [1, 10, 50, 100, 250, 500, 1_000, 3_000];

impl Scenario {
    /// Small settings and up to six principals, so that limits, full queues
    /// and deadlines are reached within a few operations. The settings are
    /// always valid.
    pub(crate) fn decode(choices: &mut impl Choices) -> Self {
        let min = 1 + choices.pick(2);
        let initial = min + choices.pick(3);
        let config = AdmissionConfig {
            initial_concurrency: initial,
            max_concurrency: initial + choices.pick(3),
            min_concurrency: min,
            max_pending: 1 + choices.pick(7) as usize,
            max_wait: Duration::from_millis(250 * (1 + u64::from(choices.pick(15)))),
            target: Duration::from_millis(100 * (1 + u64::from(choices.pick(9)))),
            claims_per_minute: match choices.pick(2) {
                0 => 1 + choices.pick(3),
                _ => 0,
            },
            ewma_weight: [0.2, 0.5, 1.0][choices.pick(2) as usize],
        };
        let principals = 1 + choices.pick(5) as u8;
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && choices.more() {
            ops.push(match choices.pick(15) {
                0..=4 => Op::Offer(choices.pick(u32::from(principals) - 1) as u8),
                5..=7 => Op::Release(choices.pick(255) as u8),
                8 => Op::Cancel(choices.pick(255) as u8),
                9..=10 => Op::Advance(Duration::from_millis(
                    STEPS_MS[choices.pick(STEPS_MS.len() as u32 - 1) as usize],
                )),
                11 => Op::Timeout,
                _ => Op::Drain,
            });
        }
        Self { config, ops }
    }
}

/// Runs `scenario`, then winds down until every ticket has ended; panics on
/// the first broken invariant.
pub(crate) fn run(scenario: &Scenario) {
    let mut checker = Checker::new(scenario.config.clone());
    for &op in &scenario.ops {
        checker.step(op);
    }
    checker.step(Op::Drain);
    while !checker.held.is_empty() || !checker.waiting.is_empty() {
        while !checker.held.is_empty() {
            checker.step(Op::Release(0));
        }
        checker.step(Op::Advance(Duration::from_millis(100)));
        checker.step(Op::Drain);
    }
    assert_eq!(
        checker.ended.len(),
        checker.issued.len(),
        "a ticket never ended"
    );
    assert_eq!(checker.gate.poll_timeout(), None);
    let stats = checker.gate.stats();
    assert_eq!((stats.in_flight, stats.pending), (0, 0), "{stats:?}");
}

/// The controller's waiting room as it must be, while it is known.
#[derive(Default)]
struct Mirror {
    known: bool,
    queue: BTreeMap<Ticket, (u8, Instant)>,
    /// Principals with waiters, next to be served first.
    rotation: VecDeque<u8>,
    /// Rejections of waiters the controller holds until they are pulled.
    expected: VecDeque<Expected>,
}

enum Expected {
    Expired(Ticket),
    /// The newest waiter of one of the principals holding the most.
    Evicted(Vec<Ticket>),
}

impl Mirror {
    fn held_by(&self, principal: u8) -> usize {
        self.queue.values().filter(|(p, _)| *p == principal).count()
    }

    fn push(&mut self, ticket: Ticket, principal: u8, now: Instant) {
        if self.held_by(principal) == 0 {
            self.rotation.push_back(principal);
        }
        self.queue.insert(ticket, (principal, now));
    }

    fn remove(&mut self, ticket: Ticket) {
        let (principal, _) = self.queue.remove(&ticket).expect("mirrored ticket");
        if self.held_by(principal) == 0 {
            self.rotation.retain(|&p| p != principal);
        }
    }

    /// Rejects waiters whose deadline has come, oldest first.
    fn expire(&mut self, now: Instant, max_wait: Duration) {
        while let Some((&ticket, &(_, arrived))) = self.queue.first_key_value() {
            if arrived + max_wait > now {
                break;
            }
            self.remove(ticket);
            self.expected.push_back(Expected::Expired(ticket));
        }
    }

    /// The waiters of which one must make room for `principal` at a full
    /// queue, or `None` if it holds its fair share already.
    fn eviction(&self, principal: u8, max_pending: usize) -> Option<Vec<Ticket>> {
        let held = self.held_by(principal);
        let principals = self.rotation.len() + usize::from(held == 0);
        if held * principals >= max_pending {
            return None;
        }
        let most = self.rotation.iter().map(|&p| self.held_by(p)).max()?;
        if most * principals <= max_pending {
            return None;
        }
        let newest = self.rotation.iter().filter(|&&p| self.held_by(p) == most);
        let newest = newest.map(|&p| {
            let of_p = self.queue.iter().filter(|(_, (q, _))| *q == p);
            *of_p.map(|(t, _)| t).max().expect("a holder holds a ticket")
        });
        Some(newest.collect())
    }

    /// The grant `poll_event` must make next.
    fn next_grant(&self) -> Option<Ticket> {
        let principal = *self.rotation.front()?;
        let (&ticket, _) = self.queue.iter().find(|(_, (p, _))| *p == principal)?;
        Some(ticket)
    }

    fn forget(&mut self) {
        *self = Self::default();
    }
}

struct Checker {
    config: AdmissionConfig,
    gate: Admission<u8>,
    now: Instant,
    held: Vec<Permit>,
    issued: Vec<Ticket>,
    /// The caller's view: tickets not ended, with principal and arrival.
    waiting: BTreeMap<Ticket, (u8, Instant)>,
    ended: HashSet<Ticket>,
    /// `cancel` said these had ended; their events must still come.
    refused: HashSet<Ticket>,
    mirror: Mirror,
    limit: u32,
    /// When the limit last changed (or the start).
    changed: Instant,
}

impl Checker {
    fn new(config: AdmissionConfig) -> Self {
        // The harness starts at a real instant and moves time by hand.
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        Self {
            gate: Admission::new(config.clone(), now).expect("decoded settings are valid"),
            limit: config.initial_concurrency,
            config,
            now,
            held: Vec::new(),
            issued: Vec::new(),
            waiting: BTreeMap::new(),
            ended: HashSet::new(),
            refused: HashSet::new(),
            mirror: Mirror {
                known: true,
                ..Mirror::default()
            },
            changed: now,
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Offer(principal) => self.offer(principal),
            Op::Release(n) => {
                if !self.held.is_empty() {
                    let permit = self.held.swap_remove(usize::from(n) % self.held.len());
                    assert!(permit.admitted_at() <= self.now);
                    self.expire();
                    self.gate.release(permit, self.now);
                }
            }
            Op::Cancel(n) => self.cancel(n),
            Op::Advance(by) => self.now += by,
            Op::Timeout => {
                if let Some(deadline) = self.gate.poll_timeout() {
                    self.now = self.now.max(deadline);
                }
            }
            Op::Drain => self.drain(),
        }
        self.check_stats();
    }

    /// Mirrors the expiry every advancing call starts with.
    fn expire(&mut self) {
        if self.mirror.known {
            self.mirror.expire(self.now, self.config.max_wait);
        }
    }

    fn offer(&mut self, principal: u8) {
        let in_flight = self.held.len() as u32;
        self.expire();
        let offer = self.gate.offer(principal, self.now);
        let stats = self.gate.stats();
        // The limit may have moved on entry, never after the decision.
        let admissible = self.mirror.queue.is_empty() && in_flight < stats.limit;
        let full = self.mirror.queue.len() >= self.config.max_pending;
        match offer {
            Offer::Admitted(permit) => {
                assert_eq!(stats.pending, 0, "admitted past waiters");
                assert!(in_flight < stats.limit, "admitted at the limit: {stats:?}");
                assert!(!self.mirror.known || admissible);
                assert_eq!(permit.admitted_at(), self.now);
                self.held.push(permit);
            }
            Offer::Queued(ticket) => {
                assert!(self.issued.last().is_none_or(|last| *last < ticket));
                self.issued.push(ticket);
                self.waiting.insert(ticket, (principal, self.now));
                if self.mirror.known {
                    assert!(!admissible, "queued with room to admit: {stats:?}");
                    if full {
                        let victims = self
                            .mirror
                            .eviction(principal, self.config.max_pending)
                            .expect("queued at a full queue without a fair-share eviction");
                        if let [victim] = victims[..] {
                            self.mirror.remove(victim);
                            self.mirror.expected.push_back(Expected::Evicted(victims));
                        } else {
                            self.mirror.forget();
                        }
                    }
                }
                if self.mirror.known {
                    self.mirror.push(ticket, principal, self.now);
                }
            }
            Offer::Rejected(rejection) => {
                self.check_rejection(&rejection);
                match rejection.reason() {
                    RejectReason::QueueFull => {
                        assert_eq!(stats.pending, self.config.max_pending);
                        if self.mirror.known {
                            assert!(full && !admissible);
                            let eviction = self.mirror.eviction(principal, self.config.max_pending);
                            assert_eq!(eviction, None, "rejected instead of a fair-share eviction");
                        }
                    }
                    RejectReason::ClaimsPerMinute => assert!(self.config.claims_per_minute > 0),
                    other => panic!("an offer rejected for {other:?}"),
                }
            }
        }
    }

    fn cancel(&mut self, n: u8) {
        if self.issued.is_empty() {
            return;
        }
        let ticket = self.issued[self.issued.len() - 1 - usize::from(n) % self.issued.len()];
        let cancelled = self.gate.cancel(ticket);
        if self.mirror.known {
            assert_eq!(cancelled, self.mirror.queue.contains_key(&ticket));
        }
        if cancelled {
            assert!(
                !self.refused.contains(&ticket),
                "cancelled after cancel refused"
            );
            self.end(ticket);
            if self.mirror.known {
                self.mirror.remove(ticket);
            }
        } else if !self.ended.contains(&ticket) {
            // Its rejection waits to be pulled.
            self.refused.insert(ticket);
        }
    }

    fn drain(&mut self) {
        loop {
            let in_flight = self.held.len() as u32;
            self.expire();
            let Some(event) = self.gate.poll_event(self.now) else {
                let stats = self.gate.stats();
                if self.mirror.known {
                    assert!(
                        self.mirror.expected.is_empty(),
                        "an expected rejection never came"
                    );
                    assert!(self.mirror.queue.is_empty() || in_flight >= stats.limit);
                }
                break;
            };
            match event {
                Event::Granted {
                    ticket,
                    permit,
                    waited,
                } => self.granted(ticket, permit, waited, in_flight),
                Event::Rejected { ticket, rejection } => self.rejected(ticket, rejection),
            }
        }
        // Everything pulled: the caller's view and the controller's agree.
        assert!(self.refused.is_empty(), "{:?} never ended", self.refused);
        let stats = self.gate.stats();
        assert_eq!(stats.pending, self.waiting.len());
        let principals: BTreeSet<u8> = self.waiting.values().map(|(p, _)| *p).collect();
        assert_eq!(stats.waiting_principals, principals.len());
        assert!(self.gate.poll_timeout().is_none_or(|t| t > self.now));
        if stats.pending > 0 {
            assert!(stats.in_flight >= stats.limit, "idle capacity: {stats:?}");
        }
        if self.mirror.known {
            assert!(self.mirror.queue.keys().eq(self.waiting.keys()));
        } else if self.waiting.is_empty() {
            // An empty waiting room is known again.
            self.mirror.known = true;
        }
    }

    fn granted(&mut self, ticket: Ticket, permit: Permit, waited: Duration, in_flight: u32) {
        let stats = self.gate.stats();
        assert!(in_flight < stats.limit, "granted at the limit: {stats:?}");
        assert_eq!(stats.in_flight, in_flight + 1);
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
        if self.mirror.known {
            assert!(
                self.mirror.expected.is_empty(),
                "granted before a rejection"
            );
            assert_eq!(Some(ticket), self.mirror.next_grant(), "out of turn");
            self.mirror.rotation.rotate_left(1);
            self.mirror.remove(ticket);
        }
        self.held.push(permit);
    }

    fn rejected(&mut self, ticket: Ticket, rejection: Rejection) {
        self.check_rejection(&rejection);
        let (_, arrived) = self.end(ticket);
        match rejection.reason() {
            RejectReason::WaitExpired => {
                assert!(self.now >= arrived + self.config.max_wait, "expired early")
            }
            RejectReason::FairShare => {}
            other => panic!("a waiter rejected for {other:?}"),
        }
        if self.mirror.known {
            match self.mirror.expected.pop_front() {
                Some(Expected::Expired(expired)) => {
                    assert_eq!(
                        (ticket, rejection.reason()),
                        (expired, RejectReason::WaitExpired)
                    )
                }
                Some(Expected::Evicted(victims)) => {
                    assert_eq!(rejection.reason(), RejectReason::FairShare);
                    assert!(
                        victims.contains(&ticket),
                        "evicted {ticket:?}, not {victims:?}"
                    );
                }
                None => panic!("unexpected rejection of {ticket:?}: {rejection}"),
            }
        }
    }

    fn end(&mut self, ticket: Ticket) -> (u8, Instant) {
        assert!(self.ended.insert(ticket), "{ticket:?} ended twice");
        self.refused.remove(&ticket);
        self.waiting
            .remove(&ticket)
            .unwrap_or_else(|| panic!("{ticket:?} was not waiting"))
    }

    fn check_rejection(&self, rejection: &Rejection) {
        assert_eq!(
            (rejection.status(), rejection.code()),
            (429, "rate_limited")
        );
        let most = self.config.max_wait.as_secs_f64().ceil().max(1.0);
        let retry = rejection.retry_after().as_secs_f64();
        assert!((1.0..=most).contains(&retry), "{rejection:?}");
    }

    /// Bounds after every step, and the limit's steps: at most one per
    /// target interval, down to 70% only above the target, up by one only
    /// at or under it.
    fn check_stats(&mut self) {
        let stats = self.gate.stats();
        let config = &self.config;
        assert!(stats.pending <= config.max_pending, "{stats:?}");
        assert!(
            (config.min_concurrency..=config.max_concurrency).contains(&stats.limit),
            "{stats:?}"
        );
        assert_eq!(stats.in_flight as usize, self.held.len());
        if stats.limit == self.limit {
            return;
        }
        assert!(
            self.now - self.changed >= config.target,
            "the limit moved twice in one interval"
        );
        let average = stats
            .latency_average
            .expect("the limit moves only after a release");
        // The controller compares seconds as f64; allow its rounding.
        let slack = Duration::from_micros(1);
        if stats.limit < self.limit {
            assert_eq!(
                stats.limit,
                (self.limit * 7 / 10).max(config.min_concurrency)
            );
            assert!(average + slack > config.target, "decreased at {average:?}");
        } else {
            assert_eq!(stats.limit, self.limit + 1);
            assert!(average <= config.target + slack, "increased at {average:?}");
        }
        self.limit = stats.limit;
        self.changed = self.now;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Choices from a list of random numbers, as the fuzzer's would come
    /// from its bytes; proptest shrinks a failure to fewer, smaller ones.
    struct Numbers {
        values: Vec<u32>,
        next: usize,
    }

    impl Choices for Numbers {
        fn pick(&mut self, max: u32) -> u32 {
            let value = self.values.get(self.next).copied().unwrap_or(0);
            self.next += 1;
            (u64::from(value) % (u64::from(max) + 1)) as u32
        }

        fn more(&mut self) -> bool {
            self.next < self.values.len()
        }
    }

    fn scenario(values: Vec<u32>) -> Scenario {
        Scenario::decode(&mut Numbers { values, next: 0 })
    }

    #[test]
    fn an_empty_input_is_the_smallest_valid_scenario() {
        let empty = scenario(Vec::new());
        assert!(empty.ops.is_empty());
        assert_eq!(empty.config.initial_concurrency, 1);
        assert_eq!(empty.config.claims_per_minute, 1);
        empty.config.validate().unwrap();
        run(&empty);
    }

    /// Always the largest choice, for a while.
    struct Largest(usize);

    impl Choices for Largest {
        fn pick(&mut self, max: u32) -> u32 {
            max
        }

        fn more(&mut self) -> bool {
            self.0 = self.0.saturating_sub(1);
            self.0 > 0
        }
    }

    #[test]
    fn the_largest_choices_decode_to_valid_settings() {
        let largest = Scenario::decode(&mut Largest(10));
        largest.config.validate().unwrap();
        assert_eq!(largest.config.max_concurrency, 9);
        assert_eq!(largest.config.max_pending, 8);
        assert_eq!(largest.config.max_wait, Duration::from_secs(4));
        assert_eq!(largest.ops.len(), 9);
        run(&largest);
    }

    proptest! {
        // Cheap cases: each is a few hundred operations on a tiny queue.
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn every_invariant_holds_for_any_choices(
            values in proptest::collection::vec(any::<u32>(), 0..600),
        ) {
            run(&scenario(values));
        }
    }
}
