//! Access operations: resolving a presented key to a caller, checking
//! grants, and creating, listing, revoking and expiring keys.

use chrono::{DateTime, Utc};
use tessera_audit::{Action, Observation, Outcome, Resource};
use tessera_lease::Namespace;

use crate::backend::{KeyChange, NewKey, RowLock, WriteTransaction};
use crate::clock::storable;
use crate::error::{ConflictKind, Error};
use crate::key::{self, IssuedSecret, KeyId, constant_time_eq};
use crate::model::access::{
    Caller, Grant, IssuedKey, KeyFilter, KeyInfo, KeySpec, MAX_ACCOUNT_LEN, MAX_KEYS_LISTED,
    MAX_LABEL_LEN, Owner, PrincipalId, PrincipalKind, Scope, check_text,
};
use crate::model::audit::{ActionScope, Trail};
use crate::store::Store;

fn key_resource(key_id: &KeyId) -> Option<Resource> {
    Resource::new(&format!("key:{key_id}")).ok()
}

fn not_found(key_id: &KeyId) -> Error {
    Error::NotFound {
        what: format!("key {key_id}"),
    }
}

impl Store {
    /// Resolves a presented key (`tsk_<key id>_<secret>`, without any
    /// `Bearer ` prefix) to its caller.
    ///
    /// One indexed read; the stored hash is compared in constant time.
    /// Missing, malformed, unknown, expired or revoked keys are all
    /// `401 unauthorized` and are counted, not audited.
    ///
    /// `last_used_at` reflects the last audited action, at most 60 s
    /// behind: it is written at most once per observation interval, in the
    /// transaction of the principal's next audited action (one row there),
    /// so a request that writes nothing (an empty claim, a denied or failed
    /// request, a replayed submission) pays nothing for it. Resolving the
    /// key writes only when the principal's account or kind changed since
    /// it was last seen (at once, in its own transaction); if storage
    /// refuses that write the caller is still returned.
    pub fn authenticate(&self, presented: Option<&str>) -> Result<Caller, Error> {
        let now = self.now_utc();
        let deny = |principal: Option<PrincipalId>| {
            self.count(
                &ActionScope::new(principal, None, Action::Authenticate),
                Outcome::Unauthorized,
            );
            Error::Unauthorized
        };
        let Some(presented) = presented.filter(|text| !text.is_empty()) else {
            return Err(deny(None));
        };
        let Some(parsed) = key::parse_presented(presented) else {
            return Err(deny(None));
        };
        let key_id = KeyId::parse(parsed.key_id).map_err(|_| deny(None))?;
        let row = self
            .read(|reader| Ok(reader.key(&key_id)?))
            .inspect_err(|error| {
                self.count(
                    &ActionScope::new(None, None, Action::Authenticate),
                    error.outcome(),
                );
            })?;
        let Some(row) = row else {
            return Err(deny(None));
        };
        if !constant_time_eq(&row.secret_hash, &parsed.hash) {
            return Err(deny(None));
        }
        let info = row.info;
        if !info.is_valid_at(now) {
            return Err(deny(Some(info.principal)));
        }
        let caller = info.caller(None);
        self.observe(&caller, now);
        Ok(caller)
    }

    /// Checks `caller`'s key again, as it is now: `401` if it was revoked,
    /// expired or deleted since, otherwise the caller with its current
    /// scopes and grants (which the `require_*` checks then apply). Used
    /// after a wait, e.g. a claim that queued. One indexed read, no write.
    pub fn recheck(&self, caller: &Caller) -> Result<Caller, Error> {
        let now = self.now_utc();
        let row = self.read(|reader| Ok(reader.key(&caller.key_id)?))?;
        let info = match row {
            Some(row) => row.info,
            None => return Err(Error::Unauthorized),
        };
        if info.principal != caller.principal || !info.is_valid_at(now) {
            self.count(
                &ActionScope::new(Some(caller.principal), None, Action::VerifyKey),
                Outcome::Unauthorized,
            );
            return Err(Error::Unauthorized);
        }
        Ok(info.caller(caller.ip_hash.clone()))
    }

    /// Checks that `caller` may perform `action` with `scope` in
    /// `namespace`: `403 forbidden` (counted, not audited) if its key lacks
    /// the scope or the namespace grant. Reads nothing.
    pub fn authorize(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        scope: Scope,
        action: Action,
    ) -> Result<(), Error> {
        self.admit(caller, namespace, scope, action).map(drop)
    }

    /// [`authorize`](Self::authorize), returning what the action is then
    /// audited or counted under.
    pub(crate) fn admit(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        scope: Scope,
        action: Action,
    ) -> Result<ActionScope, Error> {
        let recorded = ActionScope::of(caller, Some(namespace), action);
        match caller
            .require_scope(scope)
            .and_then(|()| caller.require_namespace(namespace))
        {
            Ok(()) => Ok(recorded),
            Err(error) => {
                self.count(&recorded, Outcome::Forbidden);
                Err(error)
            }
        }
    }

    /// Whose rows `caller` reads: `asked`, or by default its own (everyone's,
    /// `None`, for an admin). Another principal's need an admin key: `403`
    /// for `refusal`, counted under `scope`.
    pub(crate) fn rows_of(
        &self,
        caller: &Caller,
        scope: &ActionScope,
        asked: Option<PrincipalId>,
        refusal: &str,
    ) -> Result<Option<PrincipalId>, Error> {
        match asked {
            Some(principal) if principal != caller.principal && !caller.is_admin() => {
                self.count(scope, Outcome::Forbidden);
                Err(Error::Forbidden {
                    reason: refusal.to_owned(),
                })
            }
            Some(principal) => Ok(Some(principal)),
            None if caller.is_admin() => Ok(None),
            None => Ok(Some(caller.principal)),
        }
    }

    /// Creates the first admin key, for a host setting a store up: a new
    /// admin principal of `account` with an `admin`-granted key. No caller is
    /// needed, so a host exposes it only to its operator (e.g. a setup
    /// command); every call makes another admin. Audited as `create_key` by
    /// the new principal.
    pub fn create_admin_key(&self, account: &str) -> Result<IssuedKey, Error> {
        let now = self.now_utc();
        let spec = KeySpec::admin(account);
        let issued = self.write(|writer| {
            let issued = insert_key(writer, &spec, now, None)?;
            let scope = ActionScope::new(Some(issued.info.principal), None, Action::CreateKey);
            writer.insert_event(&scope.event(now, key_resource(&issued.info.key_id)))?;
            Ok(issued)
        })?;
        self.after_write();
        Ok(issued)
    }

    /// Creates a key (admin only). `spec` names a new keyed or admin
    /// principal or an existing one; the `admin` grant is only for admin
    /// principals. Returns the key with its secret, shown this once.
    pub fn create_key(&self, caller: &Caller, spec: &KeySpec) -> Result<IssuedKey, Error> {
        let scope = ActionScope::of(caller, None, Action::CreateKey);
        if let Err(error) = caller.require_admin() {
            self.count(&scope, Outcome::Forbidden);
            return Err(error);
        }
        let now = self.now_utc();
        self.perform(&scope, now, |writer| {
            let issued = insert_key(writer, spec, now, None)?;
            let resource = key_resource(&issued.info.key_id);
            Ok((issued, resource))
        })
    }

    /// Lists keys, never their secrets: an admin any principal's or all;
    /// anyone else only its own principal's (`403` for another's). A
    /// successful read, audited as `list_keys`.
    pub fn list_keys(&self, caller: &Caller, filter: &KeyFilter) -> Result<Vec<KeyInfo>, Error> {
        let scope = ActionScope::of(caller, None, Action::ListKeys);
        let principal = self.rows_of(
            caller,
            &scope,
            filter.principal,
            "only an admin lists another principal's keys",
        )?;
        let limit = filter.limit.clamp(1, MAX_KEYS_LISTED);
        self.perform_read(&scope, |reader| {
            let keys = reader.keys(principal, filter.after.as_ref(), limit)?;
            Ok((keys, None))
        })
    }

    /// Revokes a key: it stops authenticating at once. An admin may revoke
    /// any key, anyone else its own principal's (`404` for others). Revoking
    /// a revoked key changes and audits nothing and returns it as it is.
    pub fn revoke_key(&self, caller: &Caller, key_id: &KeyId) -> Result<KeyInfo, Error> {
        self.change_key(caller, key_id, Action::RevokeKey, |info, now| {
            info.revoked_at.is_none().then_some(KeyChange::Revoke(now))
        })
    }

    /// Sets when a key stops working (`at` may be now or past, to expire it
    /// at once). Same permissions as [`revoke_key`](Self::revoke_key);
    /// setting the expiry it already has changes and audits nothing.
    pub fn expire_key(
        &self,
        caller: &Caller,
        key_id: &KeyId,
        at: DateTime<Utc>,
    ) -> Result<KeyInfo, Error> {
        let at = storable(at);
        self.change_key(caller, key_id, Action::ExpireKey, move |info, _| {
            (info.expires_at != Some(at)).then_some(KeyChange::Expire(at))
        })
    }

    fn change_key(
        &self,
        caller: &Caller,
        key_id: &KeyId,
        action: Action,
        change: impl Fn(&KeyInfo, DateTime<Utc>) -> Option<KeyChange>,
    ) -> Result<KeyInfo, Error> {
        let scope = ActionScope::of(caller, None, action);
        let now = self.now_utc();
        let visible = |stored: Option<crate::backend::StoredKey>| -> Result<KeyInfo, Error> {
            let info = stored.ok_or_else(|| not_found(key_id))?.info;
            if info.principal != caller.principal && !caller.is_admin() {
                return Err(not_found(key_id));
            }
            Ok(info)
        };
        // Decided on a read connection first, so a no-op writes nothing.
        let current = self
            .read(|reader| visible(reader.key(key_id)?))
            .inspect_err(|error| self.count(&scope, error.outcome()))?;
        if change(&current, now).is_none() {
            self.count(&scope, Outcome::Ok);
            return Ok(current);
        }
        self.perform_or_count(&scope, now, |writer| {
            // Changes of one key take turns: each sees the one before.
            writer.lock_row(RowLock::Key(key_id))?;
            let mut info = visible(writer.key(key_id)?)?;
            let Some(decided) = change(&info, now) else {
                // Another request made the same change since the read.
                return Ok((info, Trail::Count(Outcome::Ok)));
            };
            writer.change_key(key_id, decided)?;
            match decided {
                KeyChange::Revoke(at) => info.revoked_at = Some(at),
                KeyChange::Expire(at) => info.expires_at = Some(at),
            }
            Ok((info, Trail::Row(key_resource(key_id))))
        })
    }

    /// Writes `last_used_at` at once if the caller's account or kind
    /// changed (see [`authenticate`](Self::authenticate)); a refusal or
    /// failure is ignored (it is an observation, not the activity log), and
    /// the write is remembered as done so a refusing storage is not asked
    /// again within the interval.
    fn observe(&self, caller: &Caller, now: DateTime<Utc>) {
        let identity = (caller.account.clone(), caller.kind);
        // Due only for the interval: that write rides with the next
        // audited action instead.
        let decision = self
            .observations
            .lock()
            .observe(&caller.principal, &identity, now);
        if decision == Observation::Changed {
            let _ = self.write(|writer| {
                writer.touch_principal(caller.principal, now)?;
                Ok(())
            });
        }
    }
}

/// Inserts a key (and its principal, if new) inside `writer`'s transaction
/// at the store's `now`. `purge_at` marks an anonymous principal and its key
/// for retention.
pub(crate) fn insert_key(
    writer: &dyn WriteTransaction,
    spec: &KeySpec,
    now: DateTime<Utc>,
    purge_at: Option<DateTime<Utc>>,
) -> Result<IssuedKey, Error> {
    check_text("label", &spec.label, MAX_LABEL_LEN, true)?;
    if spec.expires_at.is_some_and(|expiry| expiry <= now) {
        return Err(Error::InvalidInput {
            reason: "a new key's expiry must be in the future".to_owned(),
        });
    }
    let (principal, kind, account) = match &spec.owner {
        Owner::New { kind, account } => {
            check_text("account", account, MAX_ACCOUNT_LEN, false)?;
            if spec.grants.contains(&Grant::Admin) && *kind != PrincipalKind::Admin {
                return Err(Error::InvalidInput {
                    reason: "only an admin principal holds the admin grant".to_owned(),
                });
            }
            if (*kind == PrincipalKind::Anonymous) != purge_at.is_some() {
                return Err(Error::InvalidInput {
                    reason: "anonymous principals, and only they, have a purge time".to_owned(),
                });
            }
            let id = writer.insert_principal(*kind, account, now, purge_at)?;
            (id, *kind, account.clone())
        }
        Owner::Existing(principal) => {
            let (kind, account) = writer
                .principal(*principal)?
                .ok_or_else(|| Error::NotFound {
                    what: format!("principal {principal}"),
                })?;
            // What the stored principal is decides these two, so they
            // contradict its state (`409`), not the request's shape.
            if kind == PrincipalKind::Anonymous && purge_at.is_none() {
                return Err(Error::conflict(
                    ConflictKind::Other,
                    "anonymous principals get keys only as sessions",
                ));
            }
            if spec.grants.contains(&Grant::Admin) && kind != PrincipalKind::Admin {
                return Err(Error::conflict(
                    ConflictKind::Other,
                    "only an admin principal holds the admin grant",
                ));
            }
            (*principal, kind, account)
        }
    };
    // Anonymous keys stop working when they are due for purging, even
    // before retention deletes them.
    let expires_at = match (spec.expires_at, purge_at) {
        (Some(expiry), Some(purge)) => Some(expiry.min(purge)),
        (expiry, purge) => expiry.or(purge),
    };
    // A key id collision (64 random bits) is retried with fresh randomness;
    // a second one in a row means the randomness is broken.
    for _ in 0..2 {
        let IssuedSecret {
            key_id,
            secret,
            hash,
        } = key::generate()?;
        let inserted = writer.insert_key(&NewKey {
            key_id: &key_id,
            principal,
            secret_hash: &hash,
            label: &spec.label,
            scopes: &spec.scopes,
            grants: &spec.grants,
            created_at: now,
            expires_at,
            purge_at,
        })?;
        if inserted {
            let info = KeyInfo {
                key_id,
                principal,
                kind,
                account,
                label: spec.label.clone(),
                scopes: spec.scopes.clone(),
                grants: spec.grants.clone(),
                created_at: now,
                expires_at: expires_at.map(storable),
                revoked_at: None,
                last_used_at: None,
            };
            return Ok(IssuedKey { info, secret });
        }
    }
    Err(Error::RandomnessUnavailable)
}
