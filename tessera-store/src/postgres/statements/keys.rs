//! Access keys and their principals.

/// A key with its principal, in [`key_row`] order.
macro_rules! key_columns {
    () => {
        "k.key_id, k.principal_id, k.secret_hash, k.label, k.scopes, k.grants, k.created_at, \
         k.expires_at, k.revoked_at, p.kind, p.account, p.last_used_at \
         FROM access_keys AS k JOIN access_principals AS p ON p.id = k.principal_id"
    };
}
pub(in crate::postgres) const KEY_BY_KEY_ID: &str =
    concat!("SELECT ", key_columns!(), " WHERE k.key_id = $1");
pub(in crate::postgres) const KEYS_OF_PRINCIPAL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.principal_id = $1 AND k.key_id > $2 ORDER BY k.key_id LIMIT $3"
);
pub(in crate::postgres) const KEYS_ALL: &str = concat!(
    "SELECT ",
    key_columns!(),
    " WHERE k.key_id > $1 ORDER BY k.key_id LIMIT $2"
);
pub(in crate::postgres) const PRINCIPAL_BY_ID: &str =
    "SELECT kind, account FROM access_principals WHERE id = $1";
pub(in crate::postgres) const INSERT_PRINCIPAL: &str = "INSERT INTO access_principals \
     (kind, account, created_at, purge_at) VALUES ($1, $2, $3, $4) RETURNING id";
pub(in crate::postgres) const INSERT_KEY: &str = "INSERT INTO access_keys (key_id, principal_id, secret_hash, label, \
     scopes, grants, created_at, expires_at, purge_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key_id) DO NOTHING";
pub(in crate::postgres) const REVOKE_KEY: &str =
    "UPDATE access_keys SET revoked_at = $2 WHERE key_id = $1";
pub(in crate::postgres) const EXPIRE_KEY: &str =
    "UPDATE access_keys SET expires_at = $2 WHERE key_id = $1";
pub(in crate::postgres) const TOUCH_PRINCIPAL: &str =
    "UPDATE access_principals SET last_used_at = GREATEST(last_used_at, $2) WHERE id = $1";
pub(in crate::postgres) const PURGE_KEYS: &str = "DELETE FROM access_keys WHERE id IN (SELECT id FROM access_keys \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 ORDER BY purge_at LIMIT $2 \
     FOR UPDATE SKIP LOCKED)";
pub(in crate::postgres) const PURGE_PRINCIPALS: &str = "DELETE FROM access_principals WHERE id IN \
     (SELECT id FROM access_principals WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
