//! The SQLite work-queue store for Tessera.

#![forbid(unsafe_code)]

mod clock;
mod config;
mod db;
mod error;
mod key;
mod meter;
mod quota;
mod schema;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::StoreConfig;
pub use error::{Error, ErrorBody, ErrorDetail, ToolContent, ToolError, ToolErrorDetail};
pub use meter::MeterSnapshot;
pub use quota::{QuotaClassifier, next_utc_midnight};
pub use schema::SCHEMA_VERSION;
pub use store::Store;
