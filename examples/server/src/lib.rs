//! `tessera-server`: Tessera's store over HTTP, a thin layer.
//!
//! Each route is one [`Store`](tessera_store::Store) operation
//! ([`routes`] lists them with the operation each calls, and
//! [`NOT_ROUTED`] the store's methods that are not a client's), the
//! OpenAPI document is built from the same table ([`document`]), and
//! every input's limits, for validation and for the document alike, come
//! from [`limits`]. Every refusal is the store's JSON error body with its
//! status.
//!
//! Store calls are short blocking transactions, so they run on tokio's
//! blocking pool; a claim waits for admission with one `.await` of
//! `Store::claim_permit`, a future woken through its `Waker`, and a
//! request that goes away drops it, which withdraws the claim. On
//! SIGTERM or SIGINT the server stops taking connections, lets requests
//! in flight answer (claims and long-polls still waiting get
//! `503 shutting_down` with `Retry-After`), closes the store off the
//! runtime's threads and exits 0.
//!
//! Serving a store in a test or a host of one's own:
//!
//! ```no_run
//! use std::sync::Arc;
//! use tessera_server::{ServeOptions, serve_until};
//! use tessera_store::{Store, StoreConfig};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = Arc::new(Store::open("tessera.db", StoreConfig::default())?);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     let stop = async { let _ = tokio::signal::ctrl_c().await; };
//!     serve_until(listener, Arc::clone(&store), ServeOptions::default(), stop).await?;
//!     // Closed off the runtime's threads, as the PostgreSQL client needs.
//!     tokio::task::spawn_blocking(move || drop(store)).await?;
//!     Ok(())
//! }
//! ```

mod auth;
mod cli;
mod errors;
mod history;
pub mod limits;
mod logs;
mod mcp;
mod metrics;
mod objects;
mod openapi;
mod route_tools;
mod routes;
mod setup;

pub use errors::{ApiError, JsonBody};
pub use metrics::prometheus;
pub use openapi::{Doc, document};
pub use routes::{AppState, NOT_ROUTED, PublicOptions, Route, ServeOptions, routes, serve_until};
pub use setup::main;

/// The workspace README's code examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

/// The hosting guide's code examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/hosting.md")]
struct HostingExamples;
