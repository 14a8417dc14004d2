//! Anonymous sessions.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tessera_lease::Namespace;

use crate::model::access::IssuedKey;

/// The account every anonymous principal belongs to.
pub const ANONYMOUS_ACCOUNT: &str = "anonymous";

/// A minted anonymous session.
#[derive(Debug, Clone, Serialize)]
pub struct Session {
    /// Its key, with the secret shown this once. It has every scope, in
    /// its own namespace only.
    #[serde(skip)]
    pub key: IssuedKey,
    /// The namespace it may use; created (with its practice tasks) by the
    /// session's first enqueue or claim, not by minting.
    pub namespace: Namespace,
    /// When the key stops working and retention deletes the session.
    pub expires_at: DateTime<Utc>,
}
