//! Admission settings: defaults, the environment, validation and serde.

use std::collections::HashMap;
use std::time::Duration;

use tessera_admission::{Admission, AdmissionConfig, ConfigError};

fn lookup(pairs: &[(&str, &str)]) -> Result<AdmissionConfig, ConfigError> {
    let vars: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    AdmissionConfig::from_lookup(|name| vars.get(name).cloned())
}

#[test]
fn unset_variables_keep_the_defaults() {
    assert_eq!(lookup(&[]).unwrap(), AdmissionConfig::default());
}

#[test]
fn every_variable_is_read() {
    let config = lookup(&[
        ("TESSERA_CLAIM_INITIAL_CONCURRENCY", "8"),
        ("TESSERA_CLAIM_MAX_CONCURRENCY", "64"),
        ("TESSERA_CLAIM_MIN_CONCURRENCY", "2"),
        ("TESSERA_CLAIM_MAX_PENDING", "100"),
        ("TESSERA_CLAIM_MAX_WAIT_SECONDS", "2.5"),
        ("TESSERA_CLAIM_TARGET_SECONDS", " 0.25 "),
        ("TESSERA_CLAIMS_PER_MINUTE", "60"),
        ("TESSERA_CLAIM_EWMA_WEIGHT", "0.5"),
    ])
    .unwrap();
    assert_eq!(
        config,
        AdmissionConfig {
            initial_concurrency: 8,
            max_concurrency: 64,
            min_concurrency: 2,
            max_pending: 100,
            max_wait: Duration::from_millis(2500),
            target: Duration::from_millis(250),
            claims_per_minute: 60,
            ewma_weight: 0.5,
        }
    );
}

#[test]
fn invalid_values_name_the_variable_and_the_value() {
    let cases = [
        ("TESSERA_CLAIM_INITIAL_CONCURRENCY", "0"),
        ("TESSERA_CLAIM_INITIAL_CONCURRENCY", "-4"),
        ("TESSERA_CLAIM_INITIAL_CONCURRENCY", "lots"),
        ("TESSERA_CLAIM_MAX_CONCURRENCY", "0"),
        ("TESSERA_CLAIM_MAX_CONCURRENCY", "99999999999"),
        ("TESSERA_CLAIM_MIN_CONCURRENCY", "0"),
        ("TESSERA_CLAIM_MAX_PENDING", "0"),
        ("TESSERA_CLAIM_MAX_PENDING", ""),
        ("TESSERA_CLAIM_MAX_WAIT_SECONDS", "0"),
        ("TESSERA_CLAIM_MAX_WAIT_SECONDS", "-1"),
        ("TESSERA_CLAIM_MAX_WAIT_SECONDS", "NaN"),
        ("TESSERA_CLAIM_MAX_WAIT_SECONDS", "inf"),
        ("TESSERA_CLAIM_TARGET_SECONDS", "500ms"),
        ("TESSERA_CLAIM_TARGET_SECONDS", "0.0"),
        ("TESSERA_CLAIMS_PER_MINUTE", "-1"),
        ("TESSERA_CLAIMS_PER_MINUTE", "1.5"),
        ("TESSERA_CLAIM_EWMA_WEIGHT", "0"),
        ("TESSERA_CLAIM_EWMA_WEIGHT", "1.5"),
    ];
    for (name, value) in cases {
        let error = lookup(&[(name, value)]).unwrap_err();
        assert_eq!((error.name(), error.value()), (name, value), "{error}");
        assert!(error.to_string().contains(name), "{error}");
    }
}

#[test]
fn zero_claims_per_minute_is_valid_and_means_off() {
    let config = lookup(&[("TESSERA_CLAIMS_PER_MINUTE", "0")]).unwrap();
    assert_eq!(config.claims_per_minute, 0);
}

#[test]
fn an_initial_concurrency_above_the_maximum_names_both() {
    let error = lookup(&[
        ("TESSERA_CLAIM_INITIAL_CONCURRENCY", "64"),
        ("TESSERA_CLAIM_MAX_CONCURRENCY", "16"),
    ])
    .unwrap_err();
    assert_eq!(
        error,
        ConfigError::Exceeds {
            name: "TESSERA_CLAIM_INITIAL_CONCURRENCY",
            value: "64".into(),
            other: "TESSERA_CLAIM_MAX_CONCURRENCY",
            other_value: "16".into(),
        }
    );
    // The default maximum counts too.
    let error = lookup(&[("TESSERA_CLAIM_INITIAL_CONCURRENCY", "2000")]).unwrap_err();
    assert_eq!(error.name(), "TESSERA_CLAIM_INITIAL_CONCURRENCY");
    let error = lookup(&[("TESSERA_CLAIM_MIN_CONCURRENCY", "33")]).unwrap_err();
    assert_eq!(
        (error.name(), error.value()),
        ("TESSERA_CLAIM_MIN_CONCURRENCY", "33")
    );
}

#[test]
fn validate_names_fields_and_new_refuses_an_invalid_config() {
    let invalid = [
        AdmissionConfig {
            initial_concurrency: 0,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            max_pending: 0,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            max_wait: Duration::ZERO,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            target: Duration::ZERO,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            ewma_weight: f64::NAN,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            initial_concurrency: 2048,
            ..AdmissionConfig::default()
        },
        AdmissionConfig {
            min_concurrency: 64,
            ..AdmissionConfig::default()
        },
    ];
    let names = [
        "initial_concurrency",
        "max_pending",
        "max_wait",
        "target",
        "ewma_weight",
        "initial_concurrency",
        "min_concurrency",
    ];
    let now = start();
    for (config, name) in invalid.into_iter().zip(names) {
        assert_eq!(config.validate().unwrap_err().name(), name);
        assert_eq!(Admission::<u64>::new(config, now).unwrap_err().name(), name);
    }
}

#[test]
fn serde_uses_seconds_defaults_and_refuses_unknown_fields() {
    let config = AdmissionConfig::default();
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["max_wait"], 10.0);
    assert_eq!(json["target"], 0.5);
    assert_eq!(
        serde_json::from_value::<AdmissionConfig>(json).unwrap(),
        config
    );
    let partial: AdmissionConfig =
        serde_json::from_str(r#"{ "max_pending": 10, "max_wait": 0.75 }"#).unwrap();
    assert_eq!(partial.max_pending, 10);
    assert_eq!(partial.max_wait, Duration::from_millis(750));
    assert_eq!(partial.initial_concurrency, 32);
    assert!(serde_json::from_str::<AdmissionConfig>(r#"{ "max_pendng": 10 }"#).is_err());
    assert!(serde_json::from_str::<AdmissionConfig>(r#"{ "max_wait": -1 }"#).is_err());
}

/// Tests start at a real instant and move time by hand from there.
#[allow(clippy::disallowed_methods)]
fn start() -> std::time::Instant {
    std::time::Instant::now()
}
