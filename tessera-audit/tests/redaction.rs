//! No secret, key or raw address reaches any printed or serialized form.

use std::{marker::PhantomData, num::NonZeroUsize};

use chrono::{TimeDelta, TimeZone, Utc};
use serde::Serialize;
use tessera_audit::*;

const CANARY: &[u8] = b"canary-secret-7f3a9c-never-print";
const ADDRESS: [u8; 4] = [192, 0, 2, 1];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn assert_clean(label: &str, text: &str) {
    let forbidden = [
        String::from_utf8(CANARY.to_vec()).unwrap(),
        hex(CANARY),
        "canary".to_owned(),
        "192.0.2.1".to_owned(),
        hex(&ADDRESS),
        format!("{ADDRESS:?}"),
    ];
    for needle in &forbidden {
        assert!(
            !text.contains(needle.as_str()),
            "{label} leaks {needle:?}: {text}"
        );
    }
}

// Method resolution prefers the inherent method, which exists only for
// `Serialize` types; every other type falls back to the trait's `false`.
struct Probe<T>(PhantomData<T>);
trait NotSerialize {
    fn is_serialize(&self) -> bool {
        false
    }
}
impl<T> NotSerialize for Probe<T> {}
impl<T: Serialize> Probe<T> {
    #[allow(dead_code)]
    fn is_serialize(&self) -> bool {
        true
    }
}

#[test]
fn the_probe_tells_serialize_apart() {
    assert!(Probe::<AuditEvent>(PhantomData).is_serialize());
    assert!(!Probe::<Secret>(PhantomData).is_serialize());
    assert!(!Probe::<AddressHasher>(PhantomData).is_serialize());
}

#[test]
fn a_secret_never_appears_in_any_form() {
    let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 30).unwrap();
    let secret = Secret::new(CANARY).unwrap();
    let hasher = AddressHasher::new(secret.clone());
    let ip_hash = hasher.hash(&ADDRESS, now);
    let principal = Principal::new("worker-7").unwrap();
    let namespace = Namespace::new("main").unwrap();
    let event = AuditEvent::new(now, principal.clone(), namespace.clone(), Action::Submit)
        .with_resource(Resource::new("run:42").unwrap())
        .with_ip_hash(ip_hash.clone());

    let mut counters = CounterBuffer::new();
    let key = CounterKey::new(
        now,
        Some(principal.clone()),
        namespace,
        Action::Claim,
        Outcome::Forbidden,
    );
    counters.increment(key.clone());
    let batch = counters.take_all().unwrap();
    let counter = batch.counters()[0].clone();

    let mut coalescer = ObservationCoalescer::new(NonZeroUsize::new(4).unwrap());
    let _ = coalescer.observe(&principal, &("acme", "keyed"), now);
    coalescer.written(&principal, now);
    let mut schedule = RetentionSchedule::new();
    let run = schedule.start(now + TimeDelta::hours(30)).unwrap();

    let short = Secret::new(&CANARY[..8]).unwrap_err();
    let bad_identifier = Principal::new("canary\n").unwrap_err();
    let bad_hash = "192.0.2.1".parse::<IpHash>().unwrap_err();

    let printed = [
        ("secret debug", format!("{secret:?}")),
        ("secret alternate debug", format!("{secret:#?}")),
        ("secret display", secret.to_string()),
        ("hasher debug", format!("{hasher:#?}")),
        ("ip hash debug", format!("{ip_hash:?}")),
        ("ip hash display", ip_hash.to_string()),
        ("event debug", format!("{event:#?}")),
        ("counter key debug", format!("{key:?}")),
        ("batch debug", format!("{batch:?}")),
        ("buffer debug", format!("{counters:?}")),
        ("coalescer debug", format!("{coalescer:?}")),
        ("schedule debug", format!("{schedule:?} {run:?}")),
        ("short secret error", format!("{short} {short:?}")),
        (
            "identifier error",
            format!("{bad_identifier} {bad_identifier:?}"),
        ),
        ("ip hash error", format!("{bad_hash} {bad_hash:?}")),
        ("event json", serde_json::to_string(&event).unwrap()),
        ("counter json", serde_json::to_string(&counter).unwrap()),
        ("ip hash json", serde_json::to_string(&ip_hash).unwrap()),
    ];
    for (label, text) in &printed {
        assert_clean(label, text);
    }
    assert_eq!(
        format!("{hasher:?}"),
        "AddressHasher { secret: [redacted] }"
    );
    counters.written(batch);
}

#[test]
fn an_event_reads_back_from_its_json() {
    let now = Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 30).unwrap();
    let hasher = AddressHasher::new(Secret::new(CANARY).unwrap());
    let event = AuditEvent::new(
        now,
        Principal::new("worker-7").unwrap(),
        Namespace::new("main").unwrap(),
        Action::ReadReceipt,
    )
    .with_resource(Resource::new("run:42").unwrap())
    .with_ip_hash(hasher.hash(&ADDRESS, now));
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["action"], "read_receipt");
    assert_eq!(json["outcome"], "ok");
    assert_eq!(json["resource"], "run:42");
    assert_eq!(
        serde_json::from_value::<AuditEvent>(json.clone()).unwrap(),
        event
    );

    let mut raw_address = json;
    raw_address["ip_hash"] = "192.0.2.1".into();
    assert!(serde_json::from_value::<AuditEvent>(raw_address).is_err());
}
