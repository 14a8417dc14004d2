//! A store on a test's database, driven by a manual clock, with an admin
//! already set up; and the names tests use.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tessera_store::{
    AdmissionConfig, Brief, Caller, ClaimOutcome, Claimed, EnqueueOptions, Error, Grant, IssuedKey,
    KeySpec, ManualClock, Namespace, QueueName, Scope, Store, StoreConfig, TaskId, TaskRef,
};

use super::TestDb;

/// 2026-10-29 12:00:00 UTC.
pub(crate) fn noon() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
}

/// 2026-10-30 00:00 UTC: when the day of [`noon`] ends, and so when a
/// quota refusal then resets.
pub(crate) fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap()
}

/// A quota refusal resetting at `reset_at`, in the error and its body.
pub(crate) fn assert_quota(error: &Error, reset_at: DateTime<Utc>) {
    assert!(error.is_quota_exhausted(), "{error:?}");
    assert_eq!(error.status(), 503);
    assert_eq!(error.code(), "storage_quota_exhausted");
    assert_eq!(error.reset_at(), Some(reset_at));
    let body = serde_json::to_value(error.body()).unwrap();
    assert_eq!(
        body["error"]["reset_at"],
        serde_json::to_value(reset_at).unwrap()
    );
}

pub(crate) fn namespace(name: &str) -> Namespace {
    Namespace::parse(name).unwrap()
}

pub(crate) fn queue(name: &str) -> QueueName {
    QueueName::parse(name).unwrap()
}

pub(crate) fn json_brief(n: usize) -> Brief {
    Brief::Json(serde_json::json!({ "frame": n }))
}

/// The task id of task number `n`: `t-00042`.
pub(crate) fn task_id(n: usize) -> TaskId {
    TaskId::parse(&format!("t-{n:05}")).unwrap()
}

/// The number in a task id made by [`task_id`].
pub(crate) fn task_number(id: &str) -> usize {
    id.strip_prefix("t-").unwrap().parse().unwrap()
}

/// A store on `db`, driven by a manual clock, with an admin set up.
pub(crate) struct Fixture<'db> {
    pub(crate) db: &'db TestDb,
    pub(crate) clock: ManualClock,
    pub(crate) store: Store,
    pub(crate) admin_key: IssuedKey,
    pub(crate) admin: Caller,
}

impl<'db> Fixture<'db> {
    pub(crate) fn new(db: &'db TestDb) -> Self {
        Self::with(db, |config| config)
    }

    /// A fixture whose admission admits `capacity` claims at once and lets
    /// others wait up to `max_wait`.
    pub(crate) fn with_capacity(db: &'db TestDb, capacity: u32, max_wait: Duration) -> Self {
        Self::with(db, |config| {
            config.with_admission(AdmissionConfig {
                initial_concurrency: capacity,
                max_concurrency: capacity.max(1024),
                max_wait,
                ..AdmissionConfig::default()
            })
        })
    }

    pub(crate) fn with(
        db: &'db TestDb,
        configure: impl FnOnce(StoreConfig) -> StoreConfig,
    ) -> Self {
        Self::at(db, noon(), configure)
    }

    /// A fixture whose clock starts at `start`.
    pub(crate) fn at(
        db: &'db TestDb,
        start: DateTime<Utc>,
        configure: impl FnOnce(StoreConfig) -> StoreConfig,
    ) -> Self {
        let clock = ManualClock::new(start);
        let config = configure(StoreConfig::default().with_clock(Arc::new(clock.clone())));
        let store = db.open(config);
        let admin_key = store.create_admin_key("operators").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        Self {
            db,
            clock,
            store,
            admin_key,
            admin,
        }
    }

    /// The store's default settings on this fixture's clock.
    pub(crate) fn config(&self) -> StoreConfig {
        StoreConfig::default().with_clock(Arc::new(self.clock.clone()))
    }

    /// Closes the store and opens the database again with `config`.
    pub(crate) fn reopen(&mut self, config: StoreConfig) {
        // Closed first, so the new store is the only one on the database;
        // meanwhile a store on a spare database holds its place.
        let spare = self.db.fresh();
        drop(std::mem::replace(
            &mut self.store,
            spare.open(StoreConfig::default()),
        ));
        self.store = self.db.open(config);
        self.admin = self.login(&self.admin_key);
    }

    pub(crate) fn login(&self, key: &IssuedKey) -> Caller {
        self.login_secret(key.secret.expose())
    }

    /// Authenticates the whole presented key `secret`.
    pub(crate) fn login_secret(&self, secret: &str) -> Caller {
        self.store.authenticate(Some(secret)).unwrap()
    }

    /// A keyed worker with the claim and read scopes and `grant`.
    pub(crate) fn worker(&self, grant: Grant) -> IssuedKey {
        self.key(&[Scope::Claim, Scope::Read], grant)
    }

    /// A keyed worker with every scope and `grant`.
    pub(crate) fn full_worker(&self, grant: Grant) -> IssuedKey {
        self.key(Scope::ALL, grant)
    }

    /// A keyed worker with `scopes` and `grant`.
    pub(crate) fn key(&self, scopes: &[Scope], grant: Grant) -> IssuedKey {
        self.store
            .create_key(
                &self.admin,
                &KeySpec::keyed("acme")
                    .with_scopes(scopes.iter().copied())
                    .with_grant(grant),
            )
            .unwrap()
    }

    /// Enqueues `count` tasks with JSON briefs ([`json_brief`]); returns
    /// them in order.
    pub(crate) fn enqueue(
        &self,
        caller: &Caller,
        ns: &Namespace,
        queue: &QueueName,
        count: usize,
    ) -> Vec<TaskRef> {
        (0..count)
            .map(|n| {
                self.store
                    .enqueue(
                        caller,
                        ns,
                        queue,
                        &json_brief(n),
                        &EnqueueOptions::default(),
                    )
                    .unwrap()
            })
            .collect()
    }

    /// Enqueues task number `n` (id from [`task_id`]) with a small JSON
    /// brief and returns it.
    pub(crate) fn enqueue_one(
        &self,
        caller: &Caller,
        ns: &Namespace,
        q: &QueueName,
        n: usize,
    ) -> TaskRef {
        self.store
            .enqueue(
                caller,
                ns,
                q,
                &Brief::Json(serde_json::json!({ "n": n })),
                &EnqueueOptions::default().with_task_id(task_id(n)),
            )
            .unwrap()
    }

    /// Enqueues tasks `from..to` as [`enqueue_one`](Self::enqueue_one)
    /// does.
    pub(crate) fn enqueue_range(
        &self,
        caller: &Caller,
        ns: &Namespace,
        q: &QueueName,
        from: usize,
        to: usize,
    ) {
        for n in from..to {
            self.enqueue_one(caller, ns, q, n);
        }
    }

    /// Claims and expects a lease.
    pub(crate) fn claim(&self, caller: &Caller, ns: &Namespace, queue: &QueueName) -> Claimed {
        match self.store.claim(caller, ns, queue).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("expected a lease, got {other:?}"),
        }
    }
}
