//! Sans-IO admission rules for Tessera: which new claims run now, which wait
//! their turn and which are turned away with `429 rate_limited`; what
//! `Retry-After` an empty claim answers; and how many anonymous sessions may
//! be minted, per hour and per address.
//!
//! A service that hands out work meets bursts: many workers claim at once.
//! Rather than rejecting a burst because it crossed a per-minute quota,
//! [`Admission`] keeps an adaptive concurrency window. Claims beyond it wait
//! in a bounded queue where principals take turns; the window shrinks when the
//! average service time of admitted claims rises above a target and grows
//! again while healthy work fills it. Only overload turns claims away.
//!
//! # Sans-IO
//!
//! Nothing in this crate reads a clock, sleeps, spawns or does I/O: all time
//! is external input (`now: Instant`, or `now: DateTime<Utc>` for the rules
//! that count UTC hours and days), and outputs are pulled. The host
//! decides how to share a controller or a policy (each is `&mut self` and
//! `Send`): behind a mutex in a thread-per-request server, in one task of an
//! async one.
//!
//! ```text
//!          offer(principal, now)
//!                  │
//!    ┌─────────────┼───────────────────┐
//!    ▼             ▼                   ▼
//! Admitted      Queued(ticket)      Rejected ─► 429, Retry-After
//! (permit)         │
//!    │             └─ poll_event(now) ─► Granted { ticket, permit, waited }
//!    │                                └► Rejected { ticket, rejection }
//!    ▼
//! release(permit, now) ─► service time ─► average ─► limit, once per target
//! ```
//!
//! # The driver loop
//!
//! ```
//! use std::collections::HashMap;
//! use std::time::{Duration, Instant};
//!
//! use tessera_admission::{Admission, AdmissionConfig, Event, Offer, Permit};
//!
//! // Hosts read the clock; the controller only ever receives instants.
//! let start = Instant::now();
//! let config = AdmissionConfig { initial_concurrency: 2, ..AdmissionConfig::default() };
//! let mut gate = Admission::new(config, start)?;
//!
//! // Five claims arrive at once: two run, three wait.
//! let mut running: Vec<(&str, Permit)> = Vec::new();
//! let mut parked = HashMap::new();
//! for (n, worker) in ["a", "a", "a", "a", "b"].into_iter().enumerate() {
//!     match gate.offer(worker, start) {
//!         Offer::Admitted(permit) => running.push((worker, permit)),
//!         Offer::Queued(ticket) => { parked.insert(ticket, (n, worker)); }
//!         Offer::Rejected(rejection) => panic!("429 after {:?}", rejection.retry_after()),
//!     }
//! }
//! assert_eq!((running.len(), parked.len()), (2, 3));
//!
//! // Each claim's transaction takes 20 ms; jump from one instant to the next.
//! let mut now = start;
//! let mut served = Vec::new();
//! while !running.is_empty() {
//!     now += Duration::from_millis(20);
//!     for (_, permit) in running.drain(..) {
//!         gate.release(permit, now);
//!     }
//!     // After every input, drain the events.
//!     while let Some(event) = gate.poll_event(now) {
//!         match event {
//!             Event::Granted { ticket, permit, waited } => {
//!                 let (n, worker) = parked.remove(&ticket).unwrap();
//!                 served.push((n, waited.as_millis()));
//!                 running.push((worker, permit));
//!             }
//!             Event::Rejected { ticket, rejection } => {
//!                 parked.remove(&ticket);
//!                 assert_eq!(rejection.status(), 429);
//!             }
//!         }
//!     }
//!     // With nothing running, sleep until `gate.poll_timeout()` (a deadline).
//! }
//! // Principals take turns: "b" went ahead of the fourth claim of "a".
//! assert_eq!(served, [(2, 20), (4, 20), (3, 40)]);
//! assert_eq!(gate.stats().latency_average, Some(Duration::from_millis(20)));
//! # Ok::<(), tessera_admission::ConfigError>(())
//! ```
//!
//! # Behaviour
//!
//! - **Admission**: at once while in-flight is below the limit and nobody
//!   waits; otherwise queued, at most `max_pending` claims in all.
//! - **Fair waiting**: principals with waiters take turns round-robin; each
//!   principal's claims are served oldest first. When the queue is full, a
//!   principal holding fewer than its share (`max_pending / waiting
//!   principals`) takes the newest slot of the principal holding the most
//!   ([`RejectReason::FairShare`]). A principal alone may fill every slot.
//! - **Deadlines**: a claim waiting `max_wait` is rejected
//!   ([`RejectReason::WaitExpired`]) and never granted afterwards.
//! - **Adaptive limit**: [`Admission::release`] measures service time from
//!   admission to release, excluding the wait, into an exponentially weighted
//!   average. At most once per `target`: above the target, the limit drops to
//!   70% (floored, never below `min_concurrency`); at or under it, and if
//!   demand reached the limit during the interval, it rises by one (never
//!   above `max_concurrency`). An interval with no release changes nothing.
//!   Admitted claims always finish normally.
//! - **Rejections**: [`Rejection`] is `429 rate_limited` with a reason and a
//!   `Retry-After` of at least a second. Clients should honour it and add
//!   jitter.
//! - **Legacy quota**: `claims_per_minute` per principal, off by default.
//!
//! Admission state is per process by design: it protects one store and is
//! not a global quota. Restarting resets it; leases are unaffected.
//!
//! # Cost
//!
//! Every call of the controller is O(1) in principals and waiters (O(log n)
//! for the legacy quota when on): per-principal FIFO lists, a rotation list,
//! count buckets to find the largest holder, and one arrival-ordered list
//! that is also deadline order, all linked through slabs with exact removal.
//!
//! # Policies beside the controller
//!
//! Two smaller rules share the same contract (time is an argument, state is
//! bounded memory, every call O(log n) at most):
//!
//! - [`IdlePacing`]: the `Retry-After` of an empty claim. It doubles from 5 s
//!   to 60 s ([`IDLE_HINTS`]) while the same key keeps finding the same queue
//!   empty, and starts again at 5 s when the key is granted a lease or the
//!   queue receives an enqueue. A hint, never a limit.
//! - [`MintAllowance`]: anonymous sessions. A global hourly allowance of
//!   which a tenth is available at once and the rest accrues evenly, and an
//!   hourly limit per [`AddressGroup`]: an IPv6 caller is grouped by its /64,
//!   an IPv4-mapped address by its IPv4 address, so rotating addresses inside
//!   one prefix gains nothing. A refusal carries its `Retry-After`.
//!
//! ```
//! use std::net::IpAddr;
//! use std::time::{Duration, Instant};
//!
//! use tessera_admission::{AddressGroup, IdleConfig, IdlePacing, MintAllowance, MintConfig};
//!
//! let now = Instant::now(); // the host's clock reading, passed in
//! let mut idle = IdlePacing::new(IdleConfig::default())?;
//! assert_eq!(idle.empty(&"key-1", &"jobs", now), Duration::from_secs(5));
//! assert_eq!(idle.empty(&"key-1", &"jobs", now), Duration::from_secs(10));
//!
//! let mut mint = MintAllowance::new(MintConfig::default())?;
//! let caller: IpAddr = "2001:db8:1:2::7".parse().unwrap();
//! assert!(mint.check(AddressGroup::from(caller), now).is_allowed());
//! # Ok::<(), tessera_admission::ConfigError>(())
//! ```
//!
//! Three pure rules complete the set, each time-as-an-argument with the
//! wall clock (`now: DateTime<Utc>`), since what they count is persisted or
//! resets at UTC boundaries:
//!
//! - [`AddressWindow`]: the durable per-address mint limit's fixed UTC hour;
//!   it decides from the count a store keeps for the window.
//! - [`DailyRowAllowance`]: a configured number of rows written per UTC day
//!   (0: off), reset at [`next_utc_midnight`].
//! - [`retry_after_seconds`]: a wait as a `Retry-After` value, in whole
//!   seconds, rounded up, at least 1.
//!
//! Every setting is checked when a controller or policy is built; a bad one
//! is a [`ConfigError`] naming it, the crate's one error type.

mod address;
mod admission;
mod aimd;
mod config;
mod daily;
mod error;
mod idle;
mod mint;
mod queue;
mod quota;
mod rejection;
mod seconds;

// The public surface, in full.

// The claim admission controller and its inputs and outputs.
pub use admission::{Admission, Event, Offer, Permit, Stats};
pub use config::AdmissionConfig;
pub use queue::Ticket;
pub use rejection::{RejectReason, Rejection};

// Idle pacing hints.
pub use idle::{IDLE_HINTS, IdleConfig, IdlePacing};

// The anonymous session mint allowance and address grouping.
pub use address::AddressGroup;
pub use mint::{AddressWindow, MintAllowance, MintConfig, MintDecision, MintRefusal};

// The daily rows-written allowance and the midnight it resets at.
pub use daily::{DailyRowAllowance, next_utc_midnight};

// The rounding of every `Retry-After`.
pub use seconds::retry_after_seconds;

// The one error type.
pub use error::ConfigError;
