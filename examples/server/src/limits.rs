//! One definition of each input's limits, for validation and for the
//! OpenAPI document alike.
//!
//! A string input is checked by the library's own parser (a
//! [`Namespace`], a [`KeyId`](tessera_store::KeyId), …); its entry
//! here transcribes that parser's rule into a pattern and lengths built
//! from the library's constants, and a test proves the two agree on
//! every boundary. A number is checked here, by [`Input::integer`], with
//! the same range the document states.

use serde_json::Value;
use serde_json::json;
use tessera_store::lease::MAX_UNIQUE_WINDOW;
use tessera_store::lease::{IdempotencyKey, StateName};
use tessera_store::limits::{
    MAX_ACCOUNT_LEN, MAX_ALTERNATIVES, MAX_AUDIT_ROWS, MAX_CLAIM_BATCH, MAX_ENQUEUE_BATCH,
    MAX_ERROR_BYTES, MAX_KEYS_LISTED, MAX_LABEL_LEN, MAX_LONG_POLL, MAX_PRIORITY,
    MAX_SCHEDULES_LISTED, MAX_SUBMIT_BATCH, MAX_TASKS_LISTED, MAX_TRIES,
};
use tessera_store::{
    Error, Grant, ListOrder, Namespace, PartitionKey, QueueName, Retry, ScheduleName, Scope,
    TaskId, UniqueKey, UniqueMode,
};

/// A name's rule ([`tessera_store::lease`] names): letters, digits, `-`,
/// `_`, and single dots between them.
pub const NAME_PATTERN: &str = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$";

/// Printable ASCII, as accounts, labels and error texts are here.
pub const TEXT_PATTERN: &str = "^[ -~]*$";

/// A grant's rule: `namespace:*` or `namespace:<name>` (the admin grant
/// comes with an admin key, `"admin": true`).
pub const GRANT_PATTERN: &str = r"^(namespace:\*|namespace:[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)$";

/// What one input accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A name ([`NAME_PATTERN`]), 1 to `max_len` bytes.
    Name {
        /// The longest, in bytes.
        max_len: usize,
    },
    /// A name ([`NAME_PATTERN`]) of at most `max_len` bytes, or empty for
    /// none: a filter field an HTML form sends empty when it is not set.
    NameOrEmpty {
        /// The longest, in bytes.
        max_len: usize,
    },
    /// Text of printable ASCII, `min_len` to `max_len` bytes.
    Text {
        /// The shortest.
        min_len: usize,
        /// The longest.
        max_len: usize,
    },
    /// Text matching `pattern` whole (its length is in the pattern).
    Pattern {
        /// The regular expression.
        pattern: &'static str,
    },
    /// A page cursor as a listing gives it: two whole numbers joined by
    /// a dot, the first signed, each of at most 18 digits (the second of
    /// at most `second_digits`, signed if `second_signed`).
    Cursor {
        /// The most digits of the second number.
        second_digits: usize,
        /// Whether the second number may be negative.
        second_signed: bool,
    },
    /// A grant: `namespace:*` or `namespace:<name>`.
    Grant,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A whole number from `minimum` to `maximum`.
    Integer {
        /// The least.
        minimum: i64,
        /// The most.
        maximum: i64,
    },
    /// An RFC 3339 time.
    Time,
}

/// An input: where it appears, its name there, and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    /// The name in the document: a property, parameter or header name.
    pub name: &'static str,
    /// What it accepts.
    pub limit: Limit,
}

const fn name(name: &'static str, max_len: usize) -> Input {
    Input {
        name,
        limit: Limit::Name { max_len },
    }
}

const fn integer(name: &'static str, minimum: i64, maximum: i64) -> Input {
    Input {
        name,
        limit: Limit::Integer { minimum, maximum },
    }
}

/// A namespace, in a path.
pub const NAMESPACE: Input = name("ns", Namespace::MAX_LEN);
/// A queue, in a path.
pub const QUEUE: Input = name("queue", QueueName::MAX_LEN);
/// A task id, in a path or a body.
pub const TASK: Input = name("task", TaskId::MAX_LEN);
/// A task id chosen at enqueue.
pub const TASK_ID: Input = name("id", TaskId::MAX_LEN);
/// A task's partition key, set at enqueue.
pub const PARTITION_KEY: Input = name("partition_key", PartitionKey::MAX_LEN);
/// A unique task's key.
pub const UNIQUE_KEY: Input = name("key", UniqueKey::MAX_LEN);
/// What a unique task's duplicate does.
pub const UNIQUE_MODE: Input = Input {
    name: "mode",
    limit: Limit::OneOf(&["keep", "replace", "debounce"]),
};
/// When a task with parents runs.
pub const RUN_AFTER: Input = Input {
    name: "run_after",
    limit: Limit::OneOf(&["all_done", "any_outcome"]),
};
/// A uniqueness window, in milliseconds.
pub const UNIQUE_WINDOW_MS: Input = integer("window_ms", 1, MAX_UNIQUE_WINDOW.as_millis() as i64);
/// A debounce's delay after the last duplicate, in milliseconds.
pub const DEBOUNCE_MS: Input = integer("delay_ms", 1, MAX_UNIQUE_WINDOW.as_millis() as i64);
/// A debounce's latest run after the first enqueue, in milliseconds.
pub const MAX_DEBOUNCE_MS: Input = integer("max_delay_ms", 1, MAX_UNIQUE_WINDOW.as_millis() as i64);
/// The `Idempotency-Key` header of a submit.
pub const IDEMPOTENCY_KEY: Input = name("Idempotency-Key", IdempotencyKey::MAX_LEN);
/// A key id: 16 lowercase hex digits.
pub const KEY_ID: Input = Input {
    name: "key_id",
    limit: Limit::Pattern {
        pattern: "^[0-9a-f]{16}$",
    },
};
/// A principal id: `p` and its number.
pub const PRINCIPAL: Input = Input {
    name: "principal",
    limit: Limit::Pattern {
        pattern: "^p[0-9]{1,18}$",
    },
};
/// An audit page's cursor: the `next` of the page before.
pub const AUDIT_CURSOR: Input = Input {
    name: "before",
    limit: Limit::Cursor {
        second_digits: 18,
        second_signed: true,
    },
};
/// A task listing's cursor: the `next` of the page before.
pub const TASK_CURSOR: Input = Input {
    name: "after",
    limit: Limit::Cursor {
        second_digits: 4,
        second_signed: false,
    },
};
/// A key's account.
pub const ACCOUNT: Input = Input {
    name: "account",
    limit: Limit::Text {
        min_len: 1,
        max_len: MAX_ACCOUNT_LEN,
    },
};
/// A key's label.
pub const LABEL: Input = Input {
    name: "label",
    limit: Limit::Text {
        min_len: 0,
        max_len: MAX_LABEL_LEN,
    },
};
/// A failure's error text.
pub const ERROR_TEXT: Input = Input {
    name: "error",
    limit: Limit::Text {
        min_len: 0,
        max_len: MAX_ERROR_BYTES,
    },
};
/// A scope a key holds.
pub const SCOPE: Input = Input {
    name: "scopes",
    limit: Limit::OneOf(&["enqueue", "claim", "read"]),
};
/// The most scopes one request names: one of each.
pub const MAX_SCOPES: usize = 3;
/// The most grants one request names.
pub const MAX_GRANTS: usize = 16;

/// Checks a list's length against `max`, as the document's `maxItems`.
pub fn at_most<T>(name: &str, items: Vec<T>, max: usize) -> Result<Vec<T>, Error> {
    if items.len() > max {
        return Err(Error::InvalidInput {
            reason: format!("{name} holds {} items, at most {max}", items.len()),
        });
    }
    Ok(items)
}

/// A grant a key holds.
pub const GRANT: Input = Input {
    name: "grants",
    limit: Limit::Grant,
};
/// A task state, to list by.
pub const STATE: Input = Input {
    name: "state",
    limit: Limit::OneOf(&[
        "ready",
        "leased",
        "done",
        "failed",
        "backoff",
        "discarded",
        "scheduled",
        "cancelled",
        "waiting",
    ]),
};
/// A listing's order.
pub const ORDER: Input = Input {
    name: "order",
    limit: Limit::OneOf(&["oldest", "newest"]),
};
/// A failure's retry: `snooze` steps back without spending the try.
pub const RETRY: Input = Input {
    name: "retry",
    limit: Limit::OneOf(&["never", "backoff", "after", "snooze"]),
};
/// A brief's version.
pub const VERSION: Input = integer("version", 1, u32::MAX as i64);
/// A fencing token.
pub const TOKEN: Input = integer("token", 1, i64::MAX);
/// An attempt number.
pub const ATTEMPT: Input = integer("attempt", 1, u16::MAX as i64);
/// Competing attempts of a brief.
pub const ALTERNATIVES: Input = integer("alternatives", 1, MAX_ALTERNATIVES as i64);
/// A task's priority.
pub const PRIORITY: Input = integer("priority", 0, MAX_PRIORITY as i64);
/// A task's tries.
pub const MAX_TRIES_INPUT: Input = integer("max_tries", 1, MAX_TRIES as i64);
/// A queue's concurrency limit in all; 0 or null is none.
pub const QUEUE_LIMIT: Input = integer("queue", 0, u32::MAX as i64);
/// A queue's concurrency limit per partition key; 0 or null is none.
pub const PARTITION_LIMIT: Input = integer("per_partition", 0, u32::MAX as i64);
/// How long a queue keeps finished tasks of one final state, in
/// milliseconds; null keeps them for good.
pub const KEEP_MS: Input = integer(
    "keep_ms",
    0,
    tessera_store::Retention::MAX.as_millis() as i64,
);
/// A task's own lease length, in milliseconds.
pub const LEASE_MS: Input = integer(
    "lease_ms",
    1,
    tessera_store::lease::MAX_LEASE_DURATION.as_millis() as i64,
);
/// A task's deadline after its enqueue, in milliseconds (at most ten
/// years).
pub const TASK_TIMEOUT_MS: Input = integer(
    "timeout_ms",
    1,
    tessera_store::Retention::MAX.as_millis() as i64,
);
/// Tasks in one claim.
pub const CLAIM_COUNT: Input = integer("count", 1, MAX_CLAIM_BATCH as i64);
/// A long-poll's wait, in milliseconds.
pub const TIMEOUT_MS: Input = integer("timeout_ms", 0, MAX_LONG_POLL.as_millis() as i64);
/// A retry's backoff, in milliseconds.
pub const BACKOFF_MS: Input = integer(
    "after_ms",
    0,
    tessera_store::lease::MAX_BACKOFF.as_millis() as i64,
);
/// A snooze's delay, in milliseconds.
pub const SNOOZE_MS: Input = integer(
    "delay_ms",
    0,
    tessera_store::lease::MAX_BACKOFF.as_millis() as i64,
);
/// Events and counters on an audit page.
pub const AUDIT_LIMIT: Input = integer("limit", 1, MAX_AUDIT_ROWS as i64);
/// Attempts on a task listing's page.
pub const TASKS_LIMIT: Input = integer("limit", 1, MAX_TASKS_LISTED as i64);
/// Keys on a key listing's page.
pub const KEYS_LIMIT: Input = integer("limit", 1, MAX_KEYS_LISTED as i64);
/// Tasks in one batch enqueue.
pub const ENQUEUE_BATCH: Input = integer("tasks", 1, MAX_ENQUEUE_BATCH as i64);
/// Submissions in one batch submit.
pub const SUBMIT_BATCH: Input = integer("submissions", 1, MAX_SUBMIT_BATCH as i64);
/// A time (`since`, `at`, `not_before`).
pub const TIME: Input = Input {
    name: "at",
    limit: Limit::Time,
};
/// A long-poll's wait, in whole seconds.
pub const WAIT_SECONDS: Input = integer("wait", 0, MAX_LONG_POLL.as_secs() as i64);
/// A schedule's name, in a path or a listing's `after`.
pub const SCHEDULE: Input = name("name", ScheduleName::MAX_LEN);
/// A schedule's cron expression (its syntax is the store's to check).
pub const CRON: Input = Input {
    name: "cron",
    limit: Limit::Text {
        min_len: 1,
        max_len: tessera_store::CronSchedule::MAX_LEN,
    },
};
/// A schedule's IANA time zone name (the store checks it is one).
pub const ZONE: Input = Input {
    name: "zone",
    limit: Limit::Text {
        min_len: 1,
        max_len: 64,
    },
};
/// The most schedules a listing returns.
pub const SCHEDULES_LIMIT: Input = integer("limit", 1, MAX_SCHEDULES_LISTED as i64);
/// Whether the board's keyed feed also makes its audited reads (1) or not (0).
pub const DETAILS: Input = integer("details", 0, 1);

/// An operator's key typed into the board's form (the store checks it is
/// one it issued).
pub const BOARD_KEY: Input = Input {
    name: "key",
    limit: Limit::Text {
        min_len: 1,
        max_len: 128,
    },
};

/// The board's filter of tasks by queue; empty for any queue.
pub const BOARD_QUEUE: Input = Input {
    name: "queue",
    limit: Limit::NameOrEmpty {
        max_len: QueueName::MAX_LEN,
    },
};
/// The board's filter of tasks by partition key; empty for any.
pub const BOARD_PARTITION_KEY: Input = Input {
    name: "partition_key",
    limit: Limit::NameOrEmpty {
        max_len: PartitionKey::MAX_LEN,
    },
};
/// The board's filter of tasks by how recently they reached their state.
pub const WITHIN: Input = Input {
    name: "within",
    limit: Limit::OneOf(&["any", "5m", "15m", "1h", "6h", "24h", "7d"]),
};

/// Every input with limits, for the test that proves the document and
/// the validation agree.
pub const ALL: &[Input] = &[
    NAMESPACE,
    QUEUE,
    TASK,
    TASK_ID,
    PARTITION_KEY,
    UNIQUE_KEY,
    UNIQUE_MODE,
    RUN_AFTER,
    UNIQUE_WINDOW_MS,
    DEBOUNCE_MS,
    MAX_DEBOUNCE_MS,
    IDEMPOTENCY_KEY,
    KEY_ID,
    PRINCIPAL,
    AUDIT_CURSOR,
    TASK_CURSOR,
    ACCOUNT,
    LABEL,
    ERROR_TEXT,
    SCOPE,
    GRANT,
    STATE,
    ORDER,
    RETRY,
    VERSION,
    TOKEN,
    ATTEMPT,
    ALTERNATIVES,
    PRIORITY,
    MAX_TRIES_INPUT,
    CLAIM_COUNT,
    QUEUE_LIMIT,
    PARTITION_LIMIT,
    KEEP_MS,
    LEASE_MS,
    TASK_TIMEOUT_MS,
    TIMEOUT_MS,
    BACKOFF_MS,
    SNOOZE_MS,
    AUDIT_LIMIT,
    TASKS_LIMIT,
    KEYS_LIMIT,
    TIME,
    WAIT_SECONDS,
    DETAILS,
    SCHEDULE,
    CRON,
    ZONE,
    SCHEDULES_LIMIT,
    BOARD_KEY,
    BOARD_QUEUE,
    BOARD_PARTITION_KEY,
    WITHIN,
];

impl Input {
    /// The input's JSON schema, as the document shows it.
    pub fn schema(&self) -> Value {
        match self.limit {
            Limit::Name { max_len } => json!({
                "type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": max_len,
            }),
            Limit::NameOrEmpty { max_len } => json!({
                "type": "string", "pattern": format!("^$|{NAME_PATTERN}"), "maxLength": max_len,
            }),
            Limit::Text { min_len, max_len } => json!({
                "type": "string", "pattern": TEXT_PATTERN, "minLength": min_len, "maxLength": max_len,
            }),
            Limit::Pattern { pattern } => json!({ "type": "string", "pattern": pattern }),
            Limit::Cursor {
                second_digits,
                second_signed,
            } => {
                let sign = if second_signed { "-?" } else { "" };
                let pattern = format!(r"^-?[0-9]{{1,18}}\.{sign}[0-9]{{1,{second_digits}}}$");
                json!({ "type": "string", "pattern": pattern })
            }
            Limit::Grant => json!({
                "type": "string",
                "pattern": GRANT_PATTERN,
                "maxLength": "namespace:".len() + Namespace::MAX_LEN,
            }),
            Limit::OneOf(words) => json!({ "type": "string", "enum": words }),
            Limit::Integer { minimum, maximum } => json!({
                "type": "integer", "format": "int64", "minimum": minimum, "maximum": maximum,
            }),
            Limit::Time => json!({ "type": "string", "format": "date-time" }),
        }
    }

    /// An array of this input's values, of up to `max` items.
    pub fn array(&self, max: usize) -> Value {
        json!({ "type": "array", "items": self.schema(), "maxItems": max })
    }

    /// Checks a whole number against this input's range: the store's
    /// `400` naming the input otherwise.
    pub fn integer(&self, value: i64) -> Result<i64, Error> {
        match self.limit {
            Limit::Integer { minimum, maximum } if (minimum..=maximum).contains(&value) => {
                Ok(value)
            }
            Limit::Integer { minimum, maximum } => Err(Error::InvalidInput {
                reason: format!("{} is {value}, not {minimum} to {maximum}", self.name),
            }),
            _ => Err(Error::InvalidInput {
                reason: format!("{} is not a number", self.name),
            }),
        }
    }

    /// Checks a cursor's shape (its pattern) before the store parses it.
    pub fn cursor<'a>(&self, value: &'a str) -> Result<&'a str, Error> {
        let Limit::Cursor {
            second_digits,
            second_signed,
        } = self.limit
        else {
            return Ok(value);
        };
        let number = |part: &str, digits: usize, signed: bool| {
            let part = match part.strip_prefix('-') {
                Some(rest) if signed => rest,
                _ => part,
            };
            (1..=digits).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit())
        };
        match value.split_once('.') {
            Some((first, second))
                if number(first, 18, true) && number(second, second_digits, second_signed) =>
            {
                Ok(value)
            }
            _ => Err(Error::InvalidInput {
                reason: format!("{} {value:?} is not a cursor a listing gave", self.name),
            }),
        }
    }

    /// Checks printable text against this input's lengths, as the store
    /// checks accounts and labels, and the document's pattern besides.
    pub fn text<'a>(&self, value: &'a str) -> Result<&'a str, Error> {
        let Limit::Text { min_len, max_len } = self.limit else {
            return Ok(value);
        };
        let printable = value.bytes().all(|byte| (b' '..=b'~').contains(&byte));
        if printable && (min_len..=max_len).contains(&value.len()) {
            return Ok(value);
        }
        Err(Error::InvalidInput {
            reason: format!(
                "{} is {min_len} to {max_len} printable ASCII characters",
                self.name
            ),
        })
    }
}

/// Parses a word of [`SCOPE`].
pub fn scope(word: &str) -> Result<Scope, Error> {
    Scope::ALL
        .iter()
        .copied()
        .find(|scope| scope.as_str() == word)
        .ok_or_else(|| Error::InvalidInput {
            reason: format!("scope {word:?} is none of enqueue, claim, read"),
        })
}

/// Parses a word of [`STATE`].
pub fn state(word: &str) -> Result<StateName, Error> {
    serde_json::from_value(Value::String(word.to_owned())).map_err(|_| Error::InvalidInput {
        reason: format!("state {word:?} is not a task state"),
    })
}

/// A JSON value of any type, as a brief or an output is.
pub fn any_value() -> Value {
    json!({})
}

/// Parses a grant of [`GRANT`]: a namespace's or every namespace's.
pub fn grant(text: &str) -> Result<Grant, Error> {
    match Grant::parse(text)? {
        Grant::Admin => Err(Error::InvalidInput {
            reason: "the admin grant comes with an admin key, not as a grant".to_owned(),
        }),
        grant => Ok(grant),
    }
}

/// Parses a word of [`RUN_AFTER`].
pub fn run_after(word: &str) -> Result<tessera_store::RunAfter, Error> {
    tessera_store::RunAfter::parse(word).ok_or_else(|| Error::InvalidInput {
        reason: format!("run_after is all_done or any_outcome, not {word:?}"),
    })
}

/// Parses a word of [`UNIQUE_MODE`], with a debounce's delays
/// ([`DEBOUNCE_MS`], [`MAX_DEBOUNCE_MS`], both needed for `debounce` and
/// refused otherwise).
pub fn unique_mode(
    word: &str,
    delay_ms: Option<i64>,
    max_delay_ms: Option<i64>,
) -> Result<UniqueMode, Error> {
    let millis = |input: Input, value: i64| -> Result<std::time::Duration, Error> {
        Ok(std::time::Duration::from_millis(
            input.integer(value)? as u64
        ))
    };
    match (word, delay_ms, max_delay_ms) {
        ("keep", None, None) => Ok(UniqueMode::Keep),
        ("replace", None, None) => Ok(UniqueMode::Replace),
        ("debounce", Some(delay), Some(max_delay)) => Ok(UniqueMode::Debounce {
            delay: millis(DEBOUNCE_MS, delay)?,
            max_delay: millis(MAX_DEBOUNCE_MS, max_delay)?,
        }),
        ("keep" | "replace", _, _) => Err(Error::InvalidInput {
            reason: format!("mode {word} takes no delay_ms or max_delay_ms"),
        }),
        ("debounce", _, _) => Err(Error::InvalidInput {
            reason: "mode debounce needs delay_ms and max_delay_ms".to_owned(),
        }),
        (other, _, _) => Err(Error::InvalidInput {
            reason: format!("mode {other:?} is none of keep, replace, debounce"),
        }),
    }
}

/// Parses a word of [`WITHIN`]: how far back, or `None` for any time.
pub fn within(word: &str) -> Result<Option<std::time::Duration>, Error> {
    let minutes = match word {
        "any" => return Ok(None),
        "5m" => 5,
        "15m" => 15,
        "1h" => 60,
        "6h" => 360,
        "24h" => 1440,
        "7d" => 10_080,
        other => {
            return Err(Error::InvalidInput {
                reason: format!("within {other:?} is none of any, 5m, 15m, 1h, 6h, 24h, 7d"),
            });
        }
    };
    Ok(Some(std::time::Duration::from_secs(minutes * 60)))
}

/// Parses a word of [`ORDER`].
pub fn order(word: &str) -> Result<ListOrder, Error> {
    match word {
        "oldest" => Ok(ListOrder::Oldest),
        "newest" => Ok(ListOrder::Newest),
        other => Err(Error::InvalidInput {
            reason: format!("order {other:?} is neither oldest nor newest"),
        }),
    }
}

/// Parses a word of [`RETRY`], with the wait of `after` and `snooze`
/// ([`BACKOFF_MS`], counted for those alone).
pub fn retry(word: &str, after_ms: i64) -> Result<Retry, Error> {
    let after_ms = BACKOFF_MS.integer(after_ms)? as u64;
    let wait = std::time::Duration::from_millis(after_ms);
    match word {
        "never" => Ok(Retry::Never),
        "backoff" => Ok(Retry::Backoff),
        "after" => Ok(Retry::After(wait)),
        "snooze" => Ok(Retry::Snooze(wait)),
        other => Err(Error::InvalidInput {
            reason: format!("retry {other:?} is none of never, backoff, after, snooze"),
        }),
    }
}
