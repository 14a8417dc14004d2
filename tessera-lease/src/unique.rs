//! Unique tasks: when an enqueue duplicates a task already there, and what
//! the duplicate does.
//!
//! A backend enforces uniqueness with a unique index, never a lock: each
//! task that carries a [`Uniqueness`] stores its [`UniqueSlot`] while
//! [`Uniqueness::holds`] says it does, and clears it (stores `NULL`) when
//! its attempts leave the counted states. An insert that meets the index is
//! a duplicate; [`decide_duplicate`] says what it does to the task already
//! holding the slot. Within one batch the same holds: the first task of a
//! slot is inserted, the rest are its duplicates.
//!
//! A window makes the slot a period of time as well: with a window of ten
//! minutes, enqueues in the same ten minutes (counted from the Unix epoch,
//! so every process agrees without talking) share one slot, and the first
//! enqueue of the next period starts a new one.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{DurationRule, Field, LeaseError};
use crate::name::UniqueKey;
use crate::state::StateName;
use crate::time::add;

/// The longest uniqueness window or debounce delay: 30 days.
pub const MAX_UNIQUE_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A set of attempt states: while any attempt of a task is in one of them,
/// the task holds its unique slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "Vec<StateName>", from = "Vec<StateName>")]
pub struct UniqueStates(u16);

impl UniqueStates {
    /// No state: the key never blocks anything.
    pub const NONE: Self = Self(0);
    /// Waiting to run: ready, scheduled, backing off before a retry, or
    /// waiting for parents.
    pub const WAITING: Self = Self::NONE
        .with(StateName::Ready)
        .with(StateName::Scheduled)
        .with(StateName::Backoff)
        .with(StateName::Waiting);
    /// Not finished: waiting or leased (the default, "while not done").
    pub const UNFINISHED: Self = Self::WAITING.with(StateName::Leased);
    /// Every state: one task per key (per window) for good.
    pub const ANY: Self = {
        let mut set = Self::NONE;
        let mut i = 0;
        while i < StateName::ALL.len() {
            set = set.with(StateName::ALL[i]);
            i += 1;
        }
        set
    };

    /// This set with `state` added.
    pub const fn with(self, state: StateName) -> Self {
        Self(self.0 | Self::bit(state))
    }

    /// Whether `state` is in the set.
    pub const fn contains(self, state: StateName) -> bool {
        self.0 & Self::bit(state) != 0
    }

    /// The set as a bit mask, one bit per [`StateName::ALL`] position, for a
    /// backend to store in one small column.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// The set a stored bit mask names; bits of no state are dropped.
    pub const fn from_bits(bits: u16) -> Self {
        Self(bits & Self::ANY.0)
    }

    const fn bit(state: StateName) -> u16 {
        1 << state as u16
    }

    /// The states in the set, in [`StateName::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = StateName> {
        StateName::ALL
            .into_iter()
            .filter(move |state| self.contains(*state))
    }
}

impl Default for UniqueStates {
    fn default() -> Self {
        Self::UNFINISHED
    }
}

impl fmt::Debug for UniqueStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl From<UniqueStates> for Vec<StateName> {
    fn from(states: UniqueStates) -> Self {
        states.iter().collect()
    }
}

impl From<Vec<StateName>> for UniqueStates {
    fn from(states: Vec<StateName>) -> Self {
        states.into_iter().fold(Self::NONE, Self::with)
    }
}

/// What an enqueue that duplicates a waiting task does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum UniqueMode {
    /// Leave the existing task as it is (the default).
    #[default]
    Keep,
    /// If the existing task is still waiting, replace its brief and its
    /// not-before time with the duplicate's.
    Replace,
    /// If the existing task is still waiting, replace its brief and push its
    /// not-before time to `delay` after the duplicate, but never past
    /// `max_delay` after the existing task was enqueued: a stream of
    /// duplicates runs the task once it goes quiet, or at the latest then.
    Debounce {
        /// How long after the last duplicate the task runs.
        delay: Duration,
        /// The latest it runs, counted from the first enqueue.
        max_delay: Duration,
    },
}

/// How an enqueue is unique: its key, the window its slot spans, the states
/// in which a duplicate counts, and what a duplicate does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Uniqueness {
    /// The key; unique per queue.
    pub key: UniqueKey,
    /// `None`: the slot is the key alone. `Some(w)`: the slot is the key and
    /// the period of length `w` the enqueue falls in.
    #[serde(default)]
    pub window: Option<Duration>,
    /// While any attempt of the task is in one of these, the task holds
    /// the slot.
    #[serde(default)]
    pub states: UniqueStates,
    /// What a duplicate does to a waiting task.
    #[serde(default)]
    pub mode: UniqueMode,
}

/// The value a backend's unique index holds: the key, and the window's
/// period when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UniqueSlot(String);

impl UniqueSlot {
    /// The slot as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Uniqueness {
    /// Unique by `key` while not done, keeping the existing task.
    pub fn new(key: UniqueKey) -> Self {
        Self {
            key,
            window: None,
            states: UniqueStates::default(),
            mode: UniqueMode::default(),
        }
    }

    /// Checks the window and the debounce delays: each positive and at most
    /// [`MAX_UNIQUE_WINDOW`], and a debounce's delay at most its maximum.
    pub fn validate(&self) -> Result<(), LeaseError> {
        if let Some(window) = self.window {
            check_duration(Field::UniqueWindow, window)?;
        }
        if let UniqueMode::Debounce { delay, max_delay } = self.mode {
            check_duration(Field::Debounce, delay)?;
            check_duration(Field::Debounce, max_delay)?;
            if delay > max_delay {
                return Err(LeaseError::InvalidDuration {
                    field: Field::Debounce,
                    rule: DurationRule::AboveMaxDelay,
                });
            }
        }
        Ok(())
    }

    /// The slot of a task enqueued at `enqueued_at`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tessera_lease::{UniqueKey, Uniqueness};
    /// let mut unique = Uniqueness::new(UniqueKey::parse("report-7")?);
    /// unique.window = Some(Duration::from_secs(600));
    /// let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    /// assert_eq!(unique.slot(at("2026-12-02T10:01:00Z")), unique.slot(at("2026-12-02T10:09:59Z")));
    /// assert_ne!(unique.slot(at("2026-12-02T10:09:59Z")), unique.slot(at("2026-12-02T10:10:00Z")));
    /// # Ok::<(), tessera_lease::LeaseError>(())
    /// ```
    pub fn slot(&self, enqueued_at: DateTime<Utc>) -> UniqueSlot {
        match self.window {
            None => UniqueSlot(self.key.as_str().to_owned()),
            Some(window) => {
                let width = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
                let period = enqueued_at.timestamp_millis().div_euclid(width);
                // '@' never appears in a key, so no two (key, period) pairs
                // share a slot.
                UniqueSlot(format!("{}@{period}", self.key))
            }
        }
    }

    /// When the window of the slot of a task enqueued at `enqueued_at`
    /// ends (`None` without a window): no enqueue after it maps to that
    /// slot, so its row may go.
    pub fn slot_ends_at(&self, enqueued_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let window = self.window?;
        let width = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
        let period = enqueued_at.timestamp_millis().div_euclid(width);
        period
            .checked_add(1)
            .and_then(|next| next.checked_mul(width))
            .and_then(DateTime::from_timestamp_millis)
    }

    /// Whether a task whose attempts are in `states` holds its slot.
    pub fn holds(&self, states: impl IntoIterator<Item = StateName>) -> bool {
        holds(self.states, states)
    }
}

/// Whether a task whose attempts are in `attempt_states` holds a slot kept
/// in `counted`: a backend that stored only the bit mask calls this.
pub fn holds(counted: UniqueStates, attempt_states: impl IntoIterator<Item = StateName>) -> bool {
    attempt_states
        .into_iter()
        .any(|state| counted.contains(state))
}

impl crate::spec::TaskRecord {
    /// Whether this task, holding a unique slot kept in the states `held`
    /// (`None`: it holds none), lets it go now that its attempts are as
    /// recorded: no attempt is left in a state the slot counts.
    pub fn leaves_unique_slot(&self, held: Option<UniqueStates>) -> bool {
        held.is_some_and(|counted| {
            !holds(
                counted,
                self.attempts.iter().map(|attempt| attempt.state.name()),
            )
        })
    }
}

fn check_duration(field: Field, value: Duration) -> Result<(), LeaseError> {
    let rule = if value.is_zero() {
        DurationRule::Zero
    } else if value > MAX_UNIQUE_WINDOW {
        DurationRule::TooLong {
            max_secs: MAX_UNIQUE_WINDOW.as_secs(),
        }
    } else {
        return Ok(());
    };
    Err(LeaseError::InvalidDuration { field, rule })
}

/// The task that holds a slot, as far as a duplicate needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holder {
    /// Every attempt is still waiting (none leased or finished), so its
    /// brief and not-before time may still change.
    pub waiting: bool,
    /// When it was enqueued.
    pub enqueued_at: DateTime<Utc>,
}

/// What a duplicate enqueue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Duplicate {
    /// Nothing: the caller gets the existing task, `created: false`, and
    /// nothing is written.
    Keep,
    /// The existing task takes the duplicate's brief, and this not-before
    /// time (`None`: ready now).
    Replace {
        /// The task's new not-before time.
        not_before: Option<DateTime<Utc>>,
    },
}

/// What a duplicate enqueue asking for `not_before` at `now` does to the
/// `holder` of its slot under `mode`.
///
/// ```
/// use std::time::Duration;
/// use tessera_lease::{Duplicate, Holder, UniqueMode, decide_duplicate};
/// let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
/// let holder = Holder { waiting: true, enqueued_at: at("2026-12-02T10:00:00Z") };
/// let debounce = UniqueMode::Debounce {
///     delay: Duration::from_secs(60),
///     max_delay: Duration::from_secs(300),
/// };
/// // Each duplicate pushes the run a minute past itself ...
/// assert_eq!(
///     decide_duplicate(debounce, holder, None, at("2026-12-02T10:02:00Z")),
///     Duplicate::Replace { not_before: Some(at("2026-12-02T10:03:00Z")) },
/// );
/// // ... but never past five minutes after the first enqueue.
/// assert_eq!(
///     decide_duplicate(debounce, holder, None, at("2026-12-02T10:04:30Z")),
///     Duplicate::Replace { not_before: Some(at("2026-12-02T10:05:00Z")) },
/// );
/// // A holder already leased or finished is never changed.
/// let running = Holder { waiting: false, ..holder };
/// assert_eq!(decide_duplicate(debounce, running, None, at("2026-12-02T10:02:00Z")), Duplicate::Keep);
/// ```
pub fn decide_duplicate(
    mode: UniqueMode,
    holder: Holder,
    not_before: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Duplicate {
    if !holder.waiting {
        return Duplicate::Keep;
    }
    match mode {
        UniqueMode::Keep => Duplicate::Keep,
        UniqueMode::Replace => Duplicate::Replace { not_before },
        UniqueMode::Debounce { delay, max_delay } => {
            let after = |base, by| add(base, by).unwrap_or(DateTime::<Utc>::MAX_UTC);
            let latest = after(holder.enqueued_at, max_delay);
            let wanted = after(not_before.map_or(now, |at| at.max(now)), delay);
            Duplicate::Replace {
                not_before: Some(wanted.min(latest)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn states_round_trip_through_bits_and_serde() {
        for bits in 0..1_u16 << StateName::ALL.len() {
            let states = UniqueStates::from_bits(bits);
            assert_eq!(UniqueStates::from_bits(states.bits()), states);
            let json = serde_json::to_string(&states).unwrap();
            assert_eq!(serde_json::from_str::<UniqueStates>(&json).unwrap(), states);
        }
        assert!(UniqueStates::UNFINISHED.contains(StateName::Leased));
        assert!(!UniqueStates::UNFINISHED.contains(StateName::Done));
        assert!(!UniqueStates::WAITING.contains(StateName::Leased));
        assert_eq!(UniqueStates::ANY.iter().count(), StateName::ALL.len());
    }

    #[test]
    fn a_slot_without_a_window_is_the_key_and_windows_never_collide_with_keys() {
        let unique = Uniqueness::new(UniqueKey::parse("k").unwrap());
        assert_eq!(unique.slot(at("2026-12-02T10:00:00Z")).as_str(), "k");
        let windowed = Uniqueness {
            window: Some(Duration::from_secs(60)),
            ..unique
        };
        assert!(
            windowed
                .slot(at("1969-12-31T23:59:59Z"))
                .as_str()
                .ends_with("@-1")
        );
        assert!(
            windowed
                .slot(at("2026-12-02T10:00:00Z"))
                .as_str()
                .starts_with("k@")
        );
    }

    #[test]
    fn validate_rejects_zero_long_and_inverted_delays() {
        let mut unique = Uniqueness::new(UniqueKey::parse("k").unwrap());
        assert!(unique.validate().is_ok());
        unique.window = Some(Duration::ZERO);
        assert!(unique.validate().is_err());
        unique.window = Some(MAX_UNIQUE_WINDOW + Duration::from_secs(1));
        assert!(unique.validate().is_err());
        unique.window = Some(MAX_UNIQUE_WINDOW);
        assert!(unique.validate().is_ok());
        unique.mode = UniqueMode::Debounce {
            delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(5),
        };
        assert!(unique.validate().is_err());
    }

    #[test]
    fn replace_takes_the_duplicates_not_before_and_keep_changes_nothing() {
        let holder = Holder {
            waiting: true,
            enqueued_at: at("2026-12-02T10:00:00Z"),
        };
        let later = Some(at("2026-12-02T11:00:00Z"));
        let now = at("2026-12-02T10:01:00Z");
        assert_eq!(
            decide_duplicate(UniqueMode::Replace, holder, later, now),
            Duplicate::Replace { not_before: later }
        );
        assert_eq!(
            decide_duplicate(UniqueMode::Keep, holder, later, now),
            Duplicate::Keep
        );
    }
}
