//! The `access_principals` and `access_keys` tables: who may call, with
//! which keys, and their retention deletes.

use rusqlite::{Row, params};

use crate::backend::rows::KeyRow;
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

/// A key joined with its principal, followed by `$tail`.
macro_rules! select_keys {
    ($tail:literal) => {
        concat!(
            "SELECT k.key_id, k.principal_id, k.secret_hash, k.label, k.scopes, ",
            "k.grants, k.created_at, k.expires_at, k.revoked_at, p.kind, p.account, ",
            "p.last_used_at FROM access_keys AS k ",
            "JOIN access_principals AS p ON p.id = k.principal_id ",
            $tail
        )
    };
}

impl KeyRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            key_id: row.get("key_id")?,
            principal_id: row.get("principal_id")?,
            secret_hash: row.get("secret_hash")?,
            label: row.get("label")?,
            scopes: row.get("scopes")?,
            grants: row.get("grants")?,
            created_at: row.get("created_at")?,
            expires_at: row.get("expires_at")?,
            revoked_at: row.get("revoked_at")?,
            kind: row.get("kind")?,
            account: row.get("account")?,
            last_used_at: row.get("last_used_at")?,
        })
    }
}

pub(crate) const KEY_BY_KEY_ID: &str = select_keys!("WHERE k.key_id = ?1");

/// The key with this public id, with its principal: one lookup through the
/// unique `access_keys_key_id` index and one by the principal's rowid.
pub(crate) fn key_by_key_id(reader: &Reader<'_>, key_id: &str) -> rusqlite::Result<Option<KeyRow>> {
    reader.optional(KEY_BY_KEY_ID, [key_id], KeyRow::from_row)
}

pub(crate) const KEYS_OF_PRINCIPAL: &str =
    select_keys!("WHERE k.principal_id = ?1 AND k.key_id > ?2 ORDER BY k.key_id LIMIT ?3");

/// Up to `limit` keys of one principal after `after` in key id order.
pub(crate) fn keys_of_principal(
    reader: &Reader<'_>,
    principal_id: i64,
    after: &str,
    limit: i64,
) -> rusqlite::Result<Vec<KeyRow>> {
    reader.all(
        KEYS_OF_PRINCIPAL,
        params![principal_id, after, limit],
        KeyRow::from_row,
    )
}

pub(crate) const KEYS_ALL: &str = select_keys!("WHERE k.key_id > ?1 ORDER BY k.key_id LIMIT ?2");

/// Up to `limit` keys after `after` in key id order.
pub(crate) fn keys_all(
    reader: &Reader<'_>,
    after: &str,
    limit: i64,
) -> rusqlite::Result<Vec<KeyRow>> {
    reader.all(KEYS_ALL, params![after, limit], KeyRow::from_row)
}

const INSERT_KEY: &str = "INSERT INTO access_keys (key_id, principal_id, secret_hash, label, \
     scopes, grants, created_at, expires_at, revoked_at, purge_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, ?9)";

/// A new key's columns; times in Unix milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct NewKey<'a> {
    pub(crate) key_id: &'a str,
    pub(crate) principal_id: i64,
    pub(crate) secret_hash: &'a [u8],
    pub(crate) label: &'a str,
    pub(crate) scopes: &'a str,
    pub(crate) grants: &'a str,
    pub(crate) created_at: i64,
    pub(crate) expires_at: Option<i64>,
    pub(crate) purge_at: Option<i64>,
}

/// Inserts a key; `Ok(None)` if its key id is already taken.
pub(crate) fn insert_key(writer: &Writer<'_>, key: &NewKey<'_>) -> rusqlite::Result<Option<i64>> {
    writer
        .insert(
            INSERT_KEY,
            params![
                key.key_id,
                key.principal_id,
                key.secret_hash,
                key.label,
                key.scopes,
                key.grants,
                key.created_at,
                key.expires_at,
                key.purge_at
            ],
        )
        .map(Some)
        .or_else(|error| match error.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => Ok(None),
            _ => Err(error),
        })
}

pub(crate) const REVOKE_KEY: &str = "UPDATE access_keys SET revoked_at = ?2 WHERE key_id = ?1";

/// Marks a key revoked at `at`.
pub(crate) fn revoke_key(writer: &Writer<'_>, key_id: &str, at: i64) -> rusqlite::Result<()> {
    writer.execute(REVOKE_KEY, params![key_id, at]).map(drop)
}

pub(crate) const EXPIRE_KEY: &str = "UPDATE access_keys SET expires_at = ?2 WHERE key_id = ?1";

/// Sets a key's expiry.
pub(crate) fn expire_key(writer: &Writer<'_>, key_id: &str, at: i64) -> rusqlite::Result<()> {
    writer.execute(EXPIRE_KEY, params![key_id, at]).map(drop)
}

pub(crate) const PURGE_KEYS: &str = "DELETE FROM access_keys WHERE id IN \
     (SELECT id FROM access_keys WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

/// One retention batch of keys past their purge time; returns how many
/// it deleted.
pub(crate) fn purge_keys(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(PURGE_KEYS, params![threshold, limit])
}

const INSERT_PRINCIPAL: &str = "INSERT INTO access_principals \
     (kind, account, created_at, last_used_at, purge_at) VALUES (?1, ?2, ?3, NULL, ?4)";

/// Inserts a principal; returns its id.
pub(crate) fn insert_principal(
    writer: &Writer<'_>,
    kind: &str,
    account: &str,
    created_at: i64,
    purge_at: Option<i64>,
) -> rusqlite::Result<i64> {
    writer.insert(
        INSERT_PRINCIPAL,
        params![kind, account, created_at, purge_at],
    )
}

const PRINCIPAL_BY_ID: &str = "SELECT kind, account FROM access_principals WHERE id = ?1";

/// A principal's kind and account.
pub(crate) fn principal_by_id(
    reader: &Reader<'_>,
    principal_id: i64,
) -> rusqlite::Result<Option<(String, String)>> {
    reader.optional(PRINCIPAL_BY_ID, [principal_id], |row| {
        Ok((row.get("kind")?, row.get("account")?))
    })
}

pub(crate) const TOUCH_PRINCIPAL: &str =
    "UPDATE access_principals SET last_used_at = max(coalesce(last_used_at, ?2), ?2) WHERE id = ?1";

/// Records a principal's `last_used_at`.
pub(crate) fn touch_principal(
    writer: &Writer<'_>,
    principal_id: i64,
    at: i64,
) -> rusqlite::Result<()> {
    writer
        .execute(TOUCH_PRINCIPAL, params![principal_id, at])
        .map(drop)
}

pub(crate) const PURGE_PRINCIPALS: &str = "DELETE FROM access_principals WHERE id IN \
     (SELECT id FROM access_principals WHERE purge_at IS NOT NULL AND purge_at <= ?1 \
     ORDER BY purge_at LIMIT ?2)";

/// One retention batch of principals past their purge time; returns how
/// many it deleted.
pub(crate) fn purge_principals(
    writer: &Writer<'_>,
    threshold: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(PURGE_PRINCIPALS, params![threshold, limit])
}
