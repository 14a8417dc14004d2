//! Anonymous sessions and the address hash.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use tessera_admission::{AddressGroup, AddressWindow, MintDecision};
use tessera_audit::{Action, AddressHasher, IpHash, Outcome, Resource, Secret};
use tessera_lease::Namespace;

use crate::backend::{LimitWindow, RowLock};
use crate::error::{Error, corrupt};
use crate::model::access::{Grant, KeySpec, Scope};
use crate::model::audit::ActionScope;
use crate::model::session::{ANONYMOUS_ACCOUNT, Session};
use crate::ops::access::insert_key;
use crate::store::Store;

/// The `tessera_meta` key of a generated address secret (64 hex digits).
const SECRET_KEY: &str = "address_secret";

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Store {
    /// The daily-rotated hash of `address`'s group (IPv6 by /64, IPv4 and
    /// IPv4-mapped IPv6 by the IPv4 address), for
    /// [`Caller::with_ip_hash`](crate::Caller::with_ip_hash).
    ///
    /// Keyed by the configured address secret, or by one the store
    /// generates the first time and keeps in `tessera_meta` (the only write
    /// this ever makes).
    pub fn hash_address(&self, address: IpAddr) -> Result<IpHash, Error> {
        let group = AddressGroup::from(address);
        Ok(self
            .address_hasher()?
            .hash(group.as_bytes(), self.now_utc()))
    }

    fn address_hasher(&self) -> Result<&AddressHasher, Error> {
        if let Some(hasher) = self.hasher.get() {
            return Ok(hasher);
        }
        let secret = match self.config.address_secret() {
            Some(secret) => secret.clone(),
            None => self.stored_secret()?,
        };
        Ok(self.hasher.get_or_init(|| AddressHasher::new(secret)))
    }

    fn stored_secret(&self) -> Result<Secret, Error> {
        let bad = || corrupt("address secret");
        let stored = self.read(|reader| Ok(reader.meta(SECRET_KEY)?))?;
        let text = match stored {
            Some(text) => text,
            None => {
                let mut bytes = [0_u8; 32];
                getrandom::fill(&mut bytes).map_err(|_| Error::RandomnessUnavailable)?;
                let fresh = crate::key::hex(&bytes);
                // Another process may have stored one first; theirs wins.
                self.write(|writer| {
                    writer.insert_meta(SECRET_KEY, &fresh)?;
                    Ok(writer.meta(SECRET_KEY)?)
                })?
                .ok_or_else(bad)?
            }
        };
        Secret::new(decode_hex(&text).ok_or_else(bad)?).map_err(|_| bad())
    }

    /// Mints an anonymous session for a caller at `address`.
    ///
    /// Admitted by the global mint allowance (accruing through the hour)
    /// and the per-address-group limit, in memory, and by the durable
    /// per-address quota row in `access_limits` (a fixed hourly window,
    /// so a restart does not reset it). A refusal is `429 rate_limited`
    /// with `Retry-After` and the reason, counted. A minted session writes
    /// only its principal, key, limit row and audit row; its namespace is
    /// created on first use.
    pub fn mint_session(&self, address: IpAddr) -> Result<Session, Error> {
        let group = AddressGroup::from(address);
        let now = self.now_utc();
        let ip_hash = self.address_hasher()?.hash(group.as_bytes(), now);
        let scope = ActionScope::new(None, None, Action::MintSession).with_ip_hash(ip_hash.clone());
        let decision = self.mint.lock().check(group, self.clock().now());
        if let MintDecision::Refused {
            retry_after,
            reason,
        } = decision
        {
            self.count(&scope, Outcome::RateLimited);
            return Err(Error::RateLimited {
                retry_after,
                reason: reason.to_string(),
            });
        }
        let result = self.mint_in_storage(&ip_hash, now);
        if let Err(error) = &result {
            self.count(&scope, error.outcome());
        } else {
            self.after_write();
        }
        result
    }

    fn mint_in_storage(&self, ip_hash: &IpHash, now: DateTime<Utc>) -> Result<Session, Error> {
        let mut nonce = [0_u8; 8];
        getrandom::fill(&mut nonce).map_err(|_| Error::RandomnessUnavailable)?;
        let namespace = Namespace::parse(&format!("session-{}", crate::key::hex(&nonce)))
            .expect("session-<hex> is a namespace");
        let lifetime = chrono::Duration::from_std(self.config.session_lifetime())
            .unwrap_or(chrono::Duration::MAX);
        let purge_at = now
            .checked_add_signed(lifetime)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let spec = KeySpec::anonymous(ANONYMOUS_ACCOUNT)
            .with_scopes(Scope::ALL.iter().copied())
            .with_grant(Grant::Namespace(namespace.clone()));
        let subject = format!("mint:{ip_hash}");
        let hour = AddressWindow::containing(now);
        let window = LimitWindow {
            subject: &subject,
            start: hour.start(),
            end: hour.end(),
        };
        let per_address = self.config.mint().per_address_per_hour;
        let key = self.write(|writer| {
            // Mints from one address take turns across processes, so none
            // reads a count another is about to raise.
            writer.lock_row(RowLock::Limit(&subject))?;
            let stored = writer.limit_count(&subject, window.start)?;
            if let MintDecision::Refused {
                retry_after,
                reason,
            } = hour.check(stored, per_address, now)
            {
                return Err(Error::RateLimited {
                    retry_after,
                    reason: reason.to_string(),
                });
            }
            writer.bump_limit(&window)?;
            let issued = insert_key(writer, &spec, now, Some(purge_at))?;
            let event = ActionScope::new(Some(issued.info.principal), None, Action::MintSession)
                .with_ip_hash(ip_hash.clone())
                .event(
                    now,
                    Resource::new(&format!("key:{}", issued.info.key_id)).ok(),
                );
            writer.insert_event(&event)?;
            Ok(issued)
        })?;
        let expires_at = key.info.expires_at.unwrap_or(purge_at);
        Ok(Session {
            key,
            namespace,
            expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decodes_what_key_hex_encodes() {
        let bytes = [0_u8, 1, 0xab, 0xff];
        assert_eq!(decode_hex(&crate::key::hex(&bytes)).unwrap(), bytes);
        assert!(decode_hex("abc").is_none());
        assert!(decode_hex("zz").is_none());
    }
}
