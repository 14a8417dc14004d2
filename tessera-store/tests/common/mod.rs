//! Shared set-up for the store's integration tests.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use tempfile::TempDir;
use tessera_store::{
    Caller, Grant, IssuedKey, KeySpec, ManualClock, Namespace, Scope, Store, StoreConfig,
};

/// 2026-10-29 12:00:00 UTC.
pub fn noon() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
}

pub fn namespace(name: &str) -> Namespace {
    Namespace::parse(name).unwrap()
}

/// A store on a fresh file in a temporary directory, driven by a manual
/// clock, with an admin already set up.
pub struct Fixture {
    pub dir: TempDir,
    pub clock: ManualClock,
    pub store: Store,
    pub admin_key: IssuedKey,
    pub admin: Caller,
}

impl Fixture {
    pub fn new() -> Self {
        Self::with(|config| config)
    }

    pub fn with(configure: impl FnOnce(StoreConfig) -> StoreConfig) -> Self {
        Self::at(noon(), configure)
    }

    /// A fixture whose clock starts at `start`.
    pub fn at(start: DateTime<Utc>, configure: impl FnOnce(StoreConfig) -> StoreConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(start);
        let config = configure(StoreConfig::default().with_clock(Arc::new(clock.clone())));
        let store = Store::open(dir.path().join("tessera.db"), config).unwrap();
        let admin_key = store.create_admin_key("operators").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        Self {
            dir,
            clock,
            store,
            admin_key,
            admin,
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("tessera.db")
    }

    /// A keyed worker with the claim and read scopes and `grant`.
    pub fn worker(&self, grant: Grant) -> IssuedKey {
        self.store
            .create_key(
                &self.admin,
                &KeySpec::keyed("acme")
                    .with_scopes([Scope::Claim, Scope::Read])
                    .with_grant(grant),
            )
            .unwrap()
    }

    pub fn login(&self, key: &IssuedKey) -> Caller {
        self.store.authenticate(Some(key.secret.expose())).unwrap()
    }
}

pub fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

pub fn queue(name: &str) -> tessera_store::QueueName {
    tessera_store::QueueName::parse(name).unwrap()
}

pub fn json_brief(n: usize) -> tessera_store::Brief {
    tessera_store::Brief::Json(serde_json::json!({ "frame": n }))
}

impl Fixture {
    /// A keyed worker with every scope and `grant`.
    pub fn full_worker(&self, grant: Grant) -> IssuedKey {
        self.store
            .create_key(
                &self.admin,
                &KeySpec::keyed("acme")
                    .with_scopes(Scope::ALL.iter().copied())
                    .with_grant(grant),
            )
            .unwrap()
    }

    /// Enqueues `count` tasks with JSON briefs; returns them in order.
    pub fn enqueue(
        &self,
        caller: &Caller,
        ns: &Namespace,
        queue: &tessera_store::QueueName,
        count: usize,
    ) -> Vec<tessera_store::TaskRef> {
        (0..count)
            .map(|n| {
                self.store
                    .enqueue(
                        caller,
                        ns,
                        queue,
                        &json_brief(n),
                        &tessera_store::EnqueueOptions::default(),
                    )
                    .unwrap()
            })
            .collect()
    }

    /// Claims and expects a lease.
    pub fn claim(
        &self,
        caller: &Caller,
        ns: &Namespace,
        queue: &tessera_store::QueueName,
    ) -> tessera_store::Claimed {
        match self.store.claim(caller, ns, queue).unwrap() {
            tessera_store::ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("expected a lease, got {other:?}"),
        }
    }
}
