//! Mint allowance through the public API, with hand-driven time.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_admission::{
    AddressGroup, ConfigError, MintAllowance, MintConfig, MintDecision, MintRefusal,
};

/// An arbitrary origin for hand-driven time; nothing waits on the clock.
#[expect(clippy::disallowed_methods, reason = "an origin, not a reading")]
fn origin() -> Instant {
    Instant::now()
}

const HOUR: Duration = Duration::from_secs(3600);

fn group(n: u32) -> AddressGroup {
    Ipv4Addr::from(n).into()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn refused(retry_after: u64, reason: MintRefusal) -> MintDecision {
    MintDecision::Refused {
        retry_after: secs(retry_after),
        reason,
    }
}

#[test]
fn burst_of_100_of_1000_then_one_every_4_seconds() {
    let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
    let start = origin();
    let mut next_group = 0..;
    let mut fresh = || group(next_group.next().unwrap());

    for _ in 0..100 {
        assert_eq!(mint.check(fresh(), start), MintDecision::Allowed);
    }
    assert_eq!(mint.check(fresh(), start), refused(4, MintRefusal::Global));

    let mut minted = 100;
    for step in 1..=900u32 {
        let due = start + secs(4) * step;
        assert!(
            !mint
                .check(fresh(), due - Duration::from_nanos(1))
                .is_allowed()
        );
        assert_eq!(
            mint.check(fresh(), due),
            MintDecision::Allowed,
            "step {step}"
        );
        assert_eq!(mint.check(fresh(), due), refused(4, MintRefusal::Global));
        minted += 1;
    }
    // The hour [start, start + 1 h] holds exactly the allowance.
    assert_eq!(minted, 1_000);
    assert_eq!(start + secs(4) * 900, start + HOUR);
}

#[test]
fn retry_after_is_the_wait_for_the_next_session_rounded_up() {
    let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
    let start = origin();
    for n in 0..100 {
        assert!(mint.check(group(n), start).is_allowed());
    }
    let cases = [(0, 4), (1_500, 3), (3_000, 1), (3_200, 1), (3_999, 1)];
    for (after_ms, retry) in cases {
        let now = start + Duration::from_millis(after_ms);
        let decision = mint.check(group(1_000), now);
        assert_eq!(
            decision,
            refused(retry, MintRefusal::Global),
            "at {after_ms} ms"
        );
    }
    // Refusals charged nothing: the next session is still due at 4 s.
    let at = start + Duration::from_millis(1_500) + secs(3);
    assert!(at > start + secs(4));
    assert!(mint.check(group(1_000), at).is_allowed());
}

#[test]
fn quiet_period_refills_only_the_burst() {
    let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
    let start = origin();
    for n in 0..100 {
        assert!(mint.check(group(n), start).is_allowed());
    }
    // Ten hours later: a burst of 100 again, never more.
    let later = start + HOUR * 10;
    for n in 100..200 {
        assert!(mint.check(group(n), later).is_allowed());
    }
    assert_eq!(
        mint.check(group(200), later),
        refused(4, MintRefusal::Global)
    );
}

#[test]
fn per_address_limit_is_ten_in_any_hour() {
    let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
    let start = origin();
    let home = group(7);
    for _ in 0..10 {
        assert_eq!(mint.check(home, start), MintDecision::Allowed);
    }
    // The window is closed: a mint exactly an hour old still counts.
    assert_eq!(mint.check(home, start), refused(3601, MintRefusal::Address));
    assert_eq!(
        mint.check(home, start + secs(600)),
        refused(3001, MintRefusal::Address)
    );
    assert_eq!(
        mint.check(home, start + HOUR),
        refused(1, MintRefusal::Address)
    );
    assert_eq!(mint.check(group(8), start), MintDecision::Allowed);

    assert_eq!(
        mint.check(home, start + HOUR + secs(1)),
        MintDecision::Allowed
    );
}

#[test]
fn per_address_window_slides_with_each_mint() {
    let mut mint = MintAllowance::new(MintConfig {
        per_address_per_hour: 2,
        ..MintConfig::default()
    })
    .unwrap();
    let start = origin();
    let home = group(1);
    assert!(mint.check(home, start).is_allowed());
    assert!(mint.check(home, start + secs(1_000)).is_allowed());
    // Frees when the first mint leaves the window, not the second.
    assert_eq!(
        mint.check(home, start + secs(1_000)),
        refused(2601, MintRefusal::Address)
    );
    assert!(mint.check(home, start + secs(3_601)).is_allowed());
    assert_eq!(
        mint.check(home, start + secs(3_601)),
        refused(1_000, MintRefusal::Address)
    );
}

#[test]
fn rotating_inside_one_slash_64_never_escapes_the_limit() {
    let mut mint = MintAllowance::new(MintConfig::default()).unwrap();
    let start = origin();
    let address = |host: u16| -> AddressGroup {
        format!("2001:db8:1:2::{host:x}")
            .parse::<IpAddr>()
            .unwrap()
            .into()
    };
    for host in 0..10 {
        assert!(mint.check(address(host), start).is_allowed());
    }
    for host in 10..50 {
        assert_eq!(
            mint.check(address(host), start),
            refused(3601, MintRefusal::Address)
        );
    }
    let neighbour: AddressGroup = "2001:db8:1:3::1".parse::<IpAddr>().unwrap().into();
    assert!(mint.check(neighbour, start).is_allowed());
}

#[test]
fn refusal_names_the_limit_that_frees_last() {
    let mut mint = MintAllowance::new(MintConfig {
        per_hour: 20,
        per_address_per_hour: 1,
        ..MintConfig::default()
    })
    .unwrap();
    // Burst 2, then one every 200 s.
    let start = origin();
    assert!(mint.check(group(1), start).is_allowed());
    assert!(mint.check(group(2), start).is_allowed());
    assert_eq!(
        mint.check(group(3), start),
        refused(200, MintRefusal::Global)
    );
    assert_eq!(
        mint.check(group(1), start),
        refused(3601, MintRefusal::Address)
    );
    assert_eq!(
        MintRefusal::Global.to_string(),
        MintRefusal::Global.as_str()
    );
    assert_eq!(
        serde_json::to_string(&MintRefusal::Address).unwrap(),
        r#""address""#
    );
}

#[test]
fn decision_accessors() {
    assert!(MintDecision::Allowed.is_allowed());
    assert_eq!(MintDecision::Allowed.retry_after(), None);
    let no = refused(9, MintRefusal::Global);
    assert!(!no.is_allowed());
    assert_eq!(no.retry_after(), Some(secs(9)));
}

#[test]
fn invalid_settings_are_typed_errors() {
    let cases = [
        (
            MintConfig {
                per_hour: 1,
                ..MintConfig::default()
            },
            "mint.per_hour",
            1,
            2,
        ),
        (
            MintConfig {
                per_hour: 0,
                ..MintConfig::default()
            },
            "mint.per_hour",
            0,
            2,
        ),
        (
            MintConfig {
                per_address_per_hour: 0,
                ..MintConfig::default()
            },
            "mint.per_address_per_hour",
            0,
            1,
        ),
        (
            MintConfig {
                address_capacity: 0,
                ..MintConfig::default()
            },
            "mint.address_capacity",
            0,
            1,
        ),
    ];
    for (config, setting, value, minimum) in cases {
        let error = MintAllowance::new(config).unwrap_err();
        assert!(matches!(error, ConfigError::OutOfRange { .. }), "{error:?}");
        assert_eq!(error.name(), setting);
        assert_eq!(error.value(), value.to_string());
        assert_eq!(
            error.to_string(),
            format!("{setting}: {value} is out of range, expected at least {minimum}")
        );
    }
    assert!(MintConfig::default().validate().is_ok());
}

#[test]
fn config_defaults_and_serde() {
    let config = MintConfig::default();
    assert_eq!((config.per_hour, config.per_address_per_hour), (1_000, 10));
    let parsed: MintConfig = serde_json::from_str(r#"{"per_hour":50}"#).unwrap();
    assert_eq!(parsed.per_hour, 50);
    assert_eq!(parsed.per_address_per_hour, 10);
}

/// Requests: (how long after the previous request, group index). `None`
/// waits exactly the last Retry-After, as a greedy client would; bursts and
/// short gaps find the edges; long gaps let allowances refill.
fn requests() -> impl Strategy<Value = Vec<(Option<u64>, u32)>> {
    let gap_ms = prop_oneof![
        3 => Just(None),
        1 => Just(Some(0u64)),
        1 => (0..20_000u64).prop_map(Some),
        1 => (0..400_000u64).prop_map(Some),
    ];
    proptest::collection::vec((gap_ms, 0..GROUPS), 1..500)
}

/// Drives `mint` through `requests`, returning each request's time and
/// decision.
fn drive(
    mint: &mut MintAllowance,
    start: Instant,
    requests: Vec<(Option<u64>, u32)>,
) -> Vec<(Duration, u32, MintDecision)> {
    let mut at = Duration::ZERO;
    let mut last_retry = Duration::ZERO;
    let mut seen = Vec::new();
    for (gap_ms, g) in requests {
        at += gap_ms.map_or(last_retry, Duration::from_millis);
        let decision = mint.check(group(g), start + at);
        last_retry = decision.retry_after().unwrap_or(Duration::ZERO);
        seen.push((at, g, decision));
    }
    seen
}

const GROUPS: u32 = 24;

fn config() -> impl Strategy<Value = MintConfig> {
    // Capacity covers every group, so no group is forgotten early.
    (2..60u32, 1..12u32).prop_map(|(per_hour, per_address)| MintConfig {
        per_hour,
        per_address_per_hour: per_address,
        address_capacity: GROUPS as usize,
    })
}

proptest! {
    /// No closed one-hour interval holds more than the allowance, in total or
    /// for any one group.
    #[test]
    fn no_hour_exceeds_the_allowance(config in config(), requests in requests()) {
        let mut mint = MintAllowance::new(config.clone()).unwrap();
        let minted: Vec<(Duration, u32)> = drive(&mut mint, origin(), requests)
            .into_iter()
            .filter(|(_, _, decision)| decision.is_allowed())
            .map(|(at, g, _)| (at, g))
            .collect();
        // Every busiest window can be slid to start at a mint.
        for (i, &(from, _)) in minted.iter().enumerate() {
            let window = minted[i..].iter().take_while(|(t, _)| *t <= from + HOUR);
            let mut per_group: HashMap<u32, u32> = HashMap::new();
            let mut total = 0;
            for (_, g) in window {
                total += 1;
                *per_group.entry(*g).or_default() += 1;
            }
            prop_assert!(total <= config.per_hour, "{total} in the hour from {from:?}");
            prop_assert!(per_group.values().all(|&n| n <= config.per_address_per_hour));
        }
    }

    /// Honouring a Retry-After with no competitor succeeds; a second earlier
    /// would not have.
    #[test]
    fn every_retry_after_honoured_succeeds(config in config(), requests in requests()) {
        let mut mint = MintAllowance::new(config).unwrap();
        let start = origin();
        let mut at = Duration::ZERO;
        let mut last_retry = Duration::ZERO;
        for (gap_ms, g) in requests {
            at += gap_ms.map_or(last_retry, Duration::from_millis);
            let now = start + at;
            let decision = mint.check(group(g), now);
            last_retry = decision.retry_after().unwrap_or(Duration::ZERO);
            if let MintDecision::Refused { retry_after, .. } = decision {
                prop_assert!(retry_after >= secs(1));
                prop_assert_eq!(retry_after.subsec_nanos(), 0);
                prop_assert!(mint.clone().check(group(g), now + retry_after).is_allowed());
                if retry_after > secs(1) {
                    let early = now + retry_after - secs(1);
                    prop_assert!(!mint.clone().check(group(g), early).is_allowed());
                }
            }
        }
    }
}

mod address_window {
    use chrono::{DateTime, TimeDelta, Utc};
    use proptest::prelude::*;
    use tessera_admission::{AddressWindow, MintDecision, MintRefusal};

    const HOUR_MILLIS: i64 = 3_600_000;

    proptest! {
        /// The window and the refusal agree with the arithmetic a store keeps
        /// its count rows by: Unix milliseconds floored to the hour, and the
        /// wait to the window's end at least a second, rounded up.
        #[test]
        fn window_matches_the_stored_hour_arithmetic(
            nanos in -4_000_000_000_000_000_000_i64..4_000_000_000_000_000_000,
            stored in 0_u64..20,
            limit in 1_u32..15,
        ) {
            let now = DateTime::<Utc>::from_timestamp_nanos(nanos);
            let window = AddressWindow::containing(now);
            let start = now.timestamp_millis().div_euclid(HOUR_MILLIS) * HOUR_MILLIS;
            prop_assert_eq!(window.start().timestamp_millis(), start);
            prop_assert_eq!(window.end().timestamp_millis(), start + HOUR_MILLIS);
            prop_assert!(window.start() <= now && now < window.end());
            prop_assert_eq!(window.end() - window.start(), TimeDelta::hours(1));

            let decision = window.check(stored, limit, now);
            if stored < u64::from(limit) {
                prop_assert_eq!(decision, MintDecision::Allowed);
            } else {
                let wait = (window.end() - now)
                    .to_std()
                    .unwrap_or_default()
                    .max(std::time::Duration::from_secs(1));
                let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                prop_assert_eq!(
                    decision,
                    MintDecision::Refused {
                        retry_after: std::time::Duration::from_secs(seconds),
                        reason: MintRefusal::Address,
                    }
                );
            }
        }
    }
}
