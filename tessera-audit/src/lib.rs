//! Sans-IO audit rules for Tessera: what an audit row may contain, how
//! denied and no-op requests are counted instead of logged, when expired rows
//! are deleted and hidden, when the observational `last_used_at` is written, and
//! how a caller's address is hashed.
//!
//! This crate never reads a clock, sleeps, spawns or does I/O: every call that
//! depends on time takes `now: DateTime<Utc>` from the caller, and every
//! decision is returned as a value for the store to carry out.
//!
//! - [`AuditEvent`]: one redacted row per successful action. Its fields are
//!   identifiers ([`Principal`], [`Namespace`], [`Resource`]), stable names
//!   ([`Action`], [`Outcome`]) and an [`IpHash`]; none can hold a key, a
//!   [`Secret`] or a raw address.
//! - [`CounterBuffer`]: per-minute [`Counter`]s for denied, failed, rate-limited
//!   and empty requests, handed out in [`CounterBatch`]es that are reported
//!   `written` or `failed`, so no count is lost or written twice. Due when a
//!   minute has passed or 1,024 distinct counters wait; `poll_timeout` says
//!   when.
//! - [`RetentionSchedule`]: deletes rows older than [`RETENTION`] at most once
//!   every five minutes (`poll_timeout` says when), in batches of 500, each
//!   table by the threshold its [`RetentionRun`] names; readers filter with
//!   [`visible_since`] so a row awaiting deletion is never shown.
//! - [`ObservationCoalescer`]: `last_used_at` at most once per
//!   [`OBSERVATION_INTERVAL`] per principal, a changed account or kind at once;
//!   each sighting answers an [`Observation`].
//! - [`AddressHasher`]: HMAC-SHA-256 of an address group under a key derived
//!   from a server secret and the UTC day.
//!
//! # Example
//!
//! A store's request path, with time passed in by hand:
//!
//! ```
//! use std::num::NonZeroUsize;
//! use chrono::{TimeDelta, TimeZone, Utc};
//! use tessera_audit::*;
//!
//! let hasher = AddressHasher::new(Secret::new(*b"a server secret of 32 bytes.....")?);
//! let mut counters = CounterBuffer::new();
//! let mut retention = RetentionSchedule::new();
//! let mut observations = ObservationCoalescer::new(NonZeroUsize::new(10_000).unwrap());
//!
//! let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap();
//! let worker = Principal::new("worker-7")?;
//! let main = Namespace::new("main")?;
//!
//! // A successful read: one audit row, and maybe a last_used_at write.
//! let event = AuditEvent::new(now, worker.clone(), main.clone(), Action::ReadReceipt)
//!     .with_resource(Resource::new("run:42")?)
//!     .with_ip_hash(hasher.hash(&[192, 0, 2, 1], now));
//! // First sight: due, so it rides in the read's audit transaction.
//! assert_eq!(observations.observe(&worker, &("acme", "keyed"), now), Observation::Due);
//! observations.written(&worker, now);
//!
//! // An empty claim a second later: counted, and last_used_at is coalesced.
//! let later = now + TimeDelta::seconds(1);
//! counters.increment(CounterKey::new(later, Some(worker.clone()), main, Action::Claim, Outcome::Empty));
//! assert_eq!(observations.observe(&worker, &("acme", "keyed"), later), Observation::Skip);
//!
//! // A minute on, the counter is due; the store writes it and reports back.
//! let next_minute = now + TimeDelta::minutes(1);
//! if let Some(batch) = counters.take_due(next_minute) {
//!     // INSERT ... ON CONFLICT DO UPDATE SET count = count + excluded.count
//!     counters.written(batch);
//! }
//!
//! // Retention runs at most every five minutes; readers hide what it will delete.
//! if let Some(run) = retention.start(next_minute) {
//!     let step = run.after_batch(0); // no expired rows
//!     assert_eq!(step, RetentionStep::Stop);
//! }
//! assert!(is_visible(event.time, next_minute));
//! assert!(!is_visible(event.time, now + TimeDelta::hours(25)));
//! # Ok::<(), tessera_audit::Error>(())
//! ```

#![forbid(unsafe_code)]

mod address;
mod counter;
mod error;
mod event;
mod identifier;
mod observation;
mod retention;
mod secret;

pub use address::{AddressHasher, IpHash};
pub use counter::{Counter, CounterBatch, CounterBuffer, CounterKey, Minute};
pub use error::Error;
pub use event::{Action, AuditEvent, Outcome};
pub use identifier::{Namespace, Principal, Resource};
pub use observation::{OBSERVATION_INTERVAL, Observation, ObservationCoalescer};
pub use retention::{
    RETENTION, RetentionRun, RetentionSchedule, RetentionStep, is_visible, visible_since,
};
pub use secret::Secret;
