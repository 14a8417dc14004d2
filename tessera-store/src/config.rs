//! The store's policy, the same on every backend: clock, lease length,
//! admission, pacing, sessions, quota. A backend's own knobs are its
//! options (e.g. [`SqliteOptions`](crate::sqlite::SqliteOptions)).

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tessera_admission::{AdmissionConfig, IdleConfig, MintConfig};
use tessera_audit::Secret;
use tessera_lease::{Namespace, Retention};

use crate::clock::{Clock, SystemClock};

/// How a store groups acknowledgements (submits and failure reports
/// from its threads) into one commit: at most N waiting, or T elapsed.
/// On PostgreSQL the same rule groups `submit_and_claim` calls from its
/// threads into one statement (in each of two lanes).
///
/// ```
/// use std::time::Duration;
/// use tessera_store::{AckBatching, StoreConfig};
///
/// let config = StoreConfig::default().with_ack_batching(AckBatching {
///     max_batch: 16,
///     max_wait: Duration::ZERO,
/// });
/// assert_eq!(config.ack_batching().max_batch, 16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AckBatching {
    /// The most acknowledgements one commit carries (N), but one
    /// caller's are never split: a `submit_batch` of N or more commits
    /// alone, in one transaction, at once (it waits for no other
    /// batch's commit).
    pub max_batch: usize,
    /// The longest a leader waits for more before it commits (T); only
    /// while acknowledgements are arriving together.
    pub max_wait: Duration,
}

impl AckBatching {
    /// N: 64 acknowledgements. A batch's statements are set-based, so a
    /// larger batch costs little more per item, while the batch's locks
    /// (one task row per item) are held for the whole commit.
    pub const DEFAULT_MAX_BATCH: usize = 64;

    /// T: 1 ms, under one commit of a one-row transaction on a server
    /// that syncs its log, so a lingering leader at most doubles a
    /// caller's wait while it saves a commit per item it gathers.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(1);
}

impl Default for AckBatching {
    fn default() -> Self {
        Self {
            max_batch: Self::DEFAULT_MAX_BATCH,
            max_wait: Self::DEFAULT_MAX_WAIT,
        }
    }
}

/// Settings for [`Store::open`](crate::Store::open).
///
/// Built from [`Default`] with `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use tessera_store::StoreConfig;
///
/// let config = StoreConfig::default()
///     .with_lease_duration(Duration::from_secs(30))
///     .with_daily_rows_written_allowance(100_000);
/// assert_eq!(config.daily_rows_written_allowance(), 100_000);
/// ```
#[derive(Clone)]
pub struct StoreConfig {
    clock: Arc<dyn Clock>,
    daily_rows_written_allowance: u64,
    refuse_writes: bool,
    strict_read_audit: bool,
    observation_capacity: NonZeroUsize,
    admission: AdmissionConfig,
    idle: IdleConfig,
    mint: MintConfig,
    lease_duration: Duration,
    public_namespaces: Vec<Namespace>,
    address_secret: Option<Secret>,
    session_lifetime: Duration,
    session_practice_tasks: u16,
    retry_jitter_seed: Option<u64>,
    ack_batching: AckBatching,
    retention: Retention,
    retention_interval: Duration,
    #[cfg(feature = "fault-injection")]
    injected_fault: Option<crate::faults::InjectedFault>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            daily_rows_written_allowance: 0,
            refuse_writes: false,
            strict_read_audit: false,
            observation_capacity: NonZeroUsize::new(10_000).expect("not zero"),
            admission: AdmissionConfig::default(),
            idle: IdleConfig::default(),
            mint: MintConfig::default(),
            lease_duration: Duration::from_secs(60),
            public_namespaces: Vec::new(),
            address_secret: None,
            session_lifetime: Duration::from_secs(24 * 60 * 60),
            session_practice_tasks: 3,
            retry_jitter_seed: None,
            ack_batching: AckBatching::default(),
            retention: Retention::default(),
            retention_interval: Duration::from_secs(5 * 60),
            #[cfg(feature = "fault-injection")]
            injected_fault: None,
        }
    }
}

impl StoreConfig {
    /// The clock the store reads (default [`SystemClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Rows that may be written per UTC day, as the backend's meter counts
    /// them (SQLite: index entries included; PostgreSQL: table rows
    /// changed) (default 0: off). A write transaction that would pass it is
    /// rolled back and refused with `503 storage_quota_exhausted` until
    /// 00:00 UTC. Counted in process memory from the moment the store
    /// opens, per process.
    pub fn with_daily_rows_written_allowance(mut self, rows: u64) -> Self {
        self.daily_rows_written_allowance = rows;
        self
    }

    /// Opens the store already refusing every write-capable statement, as a
    /// provider with a spent allowance does (see
    /// [`Store::refuse_writes`](crate::Store::refuse_writes)). Opening an
    /// up-to-date database still succeeds, because it writes nothing.
    pub fn with_refuse_writes(mut self, refuse: bool) -> Self {
        self.refuse_writes = refuse;
        self
    }

    /// Whether a successful read fails when its audit row is refused by a
    /// storage quota (default `false`: the read answers, the lost audit row
    /// is counted as outcome `audit_refused`). `true` keeps a per-read audit
    /// trail at the price of reads failing while writes are refused.
    pub fn with_strict_read_audit(mut self, strict: bool) -> Self {
        self.strict_read_audit = strict;
        self
    }

    /// How many principals the `last_used_at` coalescing remembers (default
    /// 10,000); past that the least recently seen is forgotten, which costs
    /// it one extra write on its next request.
    pub fn with_observation_capacity(mut self, capacity: NonZeroUsize) -> Self {
        self.observation_capacity = capacity;
        self
    }

    /// Settings of the claim admission controller (default
    /// [`AdmissionConfig::default`]: 32 at once, 2,048 waiting, 10 s
    /// wait). Validated when the store opens.
    pub fn with_admission(mut self, admission: AdmissionConfig) -> Self {
        self.admission = admission;
        self
    }

    /// Settings of the empty-claim `Retry-After` pacing.
    pub fn with_idle(mut self, idle: IdleConfig) -> Self {
        self.idle = idle;
        self
    }

    /// Settings of the anonymous session mint allowance (default 1,000 an
    /// hour, 10 an hour per address group).
    pub fn with_mint(mut self, mint: MintConfig) -> Self {
        self.mint = mint;
        self
    }

    /// How long a granted lease lasts, and how far a heartbeat extends it
    /// (default 60 s; whole milliseconds, as times are stored).
    pub fn with_lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// Makes `namespace`'s health readable without a key
    /// ([`Store::public_health`](crate::Store::public_health)). Public is a
    /// deployment decision, so it lives here rather than in the database:
    /// answering a public health read then needs no key, identity or
    /// namespace lookup at all.
    pub fn with_public_namespace(mut self, namespace: Namespace) -> Self {
        if !self.public_namespaces.contains(&namespace) {
            self.public_namespaces.push(namespace);
        }
        self
    }

    /// The server secret the daily address hash is derived from. Without
    /// one, the store generates 32 random bytes the first time it needs a
    /// hash and keeps them in `tessera_meta`, so hashes stay comparable
    /// across restarts.
    pub fn with_address_secret(mut self, secret: Secret) -> Self {
        self.address_secret = Some(secret);
        self
    }

    /// How long an anonymous session lives before its key stops working
    /// and retention deletes it (default 24 hours).
    pub fn with_session_lifetime(mut self, lifetime: Duration) -> Self {
        self.session_lifetime = lifetime;
        self
    }

    /// How many practice tasks a session's namespace gets when the session
    /// first uses it (default 3, in queue `practice`; 0 for none).
    pub fn with_session_practice_tasks(mut self, count: u16) -> Self {
        self.session_practice_tasks = count;
        self
    }

    /// Seeds the jitter of the default retry backoff
    /// ([`Retry::Backoff`](tessera_lease::Retry::Backoff)), so a test sees
    /// the same backoffs every run. Unset (the default), the store seeds it
    /// from the system clock when it opens.
    pub fn with_retry_jitter_seed(mut self, seed: u64) -> Self {
        self.retry_jitter_seed = Some(seed);
        self
    }

    /// How long finished tasks are kept before retention purges them,
    /// by the state they ended in (default [`Retention::default`]: done a
    /// day, discarded, failed and cancelled a week;
    /// [`Retention::FOREVER`] keeps them all). A keep time above
    /// [`Retention::MAX`] is refused when the store opens.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How long finished tasks are kept.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// The shortest time between two retention runs of this store
    /// (default five minutes, the most a day; whole milliseconds). A
    /// shorter one purges sooner after a keep time passes and costs a few
    /// index reads a run when nothing is due.
    pub fn with_retention_interval(mut self, interval: Duration) -> Self {
        self.retention_interval = interval;
        self
    }

    /// The shortest time between two retention runs.
    pub fn retention_interval(&self) -> Duration {
        self.retention_interval
    }

    /// Switches on a deliberate bug (`fault-injection` feature; for tests
    /// of the checks that must catch it).
    #[cfg(feature = "fault-injection")]
    pub fn with_injected_fault(mut self, fault: Option<crate::faults::InjectedFault>) -> Self {
        self.injected_fault = fault;
        self
    }

    /// The deliberate bug switched on, if any.
    #[cfg(feature = "fault-injection")]
    pub fn injected_fault(&self) -> Option<crate::faults::InjectedFault> {
        self.injected_fault
    }

    /// How acknowledgements are grouped into commits (default
    /// [`AckBatching::default`]: N = 64, T = 1 ms); a `max_batch` of 0
    /// counts as 1.
    pub fn with_ack_batching(mut self, batching: AckBatching) -> Self {
        self.ack_batching = batching;
        self
    }

    /// How acknowledgements are grouped into commits.
    pub fn ack_batching(&self) -> AckBatching {
        self.ack_batching
    }

    /// The retry jitter's seed, if one was set.
    pub fn retry_jitter_seed(&self) -> Option<u64> {
        self.retry_jitter_seed
    }

    /// Checks the store's own settings (the admission, idle and mint
    /// settings are checked by their policies): a lease duration of whole
    /// milliseconds between one millisecond and
    /// [`MAX_LEASE_DURATION`](tessera_lease::MAX_LEASE_DURATION) and a
    /// session lifetime of at least a second. Opening a store runs it; an invalid setting is
    /// `400 invalid_input` naming it.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let invalid = |reason: String| Err(crate::Error::InvalidInput { reason });
        // Whole milliseconds, as times are stored: a lease's expiry then
        // reads back as it was handed out.
        if self.lease_duration < Duration::from_millis(1)
            || self.lease_duration > tessera_lease::MAX_LEASE_DURATION
            || self.lease_duration.subsec_nanos() % 1_000_000 != 0
        {
            return invalid(format!(
                "lease duration must be whole milliseconds between 1 ms and {} s, got {:?}",
                tessera_lease::MAX_LEASE_DURATION.as_secs(),
                self.lease_duration
            ));
        }
        if self.session_lifetime < Duration::from_secs(1) {
            return invalid(format!(
                "session lifetime must be at least 1 s, got {:?}",
                self.session_lifetime
            ));
        }
        if let Err(error) = self.retention.check() {
            return invalid(format!("retention: {error}"));
        }
        if self.retention_interval > Duration::from_secs(24 * 60 * 60)
            || self.retention_interval.subsec_nanos() % 1_000_000 != 0
        {
            return invalid(format!(
                "retention interval must be whole milliseconds up to a day, got {:?}",
                self.retention_interval
            ));
        }
        Ok(())
    }

    /// The admission settings.
    pub fn admission(&self) -> &AdmissionConfig {
        &self.admission
    }

    /// The idle pacing settings.
    pub fn idle(&self) -> &IdleConfig {
        &self.idle
    }

    /// The mint allowance settings.
    pub fn mint(&self) -> &MintConfig {
        &self.mint
    }

    /// The lease duration and heartbeat extension.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// The namespaces whose health needs no key.
    pub fn public_namespaces(&self) -> &[Namespace] {
        &self.public_namespaces
    }

    /// Whether `namespace`'s health needs no key.
    pub fn is_public(&self, namespace: &Namespace) -> bool {
        self.public_namespaces.contains(namespace)
    }

    pub(crate) fn address_secret(&self) -> Option<&Secret> {
        self.address_secret.as_ref()
    }

    /// How long an anonymous session lives.
    pub fn session_lifetime(&self) -> Duration {
        self.session_lifetime
    }

    /// Practice tasks per session namespace.
    pub fn session_practice_tasks(&self) -> u16 {
        self.session_practice_tasks
    }

    /// The clock the store reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Rows per UTC day, 0 when off.
    pub fn daily_rows_written_allowance(&self) -> u64 {
        self.daily_rows_written_allowance
    }

    /// Whether the store opens refusing writes.
    pub fn refuses_writes(&self) -> bool {
        self.refuse_writes
    }

    /// Whether read audit rows are mandatory.
    pub fn strict_read_audit(&self) -> bool {
        self.strict_read_audit
    }

    /// Principals the `last_used_at` coalescing remembers.
    pub fn observation_capacity(&self) -> NonZeroUsize {
        self.observation_capacity
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field(
                "daily_rows_written_allowance",
                &self.daily_rows_written_allowance,
            )
            .field("refuse_writes", &self.refuse_writes)
            .field("strict_read_audit", &self.strict_read_audit)
            .field("observation_capacity", &self.observation_capacity)
            .field("admission", &self.admission)
            .field("idle", &self.idle)
            .field("mint", &self.mint)
            .field("lease_duration", &self.lease_duration)
            .field("public_namespaces", &self.public_namespaces)
            .field("address_secret", &self.address_secret.is_some())
            .field("session_lifetime", &self.session_lifetime)
            .field("session_practice_tasks", &self.session_practice_tasks)
            .field("retry_jitter_seed", &self.retry_jitter_seed)
            .field("ack_batching", &self.ack_batching)
            .field("retention", &self.retention)
            .field("retention_interval", &self.retention_interval)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(config: &StoreConfig) -> String {
        let error = config.validate().unwrap_err();
        assert_eq!(error.code(), "invalid_input", "{error:?}");
        error.to_string()
    }

    #[test]
    fn a_lease_duration_is_whole_milliseconds_within_bounds() {
        for ok in [Duration::from_millis(1), Duration::from_millis(1_500)] {
            assert!(
                StoreConfig::default()
                    .with_lease_duration(ok)
                    .validate()
                    .is_ok()
            );
        }
        for bad in [
            Duration::from_micros(999),
            Duration::from_micros(1_500),
            tessera_lease::MAX_LEASE_DURATION + Duration::from_millis(1),
        ] {
            let reason = refusal(&StoreConfig::default().with_lease_duration(bad));
            assert!(reason.contains("lease duration"), "{reason}");
        }
    }
}
