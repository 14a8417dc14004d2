//! A queue's settings (pause, limits) and its own keep times.

pub(in crate::postgres) const QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, partition_limit \
     FROM queue_settings WHERE namespace = $1 AND queue = $2";
/// [`QUEUE_SETTINGS`] locked for the rest of a write transaction: claims of
/// a configured queue count its leases one at a time.
pub(in crate::postgres) const QUEUE_SETTINGS_LOCKED: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = $1 AND queue = $2 FOR UPDATE";
pub(in crate::postgres) const NAMESPACE_QUEUE_SETTINGS: &str = "SELECT queue, paused_at, queue_limit, \
     partition_limit FROM queue_settings WHERE namespace = $1 ORDER BY queue";
pub(in crate::postgres) const PUT_QUEUE_SETTINGS: &str = "INSERT INTO queue_settings \
     (namespace, queue, paused_at, queue_limit, partition_limit, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     paused_at = excluded.paused_at, queue_limit = excluded.queue_limit, \
     partition_limit = excluded.partition_limit, updated_at = excluded.updated_at";
pub(in crate::postgres) const DELETE_QUEUE_SETTINGS: &str =
    "DELETE FROM queue_settings WHERE namespace = $1 AND queue = $2";
/// A queue's own keep times.
pub(in crate::postgres) const QUEUE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, cancelled_ms \
     FROM queue_retention WHERE namespace = $1 AND queue = $2";
/// Every queue of a namespace with keep times of its own.
pub(in crate::postgres) const NAMESPACE_RETENTION: &str = "SELECT queue, done_ms, discarded_ms, \
     cancelled_ms FROM queue_retention WHERE namespace = $1 ORDER BY queue";
/// Stores a queue's keep times.
pub(in crate::postgres) const PUT_QUEUE_RETENTION: &str = "INSERT INTO queue_retention \
     (namespace, queue, done_ms, discarded_ms, cancelled_ms, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (namespace, queue) DO UPDATE SET \
     done_ms = excluded.done_ms, discarded_ms = excluded.discarded_ms, \
     cancelled_ms = excluded.cancelled_ms, updated_at = excluded.updated_at";
/// Deletes a queue's keep times: the store's apply again.
pub(in crate::postgres) const DELETE_QUEUE_RETENTION: &str =
    "DELETE FROM queue_retention WHERE namespace = $1 AND queue = $2";
