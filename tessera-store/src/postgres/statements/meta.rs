//! The store's own: meta values, the enqueue signal and named row locks.

pub(in crate::postgres) const META_VALUE: &str = "SELECT value FROM tessera_meta WHERE key = $1";
pub(in crate::postgres) const INSERT_META: &str =
    "INSERT INTO tessera_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";
pub(in crate::postgres) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
/// A row's lock by name, held to the transaction's end (see
/// [`RowLock`](crate::backend::RowLock)).
pub(in crate::postgres) const LOCK_ROW: &str =
    "SELECT pg_advisory_xact_lock(hashtext('tessera row ' || $1))";
