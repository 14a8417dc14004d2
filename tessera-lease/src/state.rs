//! Attempt states and their stable storage names.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Field, LeaseError, Rule};

/// The state of one attempt of a task. A task with a single attempt (the
/// default) is in its attempt's state.
///
/// ```text
///            claim                 submit
///  Ready ─────────────▶ Leased ─────────────▶ Done
///    ▲ ▲                 │  │
///    │ │  lease lapses   │  │ fail(Retry::Never)
///    │ └─────────────────┘  └─────────────────▶ Failed
///    │   (or Backoff, if the task has a lapse backoff)
///    │                    fail(Retry::After(d) or Retry::Backoff)
///  Backoff{until} ◀─────── Leased
///    │ until passes: claimable again
///
///  Leased ──▶ Discarded{reason}  its last try lapsed or failed
///                                (tries reached the task's max_tries)
///
///  Scheduled{at} ──▶ (claimable from `at` on, as an ended backoff)
///  any unfinished state ──▶ Cancelled   an operator cancelled the task
/// ```
///
/// Done, Failed, Discarded and Cancelled are final; an operator may put a
/// failed, discarded or cancelled attempt back to ready
/// ([`Task::retry`](crate::Task::retry)). Serialized with a `state` tag in lowercase,
/// e.g. `{"state":"backoff","until":"2026-10-29T12:00:00Z"}`; a store keeps
/// [`TaskState::name`] in a text column and [`TaskState::until`] beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting for a claim.
    Ready,
    /// Held under a lease (which may have lapsed without anyone noticing yet).
    Leased,
    /// A submission was accepted; final.
    Done,
    /// Given up on; final.
    Failed,
    /// Waiting out a retry backoff; claimable from `until` on.
    Backoff {
        /// When the attempt becomes claimable again.
        until: DateTime<Utc>,
    },
    /// Out of tries: its last try lapsed or failed with no try left; final.
    Discarded {
        /// How the last try ended.
        reason: DiscardReason,
    },
    /// Enqueued to run later; claimable from `at` on, ordered by `at` as an
    /// ended backoff is.
    Scheduled {
        /// The task's not-before time.
        at: DateTime<Utc>,
    },
    /// An operator cancelled the task before this attempt finished; final.
    /// A holder of its lease learns it at its next heartbeat, submit or
    /// failure report.
    Cancelled,
    /// Enqueued after other tasks (its parents) and waiting for them to
    /// end: no claim grants it until [`Task::unblock`](crate::Task::unblock)
    /// makes it ready, or scheduled for `not_before` if that is still to
    /// come ([`Waiting`](crate::Waiting) holds the rules of its count of
    /// parents).
    Waiting {
        /// The task's not-before time, kept for when it is unblocked.
        not_before: Option<DateTime<Utc>>,
    },
}

/// How the last try of a [`TaskState::Discarded`] attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscardReason {
    /// Its lease lapsed: the worker went away without a word.
    Lapsed,
    /// Its worker reported a failure and asked for a retry.
    Failed,
    /// The task's deadline passed before the attempt was done
    /// ([`TaskSpec::deadline`](crate::TaskSpec::deadline)).
    #[serde(rename = "deadline_exceeded")]
    DeadlineExceeded,
}

impl DiscardReason {
    /// Every reason.
    pub const ALL: [Self; 3] = [Self::Lapsed, Self::Failed, Self::DeadlineExceeded];

    /// The stable lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lapsed => "lapsed",
            Self::Failed => "failed",
            Self::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

impl FromStr for DiscardReason {
    type Err = LeaseError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == name)
            .ok_or(LeaseError::InvalidInput {
                field: Field::State,
                len: name.len(),
                rule: Rule::Unknown,
            })
    }
}

impl fmt::Display for DiscardReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TaskState {
    /// The stable storage name of this state.
    pub fn name(&self) -> StateName {
        match self {
            Self::Ready => StateName::Ready,
            Self::Leased => StateName::Leased,
            Self::Done => StateName::Done,
            Self::Failed => StateName::Failed,
            Self::Backoff { .. } => StateName::Backoff,
            Self::Discarded { .. } => StateName::Discarded,
            Self::Scheduled { .. } => StateName::Scheduled,
            Self::Cancelled => StateName::Cancelled,
            Self::Waiting { .. } => StateName::Waiting,
        }
    }

    /// The stable storage name as a string.
    pub fn as_str(&self) -> &'static str {
        self.name().as_str()
    }

    /// The end of a backoff, or a scheduled or waiting attempt's
    /// not-before time (the time a store keeps beside the state's name);
    /// `None` for every other state.
    pub fn until(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::Backoff { until } | Self::Scheduled { at: until } => Some(*until),
            Self::Waiting { not_before } => *not_before,
            _ => None,
        }
    }

    /// The reason of a discarded state; `None` for every other state.
    pub fn discard_reason(&self) -> Option<DiscardReason> {
        match self {
            Self::Discarded { reason } => Some(*reason),
            _ => None,
        }
    }

    /// Rebuilds a state from its stored columns. `until` is required for a
    /// backoff or a scheduled attempt, optional for a waiting one and must
    /// be absent otherwise; `reason` is required for a discarded state and
    /// must be absent otherwise.
    pub fn from_parts(
        name: StateName,
        until: Option<DateTime<Utc>>,
        reason: Option<DiscardReason>,
    ) -> Result<Self, LeaseError> {
        let invalid = |reason| Err(LeaseError::InvalidRecord { reason });
        let state = match (name, until, reason) {
            (StateName::Waiting, not_before, None) => Self::Waiting { not_before },
            (StateName::Backoff, Some(until), None) => Self::Backoff { until },
            (StateName::Scheduled, Some(at), None) => Self::Scheduled { at },
            (StateName::Backoff | StateName::Scheduled, None, _) => {
                return invalid("a backoff or scheduled state needs its time");
            }
            (_, Some(_), _) => return invalid("only a backoff or scheduled state has a time"),
            (StateName::Discarded, None, Some(reason)) => Self::Discarded { reason },
            (StateName::Discarded, None, None) => {
                return invalid("a discarded state needs its reason");
            }
            (_, None, Some(_)) => return invalid("only a discarded state has a reason"),
            (StateName::Ready, None, None) => Self::Ready,
            (StateName::Leased, None, None) => Self::Leased,
            (StateName::Done, None, None) => Self::Done,
            (StateName::Failed, None, None) => Self::Failed,
            (StateName::Cancelled, None, None) => Self::Cancelled,
        };
        Ok(state)
    }

    /// Whether the state is final (done, failed, discarded or cancelled).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Done | Self::Failed | Self::Discarded { .. } | Self::Cancelled
        )
    }

    /// Whether an operator's retry puts it back: it ended without success
    /// (failed, discarded or cancelled).
    pub fn is_retryable(&self) -> bool {
        self.is_final() && *self != Self::Done
    }
}

/// The name of a [`TaskState`] without its data, as stored in a text column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateName {
    /// `ready`
    Ready,
    /// `leased`
    Leased,
    /// `done`
    Done,
    /// `failed`
    Failed,
    /// `backoff`
    Backoff,
    /// `discarded`
    Discarded,
    /// `scheduled`
    Scheduled,
    /// `cancelled`
    Cancelled,
    /// `waiting`: for its parents to end.
    Waiting,
}

impl StateName {
    /// Every name, in lifecycle order but for `waiting`, last: stores keep
    /// sets of names as bits in this order, so a new name only ever goes
    /// last.
    pub const ALL: [Self; 9] = [
        Self::Ready,
        Self::Leased,
        Self::Done,
        Self::Failed,
        Self::Backoff,
        Self::Discarded,
        Self::Scheduled,
        Self::Cancelled,
        Self::Waiting,
    ];

    /// The stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Leased => "leased",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Backoff => "backoff",
            Self::Discarded => "discarded",
            Self::Scheduled => "scheduled",
            Self::Cancelled => "cancelled",
            Self::Waiting => "waiting",
        }
    }
}

impl FromStr for StateName {
    type Err = LeaseError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
            .ok_or(LeaseError::InvalidInput {
                field: Field::State,
                len: name.len(),
                rule: Rule::Unknown,
            })
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_strings_and_serde() {
        for name in StateName::ALL {
            assert_eq!(name.as_str().parse::<StateName>().unwrap(), name);
            let json = serde_json::to_string(&name).unwrap();
            assert_eq!(json, format!("\"{}\"", name.as_str()));
        }
        assert!("Ready".parse::<StateName>().is_err());
        assert!("".parse::<StateName>().is_err());
    }

    #[test]
    fn states_rebuild_from_their_columns() {
        let until: DateTime<Utc> = "2026-10-29T12:00:00Z".parse().unwrap();
        let states = [
            TaskState::Ready,
            TaskState::Leased,
            TaskState::Done,
            TaskState::Failed,
            TaskState::Backoff { until },
            TaskState::Discarded {
                reason: DiscardReason::Lapsed,
            },
            TaskState::Discarded {
                reason: DiscardReason::Failed,
            },
            TaskState::Scheduled { at: until },
            TaskState::Cancelled,
            TaskState::Waiting { not_before: None },
            TaskState::Waiting {
                not_before: Some(until),
            },
        ];
        for state in states {
            assert_eq!(
                TaskState::from_parts(state.name(), state.until(), state.discard_reason()),
                Ok(state)
            );
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(serde_json::from_str::<TaskState>(&json).unwrap(), state);
        }
        assert!(TaskState::from_parts(StateName::Backoff, None, None).is_err());
        assert!(TaskState::from_parts(StateName::Ready, Some(until), None).is_err());
        assert!(TaskState::from_parts(StateName::Discarded, None, None).is_err());
        assert!(TaskState::from_parts(StateName::Scheduled, None, None).is_err());
        assert!(TaskState::from_parts(StateName::Cancelled, Some(until), None).is_err());
        let lapsed = Some(DiscardReason::Lapsed);
        assert!(TaskState::from_parts(StateName::Failed, None, lapsed).is_err());
        assert_eq!(
            serde_json::to_string(&states[6]).unwrap(),
            r#"{"state":"discarded","reason":"failed"}"#
        );
        assert_eq!(
            serde_json::to_string(&TaskState::Backoff { until }).unwrap(),
            r#"{"state":"backoff","until":"2026-10-29T12:00:00Z"}"#
        );
    }
}
