//! The schema's declarations: every table, index, and what earlier builds
//! left that this one retires.

use super::META_TABLE;

/// A table: its columns and, for a `WITHOUT ROWID` table, its primary key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    pub(crate) name: &'static str,
    /// `(name, declaration)`; a column added after a table first shipped
    /// must be nullable or have a constant default.
    pub(crate) columns: &'static [(&'static str, &'static str)],
    /// The primary key of a `WITHOUT ROWID` table: the table is then one
    /// b-tree in this order, so a row costs one entry and no index beside
    /// it. `None` for a rowid table.
    pub(crate) clustered_key: Option<&'static [&'static str]>,
}

/// An index on one table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Index {
    pub(crate) name: &'static str,
    pub(crate) table: &'static str,
    pub(crate) unique: bool,
    /// The indexed columns, in order.
    pub(crate) columns: &'static [&'static str],
    /// A partial index's condition.
    pub(crate) filter: Option<&'static str>,
}

/// Every table. Tables are rowid tables, with uniqueness declared as a
/// named unique index rather than a column constraint, except where one
/// key orders every read and write (`access_day_counters`): that table is
/// `WITHOUT ROWID`, clustered on its key. Times are Unix milliseconds
/// (`INTEGER`), counters and ids `INTEGER` (signed 64-bit).
pub(crate) const TABLES: &[Table] = &[
    Table {
        name: META_TABLE,
        columns: &[("key", "TEXT PRIMARY KEY"), ("value", "TEXT NOT NULL")],
        clustered_key: None,
    },
    Table {
        name: "access_principals",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            // keyed | anonymous | admin
            ("kind", "TEXT NOT NULL"),
            ("account", "TEXT NOT NULL"),
            ("created_at", "INTEGER NOT NULL"),
            ("last_used_at", "INTEGER"),
            // Set for anonymous principals only: when retention deletes it.
            ("purge_at", "INTEGER"),
        ],
        clustered_key: None,
    },
    Table {
        name: "access_keys",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            // The public part of the presented key.
            ("key_id", "TEXT NOT NULL"),
            ("principal_id", "INTEGER NOT NULL"),
            // SHA-256 of the whole presented key; the key itself is never
            // stored.
            ("secret_hash", "BLOB NOT NULL"),
            ("label", "TEXT NOT NULL DEFAULT ''"),
            // JSON arrays of strings.
            ("scopes", "TEXT NOT NULL"),
            ("grants", "TEXT NOT NULL"),
            ("created_at", "INTEGER NOT NULL"),
            ("expires_at", "INTEGER"),
            ("revoked_at", "INTEGER"),
            ("purge_at", "INTEGER"),
        ],
        clustered_key: None,
    },
    Table {
        name: "access_limits",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            // What is limited, e.g. a mint allowance per address group.
            ("subject", "TEXT NOT NULL"),
            ("window_start", "INTEGER NOT NULL"),
            ("count", "INTEGER NOT NULL"),
            ("purge_at", "INTEGER"),
        ],
        clustered_key: None,
    },
    Table {
        name: "access_audit",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("at", "INTEGER NOT NULL"),
            ("principal", "TEXT NOT NULL"),
            ("namespace", "TEXT NOT NULL"),
            ("action", "TEXT NOT NULL"),
            ("outcome", "TEXT NOT NULL"),
            ("resource", "TEXT"),
            ("ip_hash", "TEXT"),
        ],
        clustered_key: None,
    },
    // One row per (minute of the day, principal, namespace, action,
    // outcome), with the whole minute beside it: the flush adds to the row
    // of its minute, or overwrites the one the same minute a day earlier
    // left, so a counter that recurs daily costs one row a minute and
    // nothing to delete. Readers filter by the whole minute; retention
    // deletes only the rows of counters that went quiet, by minute of the
    // day.
    Table {
        name: "access_day_counters",
        columns: &[
            // The minute modulo 1,440.
            ("day_minute", "INTEGER NOT NULL"),
            // '' for a request without a principal.
            ("principal", "TEXT NOT NULL"),
            ("namespace", "TEXT NOT NULL"),
            ("action", "TEXT NOT NULL"),
            ("outcome", "TEXT NOT NULL"),
            // Minutes since the Unix epoch.
            ("minute", "INTEGER NOT NULL"),
            ("count", "INTEGER NOT NULL"),
        ],
        clustered_key: Some(&["day_minute", "principal", "namespace", "action", "outcome"]),
    },
    Table {
        name: "namespaces",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("name", "TEXT NOT NULL"),
            // keyed | session
            ("kind", "TEXT NOT NULL"),
            ("created_at", "INTEGER NOT NULL"),
            // Set for anonymous sessions' namespaces only: when retention
            // deletes it and its tasks.
            ("purge_at", "INTEGER"),
        ],
        clustered_key: None,
    },
    Table {
        name: "tasks",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("namespace", "TEXT NOT NULL"),
            ("queue", "TEXT NOT NULL"),
            // The brief's id; with `version`, unique in its namespace.
            ("task_id", "TEXT NOT NULL"),
            ("version", "INTEGER NOT NULL"),
            ("brief", "BLOB NOT NULL"),
            // bytes | json
            ("brief_format", "TEXT NOT NULL"),
            ("alternatives", "INTEGER NOT NULL"),
            ("lapse_backoff_ms", "INTEGER NOT NULL"),
            // Tries per attempt; added in version 2.
            ("max_tries", "INTEGER NOT NULL DEFAULT 20"),
            // 0 to MAX_PRIORITY, higher claimed first; added in version 3.
            ("priority", "INTEGER NOT NULL DEFAULT 0"),
            // The highest fencing token granted; 0 before the first.
            ("last_token", "INTEGER NOT NULL"),
            // When an attempt is next claimable without a lease lapsing:
            // 0 while one is ready, the earliest backoff end or not-before
            // time otherwise, NULL while every unfinished attempt is leased
            // or once all are final (the task is then out of the claim
            // index; lapsed leases are found through `attempts_lapse_order`, so
            // a heartbeat never rewrites the task).
            ("claimable_at", "INTEGER"),
            ("created_at", "INTEGER NOT NULL"),
            ("enqueued_by", "TEXT NOT NULL"),
            // The partition key set at enqueue (version 4).
            ("partition_key", "TEXT"),
            // A unique task's key (version 4), kept after its slot is
            // released.
            ("unique_key", "TEXT"),
            // Its slot (`UniqueSlot`) while it holds it (its row in
            // `unique_slots`), NULL otherwise.
            ("unique_slot", "TEXT"),
            // The states in which it holds the slot (`UniqueStates` bits),
            // set and cleared with `unique_slot`.
            ("unique_states", "INTEGER"),
            // Its own lease length in milliseconds, and its deadline
            // (NULL: the store's lease, no deadline).
            ("lease_ms", "INTEGER"),
            ("deadline_at", "INTEGER"),
        ],
        clustered_key: None,
    },
    Table {
        name: "attempts",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("task", "INTEGER NOT NULL"),
            ("number", "INTEGER NOT NULL"),
            // Copied from the task, so per-namespace and per-queue reads
            // use an index.
            ("namespace", "TEXT NOT NULL"),
            ("queue", "TEXT NOT NULL"),
            // ready | leased | done | failed | backoff | discarded, and
            // since version 3 scheduled | cancelled
            ("state", "TEXT NOT NULL"),
            // The end of a backoff, or a scheduled attempt's not-before time.
            ("until_at", "INTEGER"),
            // A discarded attempt's reason: lapsed | failed (version 2).
            ("discarded", "TEXT"),
            // The latest failure report's error text (version 2).
            ("last_error", "TEXT"),
            ("tries", "INTEGER NOT NULL"),
            // The lease of the latest grant: holder, fencing token, times.
            ("holder", "TEXT"),
            ("token", "INTEGER"),
            ("granted_at", "INTEGER"),
            ("expires_at", "INTEGER"),
            // While leased: when the lease lapses into being claimable
            // again, its expiry plus the task's lapse backoff. NULL
            // otherwise.
            ("lapses_at", "INTEGER"),
            // The task's, for the lapse index (version 3).
            ("priority", "INTEGER NOT NULL DEFAULT 0"),
            // When its state last changed: set by the enqueue and by every
            // write of its state, never by a heartbeat (version 4; 0 for
            // attempts older than the column).
            ("changed_at", "INTEGER NOT NULL DEFAULT 0"),
            // The last progress value a heartbeat carried, as JSON text
            // (version 4).
            ("progress", "TEXT"),
            // The receipt of the submission that ended it (version 5; a
            // table of its own before): its idempotency key, the SHA-256
            // of the output (64 hex digits), when it was accepted and the
            // output if kept. Its token and holder are the receipt's
            // token and principal. NULL until a submission is accepted.
            // A key is looked up among its task's attempts
            // (`attempts_task`); writes take turns, so a lookup and the
            // write after it see the same rows, and no index of its own
            // keeps it unique.
            ("idempotency_key", "TEXT"),
            ("digest", "TEXT"),
            ("accepted_at", "INTEGER"),
            ("output", "BLOB"),
        ],
        clustered_key: None,
    },
    // The unique slots held (version 4): one row per (namespace, queue,
    // slot), naming the task that holds it. An enqueue that meets the key
    // is a duplicate; the row goes when its task's attempts leave the
    // states it counts. A table of its own, so a task without a slot
    // costs no index entry.
    Table {
        name: "unique_slots",
        columns: &[
            ("namespace", "TEXT NOT NULL"),
            ("queue", "TEXT NOT NULL"),
            ("slot", "TEXT NOT NULL"),
            ("task_id", "TEXT NOT NULL"),
            ("version", "INTEGER NOT NULL"),
            // When a windowed slot's window ends (NULL: no window); its
            // row goes then, found by `unique_slots_ending`.
            ("ends_at", "INTEGER"),
        ],
        clustered_key: Some(&["namespace", "queue", "slot"]),
    },
    // Tasks that wait for other tasks (version 6): one row per edge,
    // clustered on (parent, child), so the end of a parent reads and
    // marks its children's edges as one range. `ended` is how the parent
    // ended (`done`, `failed`, `cancelled`), NULL while it has not.
    Table {
        name: "task_edges",
        columns: &[
            ("parent", "INTEGER NOT NULL"),
            ("child", "INTEGER NOT NULL"),
            ("run_after", "TEXT NOT NULL"),
            ("ended", "TEXT"),
            // The parent's place in the child's list, the order a read
            // of the child's parents answers in.
            ("place", "INTEGER NOT NULL"),
        ],
        clustered_key: Some(&["parent", "child"]),
    },
    // A queue's settings while one differs from the default (version 4):
    // paused since `paused_at`, and its concurrency limits (NULL: none).
    Table {
        name: "queue_settings",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("namespace", "TEXT NOT NULL"),
            ("queue", "TEXT NOT NULL"),
            ("paused_at", "INTEGER"),
            ("queue_limit", "INTEGER"),
            ("partition_limit", "INTEGER"),
            ("updated_at", "INTEGER NOT NULL"),
        ],
        clustered_key: None,
    },
    // A queue's own keep times for finished work, in milliseconds by final
    // state (NULL: forever); a row only while the queue has them.
    Table {
        name: "queue_retention",
        columns: &[
            ("namespace", "TEXT NOT NULL"),
            ("queue", "TEXT NOT NULL"),
            ("done_ms", "INTEGER"),
            ("discarded_ms", "INTEGER"),
            ("cancelled_ms", "INTEGER"),
            ("updated_at", "INTEGER NOT NULL"),
        ],
        clustered_key: Some(&["namespace", "queue"]),
    },
    // Periodic schedules (version 4), one per name in a namespace.
    Table {
        name: "schedules",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("namespace", "TEXT NOT NULL"),
            ("name", "TEXT NOT NULL"),
            // The queue its fires enqueue into.
            ("queue", "TEXT NOT NULL"),
            ("cron", "TEXT NOT NULL"),
            // An IANA time zone name.
            ("zone", "TEXT NOT NULL"),
            // The brief every fire enqueues, encoded as a task's.
            ("brief", "BLOB NOT NULL"),
            ("brief_format", "TEXT NOT NULL"),
            // The enqueue options, as JSON: the brief's version and spec.
            ("options", "TEXT NOT NULL"),
            ("paused", "INTEGER NOT NULL DEFAULT 0"),
            // Run-ats at or before it never fire: when the schedule was
            // put, replaced or last resumed.
            ("active_since", "INTEGER NOT NULL"),
            ("created_at", "INTEGER NOT NULL"),
            ("updated_at", "INTEGER NOT NULL"),
            // The principal whose tasks its fires enqueue.
            ("created_by", "TEXT NOT NULL"),
        ],
        clustered_key: None,
    },
    // One row per run-at fired; its unique index is what makes a run-at
    // fire once however many schedulers race (version 4).
    Table {
        name: "schedule_fires",
        columns: &[
            ("id", "INTEGER PRIMARY KEY"),
            ("namespace", "TEXT NOT NULL"),
            ("schedule", "TEXT NOT NULL"),
            ("run_at", "INTEGER NOT NULL"),
            ("task_id", "TEXT NOT NULL"),
            ("fired_at", "INTEGER NOT NULL"),
        ],
        clustered_key: None,
    },
];

/// Every index. The partial `*_purge` indexes hold only rows with a purge
/// time, so keyed principals cost retention nothing.
pub(crate) const INDEXES: &[Index] = &[
    Index {
        name: "access_principals_purge",
        table: "access_principals",
        unique: false,
        columns: &["purge_at"],
        filter: Some("purge_at IS NOT NULL"),
    },
    Index {
        name: "access_keys_key_id",
        table: "access_keys",
        unique: true,
        columns: &["key_id"],
        filter: None,
    },
    Index {
        name: "access_keys_principal",
        table: "access_keys",
        unique: false,
        columns: &["principal_id", "key_id"],
        filter: None,
    },
    Index {
        name: "access_keys_purge",
        table: "access_keys",
        unique: false,
        columns: &["purge_at"],
        filter: Some("purge_at IS NOT NULL"),
    },
    Index {
        name: "access_limits_subject",
        table: "access_limits",
        unique: true,
        columns: &["subject", "window_start"],
        filter: None,
    },
    Index {
        name: "access_limits_purge",
        table: "access_limits",
        unique: false,
        columns: &["purge_at"],
        filter: Some("purge_at IS NOT NULL"),
    },
    Index {
        name: "access_audit_principal",
        table: "access_audit",
        unique: false,
        columns: &["principal", "at"],
        filter: None,
    },
    Index {
        name: "namespaces_name",
        table: "namespaces",
        unique: true,
        columns: &["name"],
        filter: None,
    },
    Index {
        name: "namespaces_purge",
        table: "namespaces",
        unique: false,
        columns: &["purge_at"],
        filter: Some("purge_at IS NOT NULL"),
    },
    Index {
        name: "tasks_ref",
        table: "tasks",
        unique: true,
        columns: &["namespace", "task_id", "version"],
        filter: None,
    },
    // Claim order within each priority: ready tasks (claimable_at 0)
    // oldest first, then ended backoffs and schedules (merged with
    // `attempts_lapse_order`'s lapsed leases by time); tasks with nothing ready,
    // in backoff or scheduled are not in it.
    Index {
        name: "tasks_claim_order",
        table: "tasks",
        unique: false,
        columns: &["namespace", "queue", "priority", "claimable_at", "id"],
        filter: Some("claimable_at IS NOT NULL"),
    },
    Index {
        name: "attempts_task",
        table: "attempts",
        unique: true,
        columns: &["task", "number"],
        filter: None,
    },
    // Health counts a namespace's attempts per state from it, and a
    // listing pages through one state by the row id that ends every entry.
    Index {
        name: "attempts_state",
        table: "attempts",
        unique: false,
        columns: &["namespace", "state"],
        filter: None,
    },
    // Live and lapsed leases only, by queue, priority and when each
    // lapses: a claim finds a queue's oldest lapsed lease in one search per
    // priority, expiry reads a namespace's expiries and tasks from the
    // index alone, and a heartbeat moves only its own entry.
    Index {
        name: "attempts_lapse_order",
        table: "attempts",
        unique: false,
        columns: &[
            "namespace",
            "queue",
            "priority",
            "lapses_at",
            "task",
            "expires_at",
        ],
        filter: Some("state = 'leased'"),
    },
    // Bulk actions by filter: a namespace's attempts by when their state
    // last changed, a time range being one range of it, paged by
    // (changed_at, task, number). Retention reads its finished attempts
    // by when they ended from it too.
    Index {
        name: "attempts_changed",
        table: "attempts",
        unique: false,
        columns: &["namespace", "changed_at", "task", "number"],
        filter: None,
    },
    // A child's edges, for the count of its parents not ended and the
    // read of their receipts.
    Index {
        name: "task_edges_child",
        table: "task_edges",
        unique: false,
        columns: &["child", "parent"],
        filter: None,
    },
    // Windowed unique slots by when their window ends, for retention.
    Index {
        name: "unique_slots_ending",
        table: "unique_slots",
        unique: false,
        columns: &["ends_at"],
        filter: Some("ends_at IS NOT NULL"),
    },
    Index {
        name: "queue_settings_queue",
        table: "queue_settings",
        unique: true,
        columns: &["namespace", "queue"],
        filter: None,
    },
    Index {
        name: "schedules_name",
        table: "schedules",
        unique: true,
        columns: &["namespace", "name"],
        filter: None,
    },
    // What a scheduler's pass reads: the unpaused schedules, store-wide,
    // a page at a time.
    Index {
        name: "schedules_active",
        table: "schedules",
        unique: false,
        columns: &["namespace", "name"],
        filter: Some("paused = 0"),
    },
    // Each run-at fires once; a schedule's last fire is its last entry.
    Index {
        name: "schedule_fires_run_at",
        table: "schedule_fires",
        unique: true,
        columns: &["namespace", "schedule", "run_at"],
        filter: None,
    },
];

/// Indexes earlier builds created and this one drops where it finds them.
/// An older build that opens the database again recreates them, which is
/// harmless: nothing here needs them gone, it only stops paying for them.
///
/// - `access_audit_at`: audit rows are appended in time order, so their
///   row ids are in time order too; a time bound is found by a search of
///   the row ids (`statements/audit.rs`), and each audit row costs one
///   b-tree entry less.
/// - `tasks_claimable` and `attempts_leased`: the claim indexes before
///   priorities, replaced by `tasks_claim_order` and `attempts_lapse_order`,
///   which lead with the priority.
/// - `attempts_lapsing`: `attempts_lapse_order` before it ordered the
///   leases that lapse at the same time by their task, as the lease
///   rules' claim order does (it ordered them by expiry).
pub(crate) const RETIRED_INDEXES: &[&str] = &[
    "access_audit_at",
    "tasks_claimable",
    "attempts_leased",
    "attempts_lapsing",
];

/// Tables earlier builds created, each with the statements that move its
/// rows into this build's tables before it is dropped. An older build that
/// opens the database again creates it anew, and the next open of this
/// build moves its rows again.
///
/// - `receipts` (before version 5): each receipt moves into the row of
///   the attempt it ended, so a submission writes one row, not two (a
///   build older than version 5 refuses the database afterwards).
/// - `access_counters`, keyed by the whole minute: its rows move into
///   `access_day_counters` (the newest minute wins a minute of the day).
pub(crate) const RETIRED_TABLES: &[(&str, &str)] = &[
    (
        "receipts",
        "UPDATE attempts SET idempotency_key = r.idempotency_key, digest = r.digest, \
         accepted_at = r.accepted_at, output = r.output \
         FROM receipts r WHERE r.task = attempts.task AND r.attempt = attempts.number; \
         DROP TABLE receipts",
    ),
    (
        "access_counters",
        "INSERT INTO access_day_counters \
     (day_minute, principal, namespace, action, outcome, minute, count) \
     SELECT minute % 1440, principal, namespace, action, outcome, minute, count \
     FROM access_counters WHERE true ORDER BY minute \
     ON CONFLICT (day_minute, principal, namespace, action, outcome) DO UPDATE SET \
     count = CASE WHEN minute = excluded.minute THEN count + excluded.count \
     WHEN minute < excluded.minute THEN excluded.count ELSE count END, \
     minute = max(minute, excluded.minute); \
     DROP TABLE access_counters",
    ),
];

/// The names of every table, for loading index metadata.
pub(crate) fn table_names() -> Vec<&'static str> {
    TABLES.iter().map(|table| table.name).collect()
}

impl Table {
    pub(super) fn create_sql(&self) -> String {
        let columns = self
            .columns
            .iter()
            .map(|(name, declaration)| format!("{name} {declaration}"))
            .collect::<Vec<_>>()
            .join(", ");
        match self.clustered_key {
            None => format!("CREATE TABLE IF NOT EXISTS {} ({columns})", self.name),
            Some(key) => format!(
                "CREATE TABLE IF NOT EXISTS {} ({columns}, PRIMARY KEY ({})) WITHOUT ROWID",
                self.name,
                key.join(", ")
            ),
        }
    }
}

impl Index {
    pub(super) fn create_sql(&self) -> String {
        let unique = if self.unique { "UNIQUE " } else { "" };
        let filter = self
            .filter
            .map(|condition| format!(" WHERE {condition}"))
            .unwrap_or_default();
        format!(
            "CREATE {unique}INDEX IF NOT EXISTS {} ON {} ({}){filter}",
            self.name,
            self.table,
            self.columns.join(", ")
        )
    }
}
