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
///    │                    fail(Retry::After(d))
///  Backoff{until} ◀─────── Leased
///    │ until passes: claimable again
/// ```
///
/// Done and Failed are final. Serialized with a `state` tag in lowercase,
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
        }
    }

    /// The stable storage name as a string.
    pub fn as_str(&self) -> &'static str {
        self.name().as_str()
    }

    /// The end of a backoff; `None` for every other state.
    pub fn until(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::Backoff { until } => Some(*until),
            _ => None,
        }
    }

    /// Rebuilds a state from its stored columns. `until` is required for a
    /// backoff and must be absent otherwise.
    pub fn from_parts(name: StateName, until: Option<DateTime<Utc>>) -> Result<Self, LeaseError> {
        let state = match (name, until) {
            (StateName::Backoff, Some(until)) => Self::Backoff { until },
            (StateName::Backoff, None) => {
                return Err(LeaseError::InvalidRecord {
                    reason: "a backoff state needs its end time",
                });
            }
            (_, Some(_)) => {
                return Err(LeaseError::InvalidRecord {
                    reason: "only a backoff state has an end time",
                });
            }
            (StateName::Ready, None) => Self::Ready,
            (StateName::Leased, None) => Self::Leased,
            (StateName::Done, None) => Self::Done,
            (StateName::Failed, None) => Self::Failed,
        };
        Ok(state)
    }

    /// Whether the state is final (done or failed).
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Done | Self::Failed)
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
}

impl StateName {
    /// Every name, in lifecycle order.
    pub const ALL: [Self; 5] = [
        Self::Ready,
        Self::Leased,
        Self::Done,
        Self::Failed,
        Self::Backoff,
    ];

    /// The stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Leased => "leased",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Backoff => "backoff",
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
        ];
        for state in states {
            assert_eq!(
                TaskState::from_parts(state.name(), state.until()),
                Ok(state)
            );
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(serde_json::from_str::<TaskState>(&json).unwrap(), state);
        }
        assert!(TaskState::from_parts(StateName::Backoff, None).is_err());
        assert!(TaskState::from_parts(StateName::Ready, Some(until)).is_err());
        assert_eq!(
            serde_json::to_string(&TaskState::Backoff { until }).unwrap(),
            r#"{"state":"backoff","until":"2026-10-29T12:00:00Z"}"#
        );
    }
}
