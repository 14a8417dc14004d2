//! Anonymous session mint allowance: a global hourly allowance that accrues
//! evenly, and an hourly limit per [`AddressGroup`].
//!
//! # Global allowance
//!
//! A tenth of the hourly allowance is available at once and the rest accrues
//! at a steady rate, so one caller can no longer spend the whole hour in
//! minutes and lock everyone out until the next clock hour. The rule is GCRA
//! (a token bucket kept as a single "theoretical arrival time"):
//!
//! - `burst = max(1, per_hour / 10)` sessions are available at once;
//! - one more accrues every `interval = 1 h / (per_hour - burst)`, rounded up
//!   to the nanosecond.
//!
//! With the defaults that is 100 at once, then one every 4 s (3,600 s / 900).
//!
//! **Guarantee:** any closed one-hour interval `[s, s + 1 h]` holds at most
//! `per_hour` mints. After the first mint inside the interval, the `k`-th
//! needs `k - burst` intervals to have passed, and one hour holds
//! `per_hour - burst` of them, so the count is at most
//! `burst + (per_hour - burst) = per_hour`. The first hour after a quiet
//! period mints exactly `per_hour` (100 at once, then 900 more, the last at
//! exactly one hour). The sustained rate is `per_hour - burst` an hour (900 by
//! default): the tenth is what lets the next burst happen without ever
//! letting a sliding hour exceed the allowance. (A per-clock-hour counter, by
//! contrast, lets nearly twice the allowance through across an hour boundary.)
//!
//! # Per-address limit
//!
//! Each address group may mint `per_address_per_hour` sessions in any closed
//! one-hour interval, kept exactly with a sliding log of the group's mints in
//! the last hour. The whole per-address allowance is available at once (it is
//! small, and several people may share one address).
//!
//! Memory stays bounded without configuration: only allowed mints are
//! recorded, a group's log keeps only the mints of the hour before its latest
//! one, and a group whose latest mint is more than an hour old is dropped
//! (oldest first, `O(log n)` each, from an ordered index). So the logs hold
//! mints of the last two hours only, at most `2 × per_hour` instants in all,
//! and at most `per_address_per_hour` per group. `address_capacity` caps the number of groups as well; past
//! it the least recently minting group is forgotten, which lets that group
//! mint again early. With `address_capacity >= per_hour` (the defaults) that
//! never happens.
//!
//! # Durable per-address window
//!
//! The limits above live in process memory. A store also keeps a durable
//! count per address group and fixed UTC clock hour, so a restart does not
//! reset the per-address limit: [`AddressWindow`] names the hour a mint falls
//! in and decides from the stored count; the store only reads and bumps the
//! count row.
//!
//! # Refusals
//!
//! A refusal carries a `Retry-After` in whole seconds, rounded up, at least
//! 1: the time until both limits would allow this group a session. A retry at
//! that time succeeds unless someone else minted in between.
//!
//! Every call is `O(log n)` in the number of tracked groups. Time comes in as
//! `now`; instants earlier than one already seen are treated as that one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::{AddressGroup, ConfigError, seconds};

const HOUR: Duration = Duration::from_secs(3600);
const HOUR_NANOS: u64 = HOUR.as_secs() * 1_000_000_000;

/// Settings of a [`MintAllowance`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct MintConfig {
    /// Sessions minted in any one-hour interval, across all callers. A tenth
    /// is available at once and the rest accrues evenly. At least 2.
    /// Default 1,000.
    pub per_hour: u32,
    /// Sessions one [`AddressGroup`] may mint in any one-hour interval.
    /// At least 1. Default 10.
    pub per_address_per_hour: u32,
    /// Most address groups remembered at once. At least 1. Default 10,000.
    pub address_capacity: usize,
}

impl Default for MintConfig {
    fn default() -> Self {
        Self {
            per_hour: 1_000,
            per_address_per_hour: 10,
            address_capacity: 10_000,
        }
    }
}

impl MintConfig {
    /// Checks every setting against its minimum; errors name the setting as
    /// `mint.<field>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Two is the least that leaves something to accrue after the burst.
        if self.per_hour < 2 {
            return Err(ConfigError::out_of_range(
                "mint.per_hour",
                self.per_hour,
                "at least 2",
            ));
        }
        if self.per_address_per_hour == 0 {
            return Err(ConfigError::out_of_range(
                "mint.per_address_per_hour",
                0,
                "at least 1",
            ));
        }
        if self.address_capacity == 0 {
            return Err(ConfigError::out_of_range(
                "mint.address_capacity",
                0,
                "at least 1",
            ));
        }
        Ok(())
    }
}

/// What [`MintAllowance::check`] decided.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MintDecision {
    /// Mint the session. From [`MintAllowance::check`], both allowances
    /// have been charged for it; from [`AddressWindow::check`], the store
    /// bumps the window's stored count as it mints.
    Allowed,
    /// Do not mint; nothing was charged.
    Refused {
        /// Whole seconds, at least 1, until a session becomes available to
        /// this address group; a `Retry-After` value.
        retry_after: Duration,
        /// The limit that frees last.
        reason: MintRefusal,
    },
}

impl MintDecision {
    /// Whether the session may be minted.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed)
    }

    /// The `Retry-After` of a refusal, `None` when allowed.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Allowed => None,
            Self::Refused { retry_after, .. } => Some(*retry_after),
        }
    }
}

/// Which limit refused a mint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MintRefusal {
    /// The global hourly allowance has nothing available yet.
    Global,
    /// This address group used its hourly limit.
    Address,
}

impl MintRefusal {
    /// A short lowercase reason, for a response body or a log.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Global => "anonymous session allowance used up for now",
            Self::Address => "anonymous session limit reached for this address",
        }
    }
}

impl fmt::Display for MintRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The anonymous session mint allowance: global and per address group.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::{Duration, Instant};
/// use tessera_admission::{AddressGroup, MintAllowance, MintConfig, MintDecision};
///
/// let mut mint = MintAllowance::new(MintConfig::default())?;
/// let now = Instant::now(); // a host reads its clock; the policy never does
/// let group = AddressGroup::from("2001:db8::1".parse::<IpAddr>().unwrap());
///
/// for _ in 0..10 {
///     assert_eq!(mint.check(group, now), MintDecision::Allowed);
/// }
/// // The eleventh in one hour is refused until the first one is an hour old.
/// let refused = mint.check(group, now);
/// assert_eq!(refused.retry_after(), Some(Duration::from_secs(3601)));
/// # Ok::<(), tessera_admission::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MintAllowance {
    config: MintConfig,
    global: Gcra,
    addresses: AddressLimit,
    latest: Option<Instant>,
}

impl MintAllowance {
    /// A fresh allowance: the burst and every group's limit available at once.
    pub fn new(config: MintConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let burst = (config.per_hour / 10).max(1);
        let accruing = u64::from(config.per_hour - burst);
        // Rounded up, so an hour never holds more than `accruing` intervals.
        let interval = Duration::from_nanos(HOUR_NANOS.div_ceil(accruing));
        let addresses = AddressLimit {
            limit: config.per_address_per_hour as usize,
            capacity: config.address_capacity,
            groups: HashMap::new(),
            by_latest: BTreeMap::new(),
            next_seq: 0,
        };
        Ok(Self {
            global: Gcra {
                interval,
                tolerance: interval * (burst - 1),
                burst,
                theoretical_arrival: None,
            },
            config,
            addresses,
            latest: None,
        })
    }

    /// Decides whether `group` may mint a session at `now`, and charges both
    /// limits when it may.
    pub fn check(&mut self, group: AddressGroup, now: Instant) -> MintDecision {
        let now = self.latest.map_or(now, |latest| latest.max(now));
        self.latest = Some(now);
        self.addresses.forget_stale(now);

        let address_wait = self.addresses.wait(group, now);
        let global_wait = self.global.wait(now);
        let (wait, reason) = match (global_wait, address_wait) {
            (None, None) => {
                self.global.charge(now);
                self.addresses.charge(group, now);
                return MintDecision::Allowed;
            }
            (Some(global), Some(address)) if global > address => (global, MintRefusal::Global),
            (Some(global), None) => (global, MintRefusal::Global),
            (_, Some(address)) => (address, MintRefusal::Address),
        };
        MintDecision::Refused {
            retry_after: Duration::from_secs(seconds::retry_after_seconds(wait)),
            reason,
        }
    }

    /// Sessions available at once after a quiet period: a tenth of
    /// `per_hour`, at least 1.
    pub fn burst(&self) -> u32 {
        self.global.burst
    }

    /// How often one more session accrues to the global allowance.
    pub fn interval(&self) -> Duration {
        self.global.interval
    }

    /// The address groups currently remembered.
    pub fn tracked_groups(&self) -> usize {
        self.addresses.groups.len()
    }

    /// The settings this allowance was built with.
    pub fn config(&self) -> &MintConfig {
        &self.config
    }
}

/// The fixed UTC clock hour `[start, end)` of the durable per-address mint
/// limit: a store keeps one count per address group and window (keyed by
/// [`start`](Self::start), purged after [`end`](Self::end)), so the limit
/// survives a restart.
///
/// Unlike [`MintAllowance`]'s sliding hour, a fixed window lets up to twice
/// the limit through across an hour boundary; it is the durable backstop,
/// the in-memory limit the precise one.
///
/// ```
/// use std::time::Duration;
/// use chrono::{TimeZone, Utc};
/// use tessera_admission::{AddressWindow, MintDecision, MintRefusal};
///
/// let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 59, 30).unwrap();
/// let window = AddressWindow::containing(now);
/// assert_eq!(window.start(), Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap());
/// assert_eq!(window.end(), Utc.with_ymd_and_hms(2026, 10, 29, 13, 0, 0).unwrap());
/// // SELECT count FROM access_limits WHERE subject = ? AND window_start = ?
/// assert_eq!(window.check(9, 10, now), MintDecision::Allowed);
/// assert_eq!(
///     window.check(10, 10, now),
///     MintDecision::Refused { retry_after: Duration::from_secs(30), reason: MintRefusal::Address }
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressWindow {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

impl AddressWindow {
    /// The length of a window: one hour.
    pub const LENGTH: TimeDelta = TimeDelta::hours(1);

    /// The window `now` falls in: from the start of its UTC hour to the
    /// start of the next (the last representable time if that is past the
    /// end of `DateTime`).
    #[must_use]
    pub fn containing(now: DateTime<Utc>) -> Self {
        let hour = Self::LENGTH.num_seconds();
        let start = DateTime::from_timestamp(now.timestamp().div_euclid(hour) * hour, 0)
            .expect("an hour's start is no earlier than a time in range");
        let end = start
            .checked_add_signed(Self::LENGTH)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        Self { start, end }
    }

    /// The first instant of the window; the key of its stored count.
    #[must_use]
    pub fn start(&self) -> DateTime<Utc> {
        self.start
    }

    /// The first instant after the window, when its count stops mattering.
    #[must_use]
    pub fn end(&self) -> DateTime<Utc> {
        self.end
    }

    /// Decides a mint at `now` (inside the window) from the `stored` count
    /// of the group's mints in it: allowed while `stored` is below
    /// `per_address_per_hour` ([`MintConfig::per_address_per_hour`]);
    /// otherwise refused for [`MintRefusal::Address`] until the window ends,
    /// in whole seconds, rounded up, at least 1
    /// ([`retry_after_seconds`](crate::retry_after_seconds)). Charges
    /// nothing: on `Allowed` the store bumps the count as it mints.
    pub fn check(
        &self,
        stored: u64,
        per_address_per_hour: u32,
        now: DateTime<Utc>,
    ) -> MintDecision {
        if stored < u64::from(per_address_per_hour) {
            return MintDecision::Allowed;
        }
        let wait = (self.end - now).to_std().unwrap_or_default();
        MintDecision::Refused {
            retry_after: Duration::from_secs(seconds::retry_after_seconds(wait)),
            reason: MintRefusal::Address,
        }
    }
}

/// Whether a mint at `at` is outside every closed hour that ends at `now`.
fn outside_hour(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) > HOUR
}

/// The global allowance as GCRA: a mint conforms when `now` is no earlier
/// than the theoretical arrival time minus the burst tolerance.
#[derive(Debug, Clone)]
struct Gcra {
    interval: Duration,
    /// `(burst - 1) * interval`: how far ahead of schedule a mint may be.
    tolerance: Duration,
    burst: u32,
    /// `None` until the first mint: the whole burst is available.
    theoretical_arrival: Option<Instant>,
}

impl Gcra {
    /// How long until a mint conforms; `None` if it does now.
    fn wait(&self, now: Instant) -> Option<Duration> {
        // `arrival - now - tolerance`, kept in durations so that no instant
        // is ever moved past the end of its range.
        let ahead = self.theoretical_arrival?.saturating_duration_since(now);
        ahead
            .checked_sub(self.tolerance)
            .filter(|wait| !wait.is_zero())
    }

    fn charge(&mut self, now: Instant) {
        let base = self
            .theoretical_arrival
            .map_or(now, |arrival| arrival.max(now));
        // At the end of `Instant`'s range the allowance stops accruing debt
        // instead of panicking; no real clock gets there.
        self.theoretical_arrival = Some(base.checked_add(self.interval).unwrap_or(base));
    }
}

/// Per-group sliding logs with an index ordered by each group's latest mint.
#[derive(Debug, Clone)]
struct AddressLimit {
    limit: usize,
    capacity: usize,
    groups: HashMap<AddressGroup, GroupMints>,
    /// `(latest mint, sequence)` of every group: stale and least recently
    /// minting groups are found at the front in `O(log n)`.
    by_latest: BTreeMap<(Instant, u64), AddressGroup>,
    next_seq: u64,
}

#[derive(Debug, Clone)]
struct GroupMints {
    /// The group's mints within the last hour, oldest first; never empty.
    mints: VecDeque<Instant>,
    /// This group's key in `by_latest`.
    index: (Instant, u64),
}

impl AddressLimit {
    /// Drops groups whose latest mint is over an hour old.
    fn forget_stale(&mut self, now: Instant) {
        while let Some(entry) = self.by_latest.first_entry() {
            if !outside_hour(entry.key().0, now) {
                break;
            }
            let group = entry.remove();
            self.groups.remove(&group);
        }
    }

    /// How long until `group` may mint; `None` if it may now.
    fn wait(&mut self, group: AddressGroup, now: Instant) -> Option<Duration> {
        let log = &mut self.groups.get_mut(&group)?.mints;
        while log.front().is_some_and(|&at| outside_hour(at, now)) {
            log.pop_front();
        }
        if log.len() < self.limit {
            return None;
        }
        // The mint that must leave the window first; it leaves just after
        // being exactly an hour old (the window is closed).
        let oldest = log[log.len() - self.limit];
        Some(HOUR + Duration::from_nanos(1) - now.saturating_duration_since(oldest))
    }

    fn charge(&mut self, group: AddressGroup, now: Instant) {
        let index = (now, self.next_seq);
        self.next_seq += 1;
        if let Some(entry) = self.groups.get_mut(&group) {
            self.by_latest.remove(&entry.index);
            entry.index = index;
            entry.mints.push_back(now);
        } else {
            if self.groups.len() >= self.capacity {
                if let Some((_, evicted)) = self.by_latest.pop_first() {
                    self.groups.remove(&evicted);
                }
            }
            self.groups.insert(
                group,
                GroupMints {
                    mints: VecDeque::from([now]),
                    index,
                },
            );
        }
        self.by_latest.insert(index, group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arbitrary origin for hand-driven time; nothing waits on the clock.
    #[expect(clippy::disallowed_methods, reason = "an origin, not a reading")]
    fn origin() -> Instant {
        Instant::now()
    }

    fn group(n: u32) -> AddressGroup {
        std::net::Ipv4Addr::from(n).into()
    }

    #[test]
    fn burst_and_interval_follow_per_hour() {
        let cases = [(1_000, 100, 4_000_000_000), (2, 1, 3_600_000_000_000)];
        for (per_hour, burst, interval_nanos) in cases {
            let mint = MintAllowance::new(MintConfig {
                per_hour,
                ..MintConfig::default()
            })
            .unwrap();
            assert_eq!(mint.burst(), burst);
            assert_eq!(mint.interval(), Duration::from_nanos(interval_nanos));
        }
    }

    #[test]
    fn interval_is_rounded_up() {
        // 3,600 s / 7 accruing is not a whole number of nanoseconds.
        let mint = MintAllowance::new(MintConfig {
            per_hour: 8,
            ..MintConfig::default()
        })
        .unwrap();
        assert_eq!(mint.interval(), Duration::from_nanos(514_285_714_286));
    }

    #[test]
    fn stale_groups_are_dropped() {
        let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
        let start = origin();
        assert!(mint.check(group(1), start).is_allowed());
        assert!(mint.check(group(2), start + HOUR).is_allowed());
        assert_eq!(mint.tracked_groups(), 2);
        assert!(
            mint.check(group(2), start + HOUR + Duration::from_nanos(1))
                .is_allowed()
        );
        assert_eq!(mint.tracked_groups(), 1);
    }

    #[test]
    fn capacity_forgets_least_recently_minting_group() {
        let mut mint = MintAllowance::new(MintConfig {
            per_address_per_hour: 1,
            address_capacity: 2,
            ..MintConfig::default()
        })
        .unwrap();
        let now = origin();
        assert!(mint.check(group(1), now).is_allowed());
        assert!(mint.check(group(2), now).is_allowed());
        assert!(mint.check(group(3), now).is_allowed());
        assert_eq!(mint.tracked_groups(), 2);
        // Group 1 was forgotten; groups 2 and 3 are still limited.
        assert!(mint.check(group(1), now).is_allowed());
        assert!(!mint.check(group(3), now).is_allowed());
    }

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn address_window_is_the_utc_clock_hour() {
        let window = AddressWindow::containing(utc("2026-10-29T12:00:00Z"));
        assert_eq!(window.start(), utc("2026-10-29T12:00:00Z"));
        assert_eq!(window.end(), utc("2026-10-29T13:00:00Z"));
        let last = AddressWindow::containing(utc("2026-10-29T12:59:59.999999999Z"));
        assert_eq!(last, window);
        let before_epoch = AddressWindow::containing(utc("1969-12-31T23:30:00Z"));
        assert_eq!(before_epoch.start(), utc("1969-12-31T23:00:00Z"));
        assert_eq!(before_epoch.end(), utc("1970-01-01T00:00:00Z"));
    }

    #[test]
    fn address_window_saturates_at_the_end_of_time() {
        let window = AddressWindow::containing(DateTime::<Utc>::MAX_UTC);
        assert_eq!(window.end(), DateTime::<Utc>::MAX_UTC);
        assert!(window.start() < window.end());
        let first = AddressWindow::containing(DateTime::<Utc>::MIN_UTC);
        assert_eq!(first.start(), DateTime::<Utc>::MIN_UTC);
    }

    #[test]
    fn address_window_refuses_at_the_limit_until_it_ends() {
        let window = AddressWindow::containing(utc("2026-10-29T12:00:00Z"));
        let refused = |seconds| MintDecision::Refused {
            retry_after: Duration::from_secs(seconds),
            reason: MintRefusal::Address,
        };
        let now = utc("2026-10-29T12:00:00Z");
        assert_eq!(window.check(0, 10, now), MintDecision::Allowed);
        assert_eq!(window.check(9, 10, now), MintDecision::Allowed);
        assert_eq!(window.check(10, 10, now), refused(3600));
        assert_eq!(window.check(u64::MAX, 10, now), refused(3600));
        // Rounded up to whole seconds, at least one.
        let check = |at: &str| window.check(10, 10, utc(at));
        assert_eq!(check("2026-10-29T12:59:58.001Z"), refused(2));
        assert_eq!(check("2026-10-29T12:59:59.999999999Z"), refused(1));
        assert_eq!(check("2026-10-29T13:00:00Z"), refused(1));
        assert_eq!(check("2026-10-29T14:00:00Z"), refused(1));
    }

    #[test]
    fn earlier_instants_count_as_the_latest_seen() {
        let mut mint = MintAllowance::new(MintConfig {
            per_hour: 20,
            ..MintConfig::default()
        })
        .unwrap();
        let start = origin() + HOUR;
        let refused_at = |mint: &mut MintAllowance, now| mint.check(group(9), now).retry_after();
        assert!(mint.check(group(1), start).is_allowed());
        assert!(mint.check(group(2), start).is_allowed());
        // Burst of 2 spent; interval 200 s. A call from the past waits as if
        // made at `start`.
        assert_eq!(
            refused_at(&mut mint, start - HOUR),
            Some(Duration::from_secs(200))
        );
    }
}
