//! Sans-IO claim admission for Tessera.

// -- idle pacing, mint allowance, address grouping (begin) --
mod address;
mod idle;
mod mint;
// -- idle pacing, mint allowance, address grouping (end) --
