//! The SQLite work-queue store for Tessera.
