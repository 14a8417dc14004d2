//! Sans-IO claim admission for Tessera.

// -- idle pacing, mint allowance, address grouping (begin) --
mod address;
mod idle;
mod mint;

pub use address::AddressGroup;
pub use idle::{IDLE_HINTS, IdleConfig, IdlePacing};
pub use mint::{MintAllowance, MintConfig, MintDecision, MintRefusal, PolicyConfigError};
// -- idle pacing, mint allowance, address grouping (end) --
