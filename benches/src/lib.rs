//! Criterion benchmarks for Tessera; see `benches/` and the README's tables.
