//! What the store's test binaries share: a fresh database of one backend
//! per test ([`TestDb`]), a store set up on it ([`Fixture`]), and names.

// Each test binary uses its own part of the shared set-up.
#![allow(dead_code)]

mod db;
mod fixture;
#[cfg(feature = "postgres")]
mod pg;
mod sqlite;

#[allow(unused_imports)] // The SQLite-only binary names no backend.
pub(crate) use db::{BackendKind, TestDb};
#[allow(unused_imports)] // Each binary names what it uses.
pub(crate) use fixture::{
    Fixture, assert_quota, json_brief, midnight, namespace, noon, queue, task_id, task_number,
};
