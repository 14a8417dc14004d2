//! Chaos runs for Tessera: worker processes claim, heartbeat, submit and
//! fail under faults drawn from a seed, every operation is recorded, and
//! [`tessera_check`] proves the history.
//!
//! The scenarios themselves are this crate's tests (`tests/chaos/`); the
//! crate holds what they share:
//! - [`Recorder`]: each process appends its records to a file of its own,
//!   one JSON line per invocation and completion, written through at once
//!   so a SIGKILL loses nothing recorded; [`read_history`] merges the
//!   files of a run.
//! - [`monotonic_nanos`]: the machine's monotonic clock, one for every
//!   process, which orders the history; [`SkewedClock`]: a store clock
//!   some milliseconds off the system's, for clock skew between processes.
//! - [`TcpProxy`]: a proxy between the store and PostgreSQL that a run
//!   cuts or stalls and restores.
//! - [`Rng`]: the seeded source of every random choice, so a failing run
//!   reruns from its seed.
//!
//! # Example
//!
//! A process records a claim it made; the run reads the files back and
//! checks them.
//!
//! ```
//! use chrono::Utc;
//! use tessera_chaos::{Recorder, read_history};
//! use tessera_check::{Completion, FinalState, History, Operation, Outcome, check};
//!
//! let dir = tempfile::tempdir()?;
//! let recorder = Recorder::open(dir.path(), 1)?;
//! let claim = recorder.invoke(Utc::now(), Operation::Claim { queue: "frames".into() })?;
//! recorder.complete(claim, Utc::now(), Completion::Ok { outcome: Outcome::Empty })?;
//!
//! let history = History::from_records(read_history(dir.path())?)?;
//! let report = check(&history, &FinalState::default());
//! assert!(report.is_valid());
//! assert_eq!(report.operations, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod clock;
mod proxy;
mod recorder;
mod rng;

pub use clock::{SkewedClock, monotonic_nanos, pause};
pub use proxy::{Link, TcpProxy};
pub use recorder::{ReadError, Recorder, read_history};
pub use rng::Rng;
