//! `tessera-client`: Tessera's server from another process.
//!
//! - [`Client`] (feature `blocking`, the default) calls `tessera-server`'s
//!   routes on the caller's thread, over ureq; [`AsyncClient`] (feature
//!   `async`) makes the same calls on tokio, over hyper. Both build each
//!   request and read each answer with the same code ([`ClaimAnswer`],
//!   [`Accepted`], [`Error`]), and only the transport differs.
//! - [`Worker`] (feature `blocking`, on threads) and [`AsyncWorker`]
//!   (feature `async`, on tokio) are the remote worker loop: claims
//!   with the long-poll, waits as the server asks with jitter, heartbeats
//!   held leases, and submits under an idempotency key retried until it
//!   lands.
//! - [`wire`] holds the routes and the JSON shapes. `tessera-server`
//!   reads its requests into the same types and builds its answers from
//!   them, so the client and the server cannot drift apart.
//! - [`pacing`] holds the worker's waits as pure functions.
//!
//! A worker in five lines:
//!
//! ```no_run
//! use serde_json::json;
//! use tessera_client::{Client, Worker};
//!
//! # let key = String::new();
//! let client = Client::new("http://127.0.0.1:8080", &key)?; // a key with the claim scope
//! let worker = Worker::new(client, "renders", "frames", |claim| Ok(json!({ "frame": claim.brief_json() })))?;
//! worker.run(4)?; // until worker.stopper().stop()
//! # Ok::<(), tessera_client::Error>(())
//! ```
//!
//! Plain `http://` only: a server reached over the network sits behind a
//! TLS-terminating proxy, as the hosting guide describes.

#[cfg(feature = "async")]
mod asynchronous;
#[cfg(feature = "blocking")]
mod blocking;
mod calls;
mod error;
pub mod pacing;
pub mod wire;
#[cfg(any(feature = "blocking", feature = "async"))]
mod worker;

use std::time::Duration;

#[cfg(feature = "async")]
pub use asynchronous::AsyncClient;
#[cfg(feature = "blocking")]
pub use blocking::Client;
pub use calls::{Accepted, ClaimAnswer};
pub use error::Error;
pub use tessera_store as store;
pub use wire::{Claim, EnqueuedTask, Lease, NewTask, Receipt};
#[cfg(feature = "async")]
pub use worker::AsyncWorker;
#[cfg(feature = "blocking")]
pub use worker::Worker;
#[cfg(any(feature = "blocking", feature = "async"))]
pub use worker::{HandlerError, MIN_WAIT, Stopper, WorkerOptions, WorkerStats, failure_text};

/// The `User-Agent` the client sends.
pub const USER_AGENT: &str = concat!("tessera-client/", env!("CARGO_PKG_VERSION"));

/// The largest answer body the client reads (a batch of 100 claims of
/// the largest briefs, opaque bytes written as JSON numbers, fits).
pub const MAX_ANSWER_BYTES: u64 = 512 * 1024 * 1024;

/// Where a client calls and how.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    base_url: String,
    key: String,
    /// How long a call may take before it is a transport error, beyond
    /// the time the server holds it on purpose (a long-poll's timeout, a
    /// claim's wait for admission is not). Default 30 s.
    pub timeout: Duration,
    /// The longest a claim may wait for admission on the server (its
    /// `TESSERA_CLAIM_MAX_WAIT_SECONDS`, 10 s by default), added to a
    /// claim's timeout. Default 60 s.
    pub claim_wait: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("key", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("claim_wait", &self.claim_wait)
            .finish()
    }
}

impl ClientConfig {
    /// A configuration for the server at `base_url` (`http://host:port`,
    /// optionally with a path prefix) under the API key `key`.
    pub fn new(base_url: &str, key: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::InvalidInput {
            reason: reason.to_owned(),
        };
        let Some(rest) = base_url.strip_prefix("http://") else {
            return Err(invalid(
                "the base URL starts with http:// (TLS is a proxy's)",
            ));
        };
        if rest.is_empty() || rest.starts_with('/') || base_url.contains(['?', '#', ' ']) {
            return Err(invalid("the base URL is http://host[:port][/prefix]"));
        }
        if key.is_empty() || !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(invalid("the key is visible ASCII"));
        }
        Ok(Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            timeout: Duration::from_secs(30),
            claim_wait: Duration::from_secs(60),
        })
    }

    /// The server's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `path` (from the server's root) under the base URL.
    #[cfg_attr(not(any(feature = "blocking", feature = "async")), allow(dead_code))]
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// The `Authorization` header.
    #[cfg_attr(not(any(feature = "blocking", feature = "async")), allow(dead_code))]
    pub(crate) fn authorization(&self) -> String {
        format!("Bearer {}", self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_is_plain_http_to_a_host() {
        let config = ClientConfig::new("http://127.0.0.1:8080/", "k").unwrap();
        assert_eq!(config.url("/v1/x"), "http://127.0.0.1:8080/v1/x");
        let prefixed = ClientConfig::new("http://host/tessera", "k").unwrap();
        assert_eq!(prefixed.url("/v1/x"), "http://host/tessera/v1/x");
        for bad in [
            "https://host",
            "host:80",
            "http://",
            "http:///x",
            "http://h?q=1",
        ] {
            assert!(ClientConfig::new(bad, "k").is_err(), "{bad}");
        }
        assert!(ClientConfig::new("http://h", "a b").is_err());
        assert!(
            !format!("{config:?}").contains("\"k\""),
            "the key is not in Debug"
        );
    }
}
