//! Address grouping through the public API.

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use tessera_admission::AddressGroup;

fn group(text: &str) -> AddressGroup {
    AddressGroup::from(text.parse::<IpAddr>().unwrap())
}

#[test]
fn ipv4_groups_by_itself() {
    let g = group("192.0.2.1");
    assert!(g.is_ipv4());
    assert_eq!(g.to_string(), "192.0.2.1");
    assert_eq!(g.as_bytes(), [4, 192, 0, 2, 1]);
    assert_ne!(g, group("192.0.2.2"));
}

#[test]
fn ipv6_groups_by_slash_64() {
    let g = group("2001:db8:1:2:3:4:5:6");
    assert!(!g.is_ipv4());
    assert_eq!(g.to_string(), "2001:db8:1:2::/64");
    assert_eq!(g.as_bytes(), [6, 0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2]);
}

#[test]
fn two_addresses_of_one_slash_64_share_a_group() {
    assert_eq!(
        group("2001:db8:1:2::1"),
        group("2001:db8:1:2:ffff:ffff:ffff:ffff")
    );
    assert_ne!(group("2001:db8:1:2::1"), group("2001:db8:1:3::1"));
}

#[test]
fn ipv4_mapped_ipv6_groups_by_its_ipv4_address() {
    let mapped = group("::ffff:192.0.2.1");
    assert_eq!(mapped, group("192.0.2.1"));
    assert_eq!(mapped.to_string(), "192.0.2.1");
    assert_eq!(mapped.as_bytes(), [4, 192, 0, 2, 1]);
    // Another mapped address is another group, not one shared ::/64.
    assert_ne!(mapped, group("::ffff:192.0.2.2"));
}

#[test]
fn conversions_from_each_address_type_agree() {
    let v4 = Ipv4Addr::new(198, 51, 100, 7);
    let v6: Ipv6Addr = "2001:db8::7".parse().unwrap();
    assert_eq!(AddressGroup::from(v4), AddressGroup::from(IpAddr::V4(v4)));
    assert_eq!(AddressGroup::from(v6), AddressGroup::from(IpAddr::V6(v6)));
    assert_eq!(
        AddressGroup::from(v4.to_ipv6_mapped()),
        AddressGroup::from(v4)
    );
}

#[test]
fn families_never_encode_alike() {
    let v4 = group("0.0.0.0");
    let v6 = group("::");
    assert_ne!(v4, v6);
    assert_ne!(v4.as_bytes(), v6.as_bytes());
    assert_eq!((v4.as_bytes()[0], v6.as_bytes()[0]), (4, 6));
}

#[test]
fn usable_as_a_map_key() {
    let addresses = [
        "192.0.2.1",
        "2001:db8::1",
        "2001:db8::2",
        "::ffff:192.0.2.1",
    ];
    let hashed: HashSet<_> = addresses.iter().map(|a| group(a)).collect();
    let ordered: BTreeSet<_> = addresses.iter().map(|a| group(a)).collect();
    assert_eq!(hashed.len(), 2);
    assert_eq!(ordered.len(), 2);
    let original = group("192.0.2.1");
    let copy = original;
    assert_eq!(copy, original);
    assert_eq!(format!("{copy:?}"), "AddressGroup(192.0.2.1)");
}

#[test]
fn serde_uses_the_display_form() {
    let v6 = group("2001:db8:1:2::9");
    let json = serde_json::to_string(&v6).unwrap();
    assert_eq!(json, r#""2001:db8:1:2::/64""#);
    assert_eq!(serde_json::from_str::<AddressGroup>(&json).unwrap(), v6);

    let v4 = group("192.0.2.1");
    assert_eq!(serde_json::to_string(&v4).unwrap(), r#""192.0.2.1""#);
    assert_eq!(
        serde_json::from_str::<AddressGroup>(r#""192.0.2.1""#).unwrap(),
        v4
    );
}

#[test]
fn serde_rejects_what_display_never_produces() {
    for bad in [
        r#""2001:db8::1/64""#,
        r#""2001:db8::1""#,
        r#""10.0.0.0/8""#,
        "4",
    ] {
        assert!(serde_json::from_str::<AddressGroup>(bad).is_err(), "{bad}");
    }
}

proptest! {
    #[test]
    fn host_bits_never_change_an_ipv6_group(prefix: u64, host_a: u64, host_b: u64) {
        let a = Ipv6Addr::from((u128::from(prefix) << 64) | u128::from(host_a));
        let b = Ipv6Addr::from((u128::from(prefix) << 64) | u128::from(host_b));
        // Mapped addresses live in ::/64 but group by their IPv4 address.
        prop_assume!(a.to_ipv4_mapped().is_none() && b.to_ipv4_mapped().is_none());
        prop_assert_eq!(AddressGroup::from(a), AddressGroup::from(b));
    }

    #[test]
    fn display_and_serde_round_trip(bits: u128, v4: bool) {
        let address = if v4 {
            IpAddr::V4(Ipv4Addr::from(bits as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(bits))
        };
        let g = AddressGroup::from(address);
        let json = serde_json::to_string(&g).unwrap();
        prop_assert_eq!(&json, &format!("\"{g}\""));
        prop_assert_eq!(serde_json::from_str::<AddressGroup>(&json).unwrap(), g);
    }

    #[test]
    fn distinct_groups_have_distinct_bytes(a: u128, b: u128, a_v4: bool, b_v4: bool) {
        let make = |bits: u128, v4: bool| -> AddressGroup {
            if v4 { Ipv4Addr::from(bits as u32).into() } else { Ipv6Addr::from(bits).into() }
        };
        let (ga, gb) = (make(a, a_v4), make(b, b_v4));
        prop_assert_eq!(ga == gb, ga.as_bytes() == gb.as_bytes());
        prop_assert_eq!(ga.cmp(&gb), ga.as_bytes().cmp(gb.as_bytes()));
    }
}
