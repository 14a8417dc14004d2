//! The mint quota's counts.

pub(in crate::postgres) const LIMIT_COUNT: &str =
    "SELECT count FROM access_limits WHERE subject = $1 AND window_start = $2";
pub(in crate::postgres) const BUMP_LIMIT: &str = "INSERT INTO access_limits (subject, window_start, count, purge_at) \
     VALUES ($1, $2, 1, $3) ON CONFLICT (subject, window_start) \
     DO UPDATE SET count = access_limits.count + 1";
pub(in crate::postgres) const PURGE_LIMITS: &str = "DELETE FROM access_limits WHERE id IN (SELECT id FROM access_limits \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
