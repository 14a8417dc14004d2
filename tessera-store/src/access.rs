//! Principals, keys, grants, and resolving a presented key to a caller.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::{Action, IpHash, Observation, Outcome, Resource};
use tessera_lease::Namespace;

use crate::audit::{ActionScope, Trail, insert_event};
use crate::error::{Error, corrupt};
use crate::key::{self, IssuedSecret, KeyId, KeySecret, constant_time_eq};
use crate::sql::access::{self as sql, KeyRow, NewKey};
use crate::sql::{from_millis, millis, storable};
use crate::store::Store;

/// The most keys one [`Store::list_keys`] call returns.
pub const MAX_KEYS_LISTED: usize = 1000;

/// The longest account name, in bytes.
pub const MAX_ACCOUNT_LEN: usize = 128;

/// The longest key label, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// Identifies a principal; written `p<number>` (e.g. `p42`), which is also
/// its name in audit rows and as a lease holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PrincipalId(i64);

impl PrincipalId {
    /// The row id.
    pub fn get(self) -> i64 {
        self.0
    }

    /// Parses `p<number>`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        text.strip_prefix('p')
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
            .map(Self)
            .ok_or_else(|| Error::InvalidInput {
                reason: "a principal id is p followed by digits".to_owned(),
            })
    }

    /// The principal as a lease holder.
    pub fn lease_principal(self) -> tessera_lease::Principal {
        tessera_lease::Principal::parse(&self.to_string())
            .expect("p<digits> is a valid lease principal")
    }

    /// The principal as audit rows name it.
    pub fn audit_principal(self) -> tessera_audit::Principal {
        tessera_audit::Principal::new(&self.to_string())
            .expect("p<digits> is a valid audit principal")
    }
}

impl fmt::Display for PrincipalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

impl FromStr for PrincipalId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Self::parse(text)
    }
}

impl TryFrom<String> for PrincipalId {
    type Error = Error;

    fn try_from(text: String) -> Result<Self, Error> {
        Self::parse(&text)
    }
}

impl From<PrincipalId> for String {
    fn from(id: PrincipalId) -> Self {
        id.to_string()
    }
}

/// What kind of principal holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalKind {
    /// A worker or client with a key made by an administrator.
    Keyed,
    /// An anonymous session; deleted by retention at its purge time.
    Anonymous,
    /// An administrator.
    Admin,
}

impl PrincipalKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Anonymous => "anonymous",
            Self::Admin => "admin",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "keyed" => Some(Self::Keyed),
            "anonymous" => Some(Self::Anonymous),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

impl fmt::Display for PrincipalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation family a key may perform (an `admin` grant implies all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Scope {
    /// Put tasks into queues.
    Enqueue,
    /// Claim tasks and work under their leases: heartbeat, submit, fail.
    Claim,
    /// Read tasks, receipts, attempts and health.
    Read,
}

impl Scope {
    /// Every scope.
    pub const ALL: &'static [Scope] = &[Scope::Enqueue, Scope::Claim, Scope::Read];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enqueue => "enqueue",
            Self::Claim => "claim",
            Self::Read => "read",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|scope| scope.as_str() == text)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a key may act: `namespace:<name>`, `namespace:*` or `admin`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Grant {
    /// One namespace.
    Namespace(Namespace),
    /// Every namespace (not key management).
    AllNamespaces,
    /// Everything: every namespace, every scope, key management, every
    /// principal's audit. Only admin principals hold it.
    Admin,
}

impl Grant {
    /// Parses `namespace:<name>`, `namespace:*` or `admin`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if text == "admin" {
            return Ok(Self::Admin);
        }
        match text.strip_prefix("namespace:") {
            Some("*") => Ok(Self::AllNamespaces),
            Some(name) => Namespace::parse(name)
                .map(Self::Namespace)
                .map_err(|error| Error::InvalidInput {
                    reason: format!("grant: {error}"),
                }),
            None => Err(Error::InvalidInput {
                reason: "a grant is namespace:<name>, namespace:* or admin".to_owned(),
            }),
        }
    }

    fn covers(&self, namespace: &Namespace) -> bool {
        match self {
            Self::Namespace(granted) => granted == namespace,
            Self::AllNamespaces | Self::Admin => true,
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Namespace(name) => write!(f, "namespace:{name}"),
            Self::AllNamespaces => f.write_str("namespace:*"),
            Self::Admin => f.write_str("admin"),
        }
    }
}

impl FromStr for Grant {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Self::parse(text)
    }
}

impl TryFrom<String> for Grant {
    type Error = Error;

    fn try_from(text: String) -> Result<Self, Error> {
        Self::parse(&text)
    }
}

impl From<Grant> for String {
    fn from(grant: Grant) -> Self {
        grant.to_string()
    }
}

/// An authenticated request's identity: the key's principal, scopes and
/// grants as they were when the key was last checked.
///
/// Made by [`Store::authenticate`] and refreshed by [`Store::recheck`]; the
/// `require_*` checks decide `403` from it alone, before any namespace data
/// is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    principal: PrincipalId,
    kind: PrincipalKind,
    account: String,
    key_id: KeyId,
    scopes: Vec<Scope>,
    grants: Vec<Grant>,
    expires_at: Option<DateTime<Utc>>,
    ip_hash: Option<IpHash>,
}

impl Caller {
    /// The principal.
    pub fn principal(&self) -> PrincipalId {
        self.principal
    }

    /// The principal's kind.
    pub fn kind(&self) -> PrincipalKind {
        self.kind
    }

    /// The principal's account.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The key's public id.
    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }

    /// The key's scopes.
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    /// The key's grants.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// When the key expires, if it does.
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires_at
    }

    /// The caller's hashed address group, if the host supplied one.
    pub fn ip_hash(&self) -> Option<&IpHash> {
        self.ip_hash.as_ref()
    }

    /// Attaches the caller's hashed address group, recorded in its audit
    /// rows.
    #[must_use]
    pub fn with_ip_hash(mut self, ip_hash: IpHash) -> Self {
        self.ip_hash = Some(ip_hash);
        self
    }

    /// Whether the key holds the `admin` grant.
    pub fn is_admin(&self) -> bool {
        self.kind == PrincipalKind::Admin && self.grants.contains(&Grant::Admin)
    }

    /// Whether the key may perform `scope` (an admin may do everything).
    pub fn has_scope(&self, scope: Scope) -> bool {
        self.is_admin() || self.scopes.contains(&scope)
    }

    /// Whether the key's grants cover `namespace`.
    pub fn can_access(&self, namespace: &Namespace) -> bool {
        self.is_admin()
            || self
                .grants
                .iter()
                .any(|grant| *grant != Grant::Admin && grant.covers(namespace))
    }

    /// `403 forbidden` unless the grants cover `namespace`.
    pub fn require_namespace(&self, namespace: &Namespace) -> Result<(), Error> {
        if self.can_access(namespace) {
            Ok(())
        } else {
            Err(Error::Forbidden {
                reason: format!("no grant for namespace {namespace}"),
            })
        }
    }

    /// `403 forbidden` unless the key has `scope`.
    pub fn require_scope(&self, scope: Scope) -> Result<(), Error> {
        if self.has_scope(scope) {
            Ok(())
        } else {
            Err(Error::Forbidden {
                reason: format!("key lacks the {scope} scope"),
            })
        }
    }

    /// `403 forbidden` unless the key is an admin key.
    pub fn require_admin(&self) -> Result<(), Error> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(Error::Forbidden {
                reason: "admin grant required".to_owned(),
            })
        }
    }

    /// The principal as a lease holder (see [`PrincipalId::lease_principal`]).
    pub fn lease_principal(&self) -> tessera_lease::Principal {
        self.principal.lease_principal()
    }
}

/// A key as listed: everything but the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The public key id.
    pub key_id: KeyId,
    /// Its principal.
    pub principal: PrincipalId,
    /// The principal's kind.
    pub kind: PrincipalKind,
    /// The principal's account.
    pub account: String,
    /// A free-text label.
    pub label: String,
    /// Scopes.
    pub scopes: Vec<Scope>,
    /// Grants.
    pub grants: Vec<Grant>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The principal's last observed use; coalesced, so up to one
    /// observation interval behind its latest audited action.
    pub last_used_at: Option<DateTime<Utc>>,
}

impl KeyInfo {
    /// Whether the key authenticates at `now`.
    pub fn is_valid_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|expiry| now < expiry)
    }
}

/// A newly created key: its description and its secret, shown this once.
#[derive(Debug, Clone)]
pub struct IssuedKey {
    /// The key as listed.
    pub info: KeyInfo,
    /// The whole key to hand to its holder; the store keeps only its hash.
    pub secret: KeySecret,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    New {
        kind: PrincipalKind,
        account: String,
    },
    Existing(PrincipalId),
}

/// What [`Store::create_key`] makes.
///
/// ```
/// use tessera_store::{Grant, KeySpec, Namespace, Scope};
///
/// let spec = KeySpec::keyed("acme")
///     .with_scopes([Scope::Claim, Scope::Read])
///     .with_grant(Grant::Namespace(Namespace::parse("renders")?))
///     .with_label("render farm worker");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    owner: Owner,
    label: String,
    scopes: Vec<Scope>,
    grants: Vec<Grant>,
    expires_at: Option<DateTime<Utc>>,
}

impl KeySpec {
    fn new(owner: Owner) -> Self {
        Self {
            owner,
            label: String::new(),
            scopes: Vec::new(),
            grants: Vec::new(),
            expires_at: None,
        }
    }

    /// A key for a new keyed principal of `account`.
    pub fn keyed(account: &str) -> Self {
        Self::new(Owner::New {
            kind: PrincipalKind::Keyed,
            account: account.to_owned(),
        })
    }

    /// A key with the `admin` grant for a new admin principal of `account`.
    pub fn admin(account: &str) -> Self {
        Self::new(Owner::New {
            kind: PrincipalKind::Admin,
            account: account.to_owned(),
        })
        .with_grant(Grant::Admin)
    }

    /// A key for a new anonymous principal of `account`; made only by the
    /// store's session minting, which sets its purge time.
    pub(crate) fn anonymous(account: &str) -> Self {
        Self::new(Owner::New {
            kind: PrincipalKind::Anonymous,
            account: account.to_owned(),
        })
    }

    /// Another key for an existing keyed or admin principal.
    pub fn for_principal(principal: PrincipalId) -> Self {
        Self::new(Owner::Existing(principal))
    }

    /// Adds scopes.
    pub fn with_scopes(mut self, scopes: impl IntoIterator<Item = Scope>) -> Self {
        for scope in scopes {
            if !self.scopes.contains(&scope) {
                self.scopes.push(scope);
            }
        }
        self
    }

    /// Adds a grant.
    pub fn with_grant(mut self, grant: Grant) -> Self {
        if !self.grants.contains(&grant) {
            self.grants.push(grant);
        }
        self
    }

    /// Sets a label (at most [`MAX_LABEL_LEN`] bytes, no control
    /// characters).
    pub fn with_label(mut self, label: &str) -> Self {
        label.clone_into(&mut self.label);
        self
    }

    /// Makes the key stop working at `at`.
    pub fn with_expiry(mut self, at: DateTime<Utc>) -> Self {
        self.expires_at = Some(at);
        self
    }
}

/// Which keys [`Store::list_keys`] returns: in key id order, after `after`,
/// at most `limit` (1 to [`MAX_KEYS_LISTED`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFilter {
    /// Only this principal's keys; `None` lists the caller's own, or every
    /// key for an admin.
    pub principal: Option<PrincipalId>,
    /// Continue after this key id (the last one of the previous page).
    pub after: Option<KeyId>,
    /// At most this many.
    pub limit: usize,
}

impl Default for KeyFilter {
    fn default() -> Self {
        Self {
            principal: None,
            after: None,
            limit: 100,
        }
    }
}

fn check_text(what: &str, text: &str, max: usize, allow_empty: bool) -> Result<(), Error> {
    let problem = if text.is_empty() && !allow_empty {
        "is empty"
    } else if text.len() > max {
        "is too long"
    } else if text.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(Error::InvalidInput {
        reason: format!("{what} {problem}"),
    })
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("scopes and grants serialize")
}

/// Names read back from a row; ones this build does not know are skipped,
/// which can only take permissions away.
fn names<T>(json: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, Error> {
    let raw: Vec<String> =
        serde_json::from_str(json).map_err(|_| corrupt("key scopes or grants"))?;
    Ok(raw.iter().filter_map(|name| parse(name)).collect())
}

impl KeyRow {
    fn info(&self) -> Result<KeyInfo, Error> {
        let bad = || corrupt("key row");
        Ok(KeyInfo {
            key_id: KeyId::parse(&self.key_id).map_err(|_| bad())?,
            principal: PrincipalId(self.principal_id),
            kind: PrincipalKind::parse(&self.kind).ok_or_else(bad)?,
            account: self.account.clone(),
            label: self.label.clone(),
            scopes: names(&self.scopes, Scope::parse)?,
            grants: names(&self.grants, |name| Grant::parse(name).ok())?,
            created_at: from_millis(self.created_at),
            expires_at: self.expires_at.map(from_millis),
            revoked_at: self.revoked_at.map(from_millis),
            last_used_at: self.last_used_at.map(from_millis),
        })
    }
}

impl KeyInfo {
    fn caller(self, ip_hash: Option<IpHash>) -> Caller {
        Caller {
            principal: self.principal,
            kind: self.kind,
            account: self.account,
            key_id: self.key_id,
            scopes: self.scopes,
            grants: self.grants,
            expires_at: self.expires_at,
            ip_hash,
        }
    }
}

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
        let row = self
            .read(|reader| Ok(sql::key_by_key_id(reader, parsed.key_id)?))
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
        let info = row.info()?;
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
        let row = self.read(|reader| Ok(sql::key_by_key_id(reader, caller.key_id.as_str())?))?;
        let info = match row {
            Some(row) => row.info()?,
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
            insert_event(writer, &scope.event(now, key_resource(&issued.info.key_id)))?;
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
        let after = filter.after.as_ref().map_or("", KeyId::as_str);
        let limit = filter.limit.clamp(1, MAX_KEYS_LISTED) as i64;
        self.perform_read(&scope, |reader| {
            let rows = match principal {
                Some(principal) => sql::keys_of_principal(reader, principal.0, after, limit)?,
                None => sql::keys_all(reader, after, limit)?,
            };
            let keys = rows
                .iter()
                .map(KeyRow::info)
                .collect::<Result<Vec<_>, _>>()?;
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
        let visible = |row: Option<KeyRow>| -> Result<(i64, KeyInfo), Error> {
            let row = row.ok_or_else(|| not_found(key_id))?;
            let info = row.info()?;
            if info.principal != caller.principal && !caller.is_admin() {
                return Err(not_found(key_id));
            }
            Ok((row.id, info))
        };
        // Decided on a read connection first, so a no-op writes nothing.
        let current = self
            .read(|reader| visible(sql::key_by_key_id(reader, key_id.as_str())?))
            .inspect_err(|error| self.count(&scope, error.outcome()))?;
        if change(&current.1, now).is_none() {
            self.count(&scope, Outcome::Ok);
            return Ok(current.1);
        }
        self.perform_or_count(&scope, now, |writer| {
            let (id, mut info) = visible(sql::key_by_key_id(writer, key_id.as_str())?)?;
            match change(&info, now) {
                Some(KeyChange::Revoke(at)) => {
                    sql::revoke_key(writer, id, millis(at))?;
                    info.revoked_at = Some(at);
                }
                Some(KeyChange::Expire(at)) => {
                    sql::expire_key(writer, id, millis(at))?;
                    info.expires_at = Some(at);
                }
                // Another request made the same change since the read.
                None => return Ok((info, Trail::Count(Outcome::Ok))),
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
                sql::touch_principal(writer, caller.principal.0, millis(now))?;
                Ok(())
            });
        }
    }
}

/// What must be written at once when it changes: account and kind.
pub(crate) type Identity = (String, PrincipalKind);

enum KeyChange {
    Revoke(DateTime<Utc>),
    Expire(DateTime<Utc>),
}

/// Inserts a key (and its principal, if new) inside `writer`'s transaction
/// at the store's `now`. `purge_at` marks an anonymous principal and its key
/// for retention.
pub(crate) fn insert_key(
    writer: &crate::db::Writer<'_>,
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
            if (*kind == PrincipalKind::Anonymous) != purge_at.is_some() {
                return Err(Error::InvalidInput {
                    reason: "anonymous principals, and only they, have a purge time".to_owned(),
                });
            }
            let id = sql::insert_principal(
                writer,
                kind.as_str(),
                account,
                millis(now),
                purge_at.map(millis),
            )?;
            (PrincipalId(id), *kind, account.clone())
        }
        Owner::Existing(principal) => {
            let (kind, account) =
                sql::principal_by_id(writer, principal.0)?.ok_or_else(|| Error::NotFound {
                    what: format!("principal {principal}"),
                })?;
            let kind = PrincipalKind::parse(&kind).ok_or_else(|| corrupt("principal kind"))?;
            if kind == PrincipalKind::Anonymous && purge_at.is_none() {
                return Err(Error::InvalidInput {
                    reason: "anonymous principals get keys only as sessions".to_owned(),
                });
            }
            (*principal, kind, account)
        }
    };
    if spec.grants.contains(&Grant::Admin) && kind != PrincipalKind::Admin {
        return Err(Error::InvalidInput {
            reason: "only an admin principal holds the admin grant".to_owned(),
        });
    }
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
        let inserted = sql::insert_key(
            writer,
            &NewKey {
                key_id: key_id.as_str(),
                principal_id: principal.0,
                secret_hash: &hash,
                label: &spec.label,
                scopes: &to_json(&spec.scopes),
                grants: &to_json(&spec.grants),
                created_at: millis(now),
                expires_at: expires_at.map(millis),
                purge_at: purge_at.map(millis),
            },
        )?;
        if inserted.is_some() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(name: &str) -> Namespace {
        Namespace::parse(name).unwrap()
    }

    fn caller(kind: PrincipalKind, grants: Vec<Grant>, scopes: Vec<Scope>) -> Caller {
        Caller {
            principal: PrincipalId(7),
            kind,
            account: "acme".to_owned(),
            key_id: KeyId::parse("0123456789abcdef").unwrap(),
            scopes,
            grants,
            expires_at: None,
            ip_hash: None,
        }
    }

    #[test]
    fn grants_parse_and_print() {
        for text in ["admin", "namespace:*", "namespace:renders"] {
            assert_eq!(Grant::parse(text).unwrap().to_string(), text);
        }
        for bad in ["", "namespace:", "namespace:a/b", "root", "namespace:..x"] {
            assert!(Grant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn namespace_grants_decide_access() {
        let one = caller(
            PrincipalKind::Keyed,
            vec![Grant::Namespace(namespace("a"))],
            vec![Scope::Read],
        );
        assert!(one.require_namespace(&namespace("a")).is_ok());
        assert_eq!(
            one.require_namespace(&namespace("b")).unwrap_err().status(),
            403
        );
        assert_eq!(one.require_scope(Scope::Claim).unwrap_err().status(), 403);
        assert!(one.require_admin().is_err());

        let all = caller(PrincipalKind::Keyed, vec![Grant::AllNamespaces], vec![]);
        assert!(all.can_access(&namespace("anything")));
        assert!(!all.is_admin());
    }

    #[test]
    fn admin_needs_both_the_grant_and_the_kind() {
        let admin = caller(PrincipalKind::Admin, vec![Grant::Admin], vec![]);
        assert!(admin.is_admin());
        assert!(admin.has_scope(Scope::Claim));
        assert!(admin.can_access(&namespace("x")));
        let forged = caller(PrincipalKind::Keyed, vec![Grant::Admin], vec![]);
        assert!(!forged.is_admin());
        assert!(!forged.can_access(&namespace("x")));
    }

    #[test]
    fn principal_ids_round_trip() {
        let id = PrincipalId::parse("p42").unwrap();
        assert_eq!(id.get(), 42);
        assert_eq!(id.to_string(), "p42");
        assert_eq!(id.lease_principal().as_str(), "p42");
        for bad in ["42", "p", "p-1", "px", "P42"] {
            assert!(PrincipalId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_stored_names_are_skipped() {
        let scopes = names(r#"["read","teleport"]"#, Scope::parse).unwrap();
        assert_eq!(scopes, vec![Scope::Read]);
        assert!(names("not json", Scope::parse).is_err());
    }
}
