//! What a health read answers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_lease::Namespace;

/// How long a health snapshot is served before it is taken again.
pub const HEALTH_SNAPSHOT_TTL: Duration = Duration::from_secs(15);
