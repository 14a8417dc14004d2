//! What a store tells `tracing` and `metrics` (features `tracing` and
//! `metrics`): claims granted, empty and rejected with their reason, the
//! gate's gauges, limit changes and quota refusals, seen by a subscriber
//! and a recorder of the test's own.
#![cfg(all(feature = "tracing", feature = "metrics", feature = "sqlite"))]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tessera_store::{
    AdmissionConfig, Brief, ClaimOutcome, ClaimStart, EnqueueOptions, Grant, KeySpec, ManualClock,
    Namespace, QueueName, Scope, Store, StoreConfig,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};

/// Every metric by its name and labels, e.g. `tessera_claims_rejected_total{reason=queue_full}`.
#[derive(Default)]
struct Metrics(Mutex<HashMap<String, Arc<Value>>>);

#[derive(Default)]
struct Value(AtomicU64);

impl CounterFn for Value {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl GaugeFn for Value {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        self.0.store(value as u64, Ordering::SeqCst);
    }
}

impl HistogramFn for Value {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Metrics {
    fn value(&self, key: &Key) -> Arc<Value> {
        let mut name = key.name().to_owned();
        for label in key.labels() {
            write!(name, "{{{}={}}}", label.key(), label.value()).unwrap();
        }
        Arc::clone(self.0.lock().unwrap().entry(name).or_default())
    }

    fn read(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |v| v.0.load(Ordering::SeqCst))
    }
}

impl Recorder for &'static Metrics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.value(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.value(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.value(key))
    }
}

/// Every event's fields as text, and every span's name and fields.
#[derive(Default)]
struct Capture {
    events: Mutex<Vec<String>>,
    spans: Mutex<Vec<String>>,
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        write!(self.0, "{}={:?} ", field.name(), value).unwrap();
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut text = Text(format!("{} ", span.metadata().name()));
        span.record(&mut text);
        let mut spans = self.spans.lock().unwrap();
        spans.push(text.0);
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.events.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<&'static Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let metrics: &'static Metrics = Box::leak(Box::default());
        metrics::set_global_recorder(metrics).expect("the only recorder");
        metrics
    })
}

#[test]
fn claims_and_their_refusals_reach_the_subscriber_and_the_recorder() {
    let metrics = metrics();
    let capture = Arc::new(Capture::default());
    let clock = ManualClock::new("2026-10-29T12:00:00Z".parse().unwrap());
    let config = StoreConfig::default()
        .with_clock(Arc::new(clock.clone()))
        .with_admission(AdmissionConfig {
            initial_concurrency: 1,
            max_pending: 1,
            max_wait: Duration::from_secs(30),
            ..AdmissionConfig::default()
        });
    let store = Store::open_in_memory(config).unwrap();
    tracing::subscriber::with_default(Arc::clone(&capture), || {
        let admin_key = store.create_admin_key("ops").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let key = store
            .create_key(
                &admin,
                &KeySpec::keyed("acme")
                    .with_scopes(Scope::ALL.iter().copied())
                    .with_grant(Grant::AllNamespaces),
            )
            .unwrap();
        let worker = store.authenticate(Some(key.secret.expose())).unwrap();
        let (ns, q) = (
            Namespace::parse("renders").unwrap(),
            QueueName::parse("jobs").unwrap(),
        );
        store
            .enqueue(
                &worker,
                &ns,
                &q,
                &Brief::Bytes(b"x".to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap();
        assert!(matches!(
            store.claim(&worker, &ns, &q).unwrap(),
            ClaimOutcome::Granted(_)
        ));
        assert!(matches!(
            store.claim(&worker, &ns, &q).unwrap(),
            ClaimOutcome::Empty { .. }
        ));
        // The window (1) held, the waiting room (1) full: the next is 429.
        let ClaimStart::Admitted(held) = store.begin_claim(&worker, &ns, &q).unwrap() else {
            panic!("room for one");
        };
        let ClaimStart::Queued(_) = store.begin_claim(&worker, &ns, &q).unwrap() else {
            panic!("a waiting slot");
        };
        let full = store.begin_claim(&worker, &ns, &q).unwrap_err();
        assert_eq!(full.status(), 429);
        drop(held);
        assert!(store.poll_claim_event().is_some());
    });

    assert_eq!(metrics.read("tessera_claims_granted_total"), 1);
    assert_eq!(metrics.read("tessera_claims_empty_total"), 1);
    assert_eq!(
        metrics.read("tessera_claims_rejected_total{reason=queue_full}"),
        1
    );
    assert_eq!(
        metrics.read("tessera_claim_service_seconds"),
        2,
        "two lease transactions"
    );
    assert_eq!(metrics.read("tessera_claim_limit"), 1);
    let events = capture.events.lock().unwrap().join("\n");
    assert!(events.contains("claim granted"), "{events}");
    assert!(events.contains("claim rejected"), "{events}");
    assert!(events.contains("pending claim queue is full"), "{events}");
    assert!(events.contains("claim queued for admission"), "{events}");
    let spans = capture.spans.lock().unwrap().join("\n");
    assert!(spans.contains("action=\"enqueue\""), "{spans}");
    assert!(spans.contains("namespace=\"renders\""), "{spans}");
    assert!(!spans.contains("tsk_"), "no secret in a span: {spans}");
}
