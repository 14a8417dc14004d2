//! Principals, keys and grants: who a caller is and what it may do.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tessera_audit::IpHash;
use tessera_lease::Namespace;

use crate::error::Error;
use crate::key::{KeyId, KeySecret};

/// The most keys one [`Store::list_keys`](crate::Store::list_keys) call returns.
pub const MAX_KEYS_LISTED: usize = 1000;

/// The longest account name, in bytes.
pub const MAX_ACCOUNT_LEN: usize = 128;

/// The longest key label, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// Identifies a principal; written `p<number>` (e.g. `p42`), which is also
/// its name in audit rows and as a lease holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PrincipalId(pub(crate) i64);

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

    pub(crate) fn parse(text: &str) -> Option<Self> {
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

    pub(crate) fn parse(text: &str) -> Option<Self> {
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
/// Made by [`Store::authenticate`](crate::Store::authenticate) and refreshed by [`Store::recheck`](crate::Store::recheck); the
/// `require_*` checks decide `403` from it alone, before any namespace data
/// is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    pub(crate) principal: PrincipalId,
    pub(crate) kind: PrincipalKind,
    pub(crate) account: String,
    pub(crate) key_id: KeyId,
    pub(crate) scopes: Vec<Scope>,
    pub(crate) grants: Vec<Grant>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) ip_hash: Option<IpHash>,
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
pub(crate) enum Owner {
    New {
        kind: PrincipalKind,
        account: String,
    },
    Existing(PrincipalId),
}

/// What [`Store::create_key`](crate::Store::create_key) makes.
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
    pub(crate) owner: Owner,
    pub(crate) label: String,
    pub(crate) scopes: Vec<Scope>,
    pub(crate) grants: Vec<Grant>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

impl KeySpec {
    pub(crate) fn new(owner: Owner) -> Self {
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

/// Which keys [`Store::list_keys`](crate::Store::list_keys) returns: in key id order, after `after`,
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

pub(crate) fn check_text(
    what: &str,
    text: &str,
    max: usize,
    allow_empty: bool,
) -> Result<(), Error> {
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

impl KeyInfo {
    pub(crate) fn caller(self, ip_hash: Option<IpHash>) -> Caller {
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

/// What must be written at once when it changes: account and kind.
pub(crate) type Identity = (String, PrincipalKind);

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
}
