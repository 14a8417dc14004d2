//! The SQLite work-queue store for Tessera.

#![forbid(unsafe_code)]

mod access;
mod audit;
mod clock;
mod config;
mod db;
mod error;
mod key;
mod meter;
mod quota;
mod schema;
mod sql;
mod store;

pub use access::{
    Caller, Grant, IssuedKey, KeyFilter, KeyInfo, KeySpec, MAX_ACCOUNT_LEN, MAX_KEYS_LISTED,
    MAX_LABEL_LEN, PrincipalId, PrincipalKind, Scope,
};
pub use audit::{AuditPage, AuditQuery, MAX_AUDIT_ROWS, Maintenance, STORE_NAMESPACE};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::StoreConfig;
pub use error::{Error, ErrorBody, ErrorDetail, ToolContent, ToolError, ToolErrorDetail};
pub use key::{KeyId, KeySecret};
pub use meter::MeterSnapshot;
pub use quota::{QuotaClassifier, next_utc_midnight};
pub use schema::SCHEMA_VERSION;
pub use store::Store;
pub use tessera_audit::{Action, AuditEvent, Counter, CounterKey, IpHash, Outcome};
pub use tessera_lease::Namespace;
