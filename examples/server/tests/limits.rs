//! Each limit the OpenAPI document states is the one validation enforces:
//! for every input of `tessera_server::limits`, values on each side of
//! each boundary are accepted by the document exactly when the parser the
//! routes use accepts them, and the served document states no limit that
//! is not one of these inputs'.

use std::str::FromStr;

use regex::Regex;
use serde_json::Value;
use tessera_server::limits::{self, ALL, Input, Limit};
use tessera_store::lease::{AttemptNumber, IdempotencyKey};
use tessera_store::{
    AuditCursor, BriefVersion, FencingToken, KeyId, Namespace, PartitionKey, PrincipalId,
    QueueName, ScheduleName, TaskCursor, TaskId, UniqueKey,
};

/// `pattern`, compiled once.
fn compiled(pattern: &str) -> Regex {
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<String, Regex>> =
            std::cell::RefCell::default();
    }
    CACHE.with(|cache| {
        cache
            .borrow_mut()
            .entry(pattern.to_owned())
            .or_insert_with(|| Regex::new(pattern).unwrap())
            .clone()
    })
}

/// Whether `value` is valid by `schema`, for the keywords the document
/// uses: type, pattern, lengths (in characters), enum, minimum, maximum.
fn documented(schema: &Value, value: &Value) -> bool {
    match schema["type"].as_str() {
        Some("string") => {
            let Some(text) = value.as_str() else {
                return false;
            };
            let chars = text.chars().count() as u64;
            if schema["minLength"].as_u64().is_some_and(|min| chars < min)
                || schema["maxLength"].as_u64().is_some_and(|max| chars > max)
            {
                return false;
            }
            if let Some(pattern) = schema["pattern"].as_str() {
                if !compiled(pattern).is_match(text) {
                    return false;
                }
            }
            if let Some(words) = schema["enum"].as_array() {
                return words.contains(value);
            }
            if schema["format"] == "date-time" {
                return chrono::DateTime::parse_from_rfc3339(text).is_ok();
            }
            true
        }
        Some("integer") => {
            let Some(number) = value.as_i64() else {
                return false;
            };
            schema["minimum"].as_i64().is_none_or(|min| number >= min)
                && schema["maximum"].as_i64().is_none_or(|max| number <= max)
        }
        other => panic!("no rule for {other:?}"),
    }
}

/// What the server's validation says of `value` for `input`: the parser
/// its routes call.
fn enforced(input: Input, value: &Value) -> bool {
    let text = |parse: &dyn Fn(&str) -> bool| value.as_str().is_some_and(parse);
    let number = |parse: &dyn Fn(i64) -> bool| {
        value
            .as_i64()
            .is_some_and(|n| input.integer(n).is_ok() && parse(n))
    };
    match input {
        i if i == limits::NAMESPACE => text(&|s| Namespace::parse(s).is_ok()),
        i if i == limits::QUEUE => text(&|s| QueueName::parse(s).is_ok()),
        i if i == limits::TASK || i == limits::TASK_ID => text(&|s| TaskId::parse(s).is_ok()),
        i if i == limits::PARTITION_KEY => text(&|s| PartitionKey::parse(s).is_ok()),
        i if i == limits::UNIQUE_KEY => text(&|s| UniqueKey::parse(s).is_ok()),
        i if i == limits::UNIQUE_MODE => text(&|s| {
            let delays = (s == "debounce").then_some(1);
            limits::unique_mode(s, delays, delays).is_ok()
        }),
        i if i == limits::RUN_AFTER => text(&|s| limits::run_after(s).is_ok()),
        i if i == limits::IDEMPOTENCY_KEY => text(&|s| IdempotencyKey::parse(s).is_ok()),
        i if i == limits::KEY_ID => text(&|s| KeyId::parse(s).is_ok()),
        i if i == limits::PRINCIPAL => text(&|s| PrincipalId::parse(s).is_ok()),
        i if i == limits::AUDIT_CURSOR => {
            text(&|s| input.cursor(s).is_ok() && AuditCursor::from_str(s).is_ok())
        }
        i if i == limits::TASK_CURSOR => {
            text(&|s| input.cursor(s).is_ok() && TaskCursor::from_str(s).is_ok())
        }
        i if i == limits::SCHEDULE => text(&|s| ScheduleName::parse(s).is_ok()),
        i if i == limits::BOARD_QUEUE => text(&|s| s.is_empty() || QueueName::parse(s).is_ok()),
        i if i == limits::BOARD_PARTITION_KEY => {
            text(&|s| s.is_empty() || PartitionKey::parse(s).is_ok())
        }
        i if i == limits::WITHIN => text(&|s| limits::within(s).is_ok()),
        i if i == limits::ACCOUNT
            || i == limits::LABEL
            || i == limits::ERROR_TEXT
            || i == limits::CRON
            || i == limits::ZONE
            || i == limits::BOARD_KEY =>
        {
            text(&|s| input.text(s).is_ok())
        }
        i if i == limits::SCOPE => text(&|s| limits::scope(s).is_ok()),
        i if i == limits::GRANT => text(&|s| limits::grant(s).is_ok()),
        i if i == limits::STATE => text(&|s| limits::state(s).is_ok()),
        i if i == limits::ORDER => text(&|s| limits::order(s).is_ok()),
        i if i == limits::RETRY => text(&|s| limits::retry(s, 0).is_ok()),
        i if i == limits::TIME => text(&|s| s.parse::<chrono::DateTime<chrono::Utc>>().is_ok()),
        i if i == limits::VERSION => {
            number(&|n| u32::try_from(n).is_ok_and(|n| BriefVersion::new(n).is_ok()))
        }
        i if i == limits::TOKEN => number(&|n| FencingToken::new(n).is_ok()),
        i if i == limits::ATTEMPT => {
            number(&|n| u16::try_from(n).is_ok_and(|n| AttemptNumber::new(n).is_ok()))
        }
        i if matches!(i.limit, Limit::Integer { .. }) => number(&|_| true),
        other => panic!("no parser named for {other:?}"),
    }
}

/// Values on each side of every boundary `input` could have.
fn samples(input: Input) -> Vec<Value> {
    let mut strings: Vec<String> = Vec::new();
    // Every string of up to three characters over an alphabet that meets
    // each rule: letters, digits, the name punctuation, a slash, a space,
    // a colon, a star, and a character outside ASCII.
    let alphabet = [
        'a', 'F', '0', '9', '.', '-', '_', '/', ' ', ':', '*', 'p', 'é',
    ];
    strings.push(String::new());
    for a in alphabet {
        strings.push(a.to_string());
        for b in alphabet {
            strings.push(format!("{a}{b}"));
            for c in alphabet {
                strings.push(format!("{a}{b}{c}"));
            }
        }
    }
    for len in [15, 16, 17, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049] {
        strings.push("a".repeat(len));
        strings.push("7".repeat(len));
        strings.push(format!("p{}", "1".repeat(len)));
        strings.push(format!("{}.1", "1".repeat(len.min(30))));
        strings.push(format!("namespace:{}", "n".repeat(len)));
    }
    strings.extend(
        [
            "0123456789abcdef",
            "0123456789ABCDEF",
            "0123456789abcdeg",
            "12.3",
            "-12.3",
            "12.-3",
            "1.65535",
            "1.9999",
            "1.99999",
            "123456789012345678.1",
            "1234567890123456789.1",
            "namespace:*",
            "namespace:a.b",
            "namespace:a..b",
            "namespace:",
            "admin",
            "2026-10-29T12:00:00Z",
            "2026-10-29T12:00:00+02:00",
            "2026-10-29",
            "yesterday",
        ]
        .map(str::to_owned),
    );
    if let Limit::OneOf(words) = input.limit {
        strings.extend(words.iter().map(|word| (*word).to_owned()));
        strings.extend(words.iter().map(|word| word.to_uppercase()));
    }
    let mut values: Vec<Value> = strings.into_iter().map(Value::String).collect();
    let mut numbers = vec![i64::MIN, -1, 0, 1, 2, i64::MAX];
    if let Limit::Integer { minimum, maximum } = input.limit {
        for n in [minimum, maximum] {
            numbers.extend([n.saturating_sub(1), n, n.saturating_add(1)]);
        }
    }
    for bound in [u16::MAX as i64, u32::MAX as i64] {
        numbers.extend([bound, bound + 1]);
    }
    values.extend(numbers.into_iter().map(Value::from));
    values
}

#[test]
fn each_documented_limit_is_the_enforced_one() {
    for input in ALL {
        let schema = input.schema();
        let mut accepted = 0;
        for value in samples(*input) {
            let (said, done) = (documented(&schema, &value), enforced(*input, &value));
            assert_eq!(
                said,
                done,
                "{}: {value} is {} by the document and {} by validation ({schema})",
                input.name,
                if said { "accepted" } else { "refused" },
                if done { "accepted" } else { "refused" },
            );
            accepted += usize::from(said);
        }
        assert!(accepted > 0, "{}: some sample is valid", input.name);
    }
}

/// Every schema in `value` that states a limit.
fn limited_schemas<'a>(value: &'a Value, found: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            let limits = [
                "pattern",
                "enum",
                "minimum",
                "maximum",
                "minLength",
                "maxLength",
            ];
            if limits.iter().any(|key| map.contains_key(*key)) && map.contains_key("type") {
                found.push(value);
            }
            map.values().for_each(|inner| limited_schemas(inner, found));
        }
        Value::Array(items) => items.iter().for_each(|inner| limited_schemas(inner, found)),
        _ => {}
    }
}

#[test]
fn the_document_states_no_limit_but_the_table_s() {
    let document = tessera_server::document();
    let mut found = Vec::new();
    limited_schemas(&document, &mut found);
    let known: Vec<Value> = ALL.iter().map(Input::schema).collect();
    // The long-poll's answer enumerates its outcomes; that is output.
    let outcome = serde_json::json!({ "type": "string", "enum": ["work_available", "timed_out"] });
    for schema in found {
        let mut schema = schema.clone();
        if let Some(map) = schema.as_object_mut() {
            // A nullable field's enum lists null too.
            if map.remove("nullable").is_some() {
                if let Some(values) = map.get_mut("enum").and_then(Value::as_array_mut) {
                    values.retain(|value| !value.is_null());
                }
            }
        }
        let schema = &schema;
        assert!(
            known.contains(schema) || *schema == outcome,
            "a limit not from the table: {schema}"
        );
    }
    // And the inputs the issue named are there, with their limits.
    let text = document.to_string();
    for needle in [
        limits::NAME_PATTERN,
        "\"maxLength\":64",
        "\"maximum\":32",
        "\"enum\":[\"enqueue\",\"claim\",\"read\"]",
    ] {
        assert!(text.contains(&needle.replace('\\', "\\\\")), "{needle}");
    }
}

/// The server's ranges for what the store checks again (competing
/// attempts, priority, tries, a batch claim's size) are the store's own:
/// the largest the document allows is accepted by the store too.
#[test]
fn the_store_accepts_the_largest_value_each_range_documents() {
    use tessera_store::{Brief, EnqueueOptions, Store, StoreConfig};
    let max = |input: Input| match input.limit {
        Limit::Integer { maximum, .. } => maximum,
        _ => unreachable!(),
    };
    let store = Store::open_in_memory(StoreConfig::default()).unwrap();
    let admin = store.create_admin_key("ops").unwrap();
    let admin = store.authenticate(Some(admin.secret.expose())).unwrap();
    let (ns, queue) = (
        Namespace::parse("renders").unwrap(),
        QueueName::parse("frames").unwrap(),
    );
    let options = EnqueueOptions::default()
        .with_alternatives(max(limits::ALTERNATIVES) as u16)
        .with_priority(max(limits::PRIORITY) as u8)
        .with_max_tries(max(limits::MAX_TRIES_INPUT) as u32);
    store
        .enqueue(
            &admin,
            &ns,
            &queue,
            &Brief::Json(serde_json::json!(1)),
            &options,
        )
        .unwrap();
    let batch = store
        .claim_batch(&admin, &ns, &queue, max(limits::CLAIM_COUNT) as usize)
        .unwrap();
    assert_eq!(batch.claimed.len(), 1, "one attempt of the task per batch");
    let over = store.claim_batch(&admin, &ns, &queue, max(limits::CLAIM_COUNT) as usize + 1);
    assert!(
        over.is_err(),
        "one past the documented batch size is refused"
    );
}
