//! The data operations take and return, shared by every layer above.

pub(crate) mod access;
pub(crate) mod ack;
pub(crate) mod audit;
pub(crate) mod bulk;
pub(crate) mod claim;
pub(crate) mod health;
pub(crate) mod queue;
#[cfg(feature = "schedule")]
pub(crate) mod schedule;
pub(crate) mod session;
pub(crate) mod task;
pub(crate) mod wait;

/// The two dot-separated numbers of a listing's cursor (`what` names it in
/// the `400` for text no listing gave).
pub(crate) fn cursor_parts<A: std::str::FromStr, B: std::str::FromStr>(
    text: &str,
    what: &str,
) -> Result<(A, B), crate::error::Error> {
    let invalid = || crate::error::Error::InvalidInput {
        reason: format!("{what} {text:?} is not one a listing gave"),
    };
    let (a, b) = text.split_once('.').ok_or_else(invalid)?;
    Ok((
        a.parse().map_err(|_| invalid())?,
        b.parse().map_err(|_| invalid())?,
    ))
}

/// Durations in serde as whole milliseconds, as the headers count them.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }

    /// The same for an optional duration.
    pub(crate) mod optional {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            value: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(value) => super::serialize(value, serializer),
                None => serializer.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            Option::<u64>::deserialize(deserializer).map(|ms| ms.map(Duration::from_millis))
        }
    }
}
