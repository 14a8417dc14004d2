//! Address groups: the unit a per-address limit and an address hash key on.
//!
//! One caller usually controls a whole IPv6 /64 (hosts rotate their interface
//! identifier freely), so keying on the full address lets a caller escape a
//! per-address limit by rotating. [`AddressGroup`] therefore groups:
//!
//! - an IPv4 address by itself (`192.0.2.1`);
//! - an IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) by its IPv4 address, so
//!   a dual-stack listener sees the same group as an IPv4 one;
//! - any other IPv6 address by its /64 prefix (`2001:db8:1:2::/64`).
//!
//! The group has stable bytes ([`AddressGroup::as_bytes`]) for hashing and
//! storage, and a [`Display`](fmt::Display) form that is also its serde form.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Leading byte of [`AddressGroup::as_bytes`] for an IPv4 group.
const TAG_V4: u8 = 4;
/// Leading byte of [`AddressGroup::as_bytes`] for an IPv6 /64 group.
const TAG_V6: u8 = 6;

/// The group an IP address belongs to for per-address limits and hashing.
///
/// Built with `From<IpAddr>` (or `From<Ipv4Addr>` / `From<Ipv6Addr>`); two
/// addresses of one IPv6 /64 give equal groups.
///
/// Ordering sorts every IPv4 group before every IPv6 group, then by address.
///
/// ```
/// use std::net::IpAddr;
/// use tessera_admission::AddressGroup;
///
/// let a: IpAddr = "2001:db8:1:2::10".parse().unwrap();
/// let b: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
/// assert_eq!(AddressGroup::from(a), AddressGroup::from(b));
/// assert_eq!(AddressGroup::from(a).to_string(), "2001:db8:1:2::/64");
///
/// let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
/// assert_eq!(AddressGroup::from(mapped).to_string(), "192.0.2.1");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressGroup {
    // The encoded form itself: a family tag then 4 (IPv4) or 8 (IPv6 /64)
    // bytes, zero padded. Keeping it encoded makes `as_bytes` free and
    // derives Eq, Hash and Ord that agree with the bytes.
    bytes: [u8; 9],
}

impl AddressGroup {
    /// The stable byte encoding of the group, for hashing and storage.
    ///
    /// IPv4: `[4, a, b, c, d]` (5 bytes). IPv6: `[6]` followed by the 8 bytes
    /// of the /64 prefix in network order (9 bytes). The leading family tag
    /// keeps an IPv4 group and an IPv6 group from ever encoding alike. The
    /// encoding never changes between releases.
    pub fn as_bytes(&self) -> &[u8] {
        match self.bytes[0] {
            TAG_V4 => &self.bytes[..5],
            _ => &self.bytes[..],
        }
    }

    /// Whether this group is a single IPv4 address (rather than an IPv6 /64).
    pub fn is_ipv4(&self) -> bool {
        self.bytes[0] == TAG_V4
    }

    fn v4(address: Ipv4Addr) -> Self {
        let mut bytes = [0; 9];
        bytes[0] = TAG_V4;
        bytes[1..5].copy_from_slice(&address.octets());
        Self { bytes }
    }

    fn v6_prefix(prefix: [u8; 8]) -> Self {
        let mut bytes = [0; 9];
        bytes[0] = TAG_V6;
        bytes[1..].copy_from_slice(&prefix);
        Self { bytes }
    }

    /// Parses the [`Display`](fmt::Display) form; `None` if it is not one.
    fn parse_display(text: &str) -> Option<Self> {
        if let Some(prefix) = text.strip_suffix("/64") {
            let address: Ipv6Addr = prefix.parse().ok()?;
            let octets = address.octets();
            // Only the canonical prefix round-trips: no host bits.
            if octets[8..] != [0; 8] {
                return None;
            }
            let mut prefix = [0; 8];
            prefix.copy_from_slice(&octets[..8]);
            Some(Self::v6_prefix(prefix))
        } else {
            text.parse::<Ipv4Addr>().ok().map(Self::v4)
        }
    }
}

impl From<Ipv4Addr> for AddressGroup {
    fn from(address: Ipv4Addr) -> Self {
        Self::v4(address)
    }
}

impl From<Ipv6Addr> for AddressGroup {
    fn from(address: Ipv6Addr) -> Self {
        if let Some(v4) = address.to_ipv4_mapped() {
            return Self::v4(v4);
        }
        let mut prefix = [0; 8];
        prefix.copy_from_slice(&address.octets()[..8]);
        Self::v6_prefix(prefix)
    }
}

impl From<IpAddr> for AddressGroup {
    fn from(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }
}

impl fmt::Display for AddressGroup {
    /// `192.0.2.1` for IPv4, `2001:db8:1:2::/64` for an IPv6 prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ipv4() {
            let mut octets = [0; 4];
            octets.copy_from_slice(&self.bytes[1..5]);
            Ipv4Addr::from(octets).fmt(f)
        } else {
            let mut octets = [0; 16];
            octets[..8].copy_from_slice(&self.bytes[1..]);
            write!(f, "{}/64", Ipv6Addr::from(octets))
        }
    }
}

impl fmt::Debug for AddressGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AddressGroup({self})")
    }
}

impl Serialize for AddressGroup {
    /// Serialized as its [`Display`](fmt::Display) string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AddressGroup {
    /// Accepts exactly the [`Display`](fmt::Display) forms: an IPv4 address,
    /// or an IPv6 /64 prefix with no host bits, written with `/64`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse_display(&text).ok_or_else(|| {
            serde::de::Error::custom(format_args!(
                "invalid address group {text:?}: expected an IPv4 address or an IPv6 /64 prefix"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(text: &str) -> AddressGroup {
        text.parse::<IpAddr>().unwrap().into()
    }

    #[test]
    fn display_round_trips_through_parse() {
        for text in ["192.0.2.1", "0.0.0.0", "2001:db8:1:2::/64", "::/64"] {
            let parsed = AddressGroup::parse_display(text).unwrap();
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn parse_rejects_non_canonical_forms() {
        for text in [
            "2001:db8::1/64",
            "2001:db8::/48",
            "2001:db8::",
            "192.0.2.1/32",
            "",
            "x",
        ] {
            assert_eq!(AddressGroup::parse_display(text), None, "{text}");
        }
    }

    #[test]
    fn ipv4_sorts_before_ipv6() {
        assert!(group("255.255.255.255") < group("::1"));
        assert!(group("10.0.0.1") < group("10.0.0.2"));
    }

    #[test]
    fn ipv4_compatible_address_is_not_treated_as_mapped() {
        // `::192.0.2.1` is a deprecated IPv4-compatible IPv6 address: only
        // the mapped form `::ffff:a.b.c.d` is grouped as IPv4.
        assert_eq!(group("::192.0.2.1").to_string(), "::/64");
    }
}
