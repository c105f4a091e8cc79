//! Agent identifier parsing, validation and encoding.

use std::net::{Ipv4Addr, Ipv6Addr};

use bridgehead_proto::ident::{AgentIdentifiers, IdentError};
use ipnet::IpNet;
use proptest::prelude::*;

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn parse(query: &str) -> AgentIdentifiers {
    AgentIdentifiers::parse(query).unwrap_or_else(|e| panic!("{query:?} should parse: {e}"))
}

/// The example from the design and the brief, pinned field by field.
#[test]
fn plain_localhost_form() {
    let ids = parse("host=localhost&cidr=127.0.0.1/16&ipv6=::1");
    assert_eq!(
        ids,
        AgentIdentifiers {
            id: None,
            hosts: vec!["localhost".into()],
            ipv4: vec![],
            ipv6: vec![Ipv6Addr::LOCALHOST],
            cidrs: vec![net("127.0.0.0/16")],
            default_route: false,
            unknown: vec![],
        }
    );
    assert_eq!(
        ids.to_query(),
        "host=localhost&ipv6=%3A%3A1&cidr=127.0.0.0%2F16"
    );
    assert_eq!(ids.to_string(), "host=localhost ipv6=::1 cidr=127.0.0.0/16");
}

#[test]
fn valid_inputs() {
    let node1 = AgentIdentifiers {
        hosts: vec!["node1".into()],
        ipv4: vec![v4("10.0.0.5")],
        cidrs: vec![net("10.244.1.0/24")],
        ..Default::default()
    };
    let cases: Vec<(&str, AgentIdentifiers)> = vec![
        ("", AgentIdentifiers::default()),
        ("?", AgentIdentifiers::default()),
        ("&&&", AgentIdentifiers::default()),
        ("host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24", node1.clone()),
        (
            "?host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24",
            node1.clone(),
        ),
        (
            "host=node1&ipv4=10.0.0.5&cidr=10.244.1.0%2F24",
            node1.clone(),
        ),
        ("&host=node1&&ipv4=10.0.0.5&&cidr=10.244.1.0/24&", node1),
        (
            "ipv6=fd00%3A%3A5",
            AgentIdentifiers {
                ipv6: vec![v6("fd00::5")],
                ..Default::default()
            },
        ),
        (
            "ipv6=[fd00::5]&ipv6=%5Bfd00%3A%3A6%5D&ipv6=FD00:0:0:0:0:0:0:7",
            AgentIdentifiers {
                ipv6: vec![v6("fd00::5"), v6("fd00::6"), v6("fd00::7")],
                ..Default::default()
            },
        ),
        (
            "host=a&host=b.example.com.&host=node_1&host=10.0.0.9&host=fd00::1&host=A-1.B",
            AgentIdentifiers {
                hosts: vec![
                    "a".into(),
                    "b.example.com.".into(),
                    "node_1".into(),
                    "10.0.0.9".into(),
                    "fd00::1".into(),
                    "A-1.B".into(),
                ],
                ..Default::default()
            },
        ),
        (
            "ipv4=10.0.0.1&ipv4=192.168.1.1&ipv4=10.0.0.1",
            AgentIdentifiers {
                ipv4: vec![v4("10.0.0.1"), v4("192.168.1.1"), v4("10.0.0.1")],
                ..Default::default()
            },
        ),
        (
            "cidr=10.1.2.3/8&cidr=fd00::1:2/64&cidr=10.0.0.7/32&cidr=0.0.0.0/0",
            AgentIdentifiers {
                cidrs: vec![
                    net("10.0.0.0/8"),
                    net("fd00::/64"),
                    net("10.0.0.7/32"),
                    net("0.0.0.0/0"),
                ],
                ..Default::default()
            },
        ),
        (
            "default-route=true",
            AgentIdentifiers {
                default_route: true,
                ..Default::default()
            },
        ),
        (
            "default-route=TRUE",
            AgentIdentifiers {
                default_route: true,
                ..Default::default()
            },
        ),
        ("default-route=false", AgentIdentifiers::default()),
        (
            "default-route=true&default-route=False",
            AgentIdentifiers::default(),
        ),
        (
            "default-route=false&default-route=True",
            AgentIdentifiers {
                default_route: true,
                ..Default::default()
            },
        ),
        (
            "id=agent-1&zone=eu-west-1a&zone=b&future=&ID=x",
            AgentIdentifiers {
                id: Some("agent-1".into()),
                unknown: vec![
                    ("zone".into(), "eu-west-1a".into()),
                    ("zone".into(), "b".into()),
                    ("future".into(), String::new()),
                    ("ID".into(), "x".into()),
                ],
                ..Default::default()
            },
        ),
        (
            "id=%21weird~id%25",
            AgentIdentifiers {
                id: Some("!weird~id%".into()),
                ..Default::default()
            },
        ),
        (
            // A lone `%` is kept literally, as browsers and form_urlencoded do.
            "id=50%off&zone=caf%C3%A9+cr%C3%A8me",
            AgentIdentifiers {
                id: Some("50%off".into()),
                unknown: vec![("zone".into(), "café crème".into())],
                ..Default::default()
            },
        ),
    ];
    for (query, expected) in cases {
        assert_eq!(parse(query), expected, "query {query:?}");
    }
}

#[test]
fn host_length_limits() {
    let label = "a".repeat(63);
    let name = [label.as_str(); 4].join(".")[..253].to_owned();
    assert_eq!(name.len(), 253);
    assert!(!name.ends_with('.'));
    parse(&format!("host={name}"));
    parse(&format!("host={name}."));
    parse(&format!("id={}", "x".repeat(253)));
}

/// Spellings a resolver reads as IPv4 addresses are no host names.
#[test]
fn host_names_are_not_numbers() {
    for numeric in ["2130706433", "0x7f.1", "0177.0.0.1", "10.0.0.5.", "node.42"] {
        let error = err(&format!("host={numeric}"));
        assert!(
            error.to_string().contains("numeric label"),
            "{numeric}: {error}"
        );
    }
    parse("host=10.0.0.5");
    parse("host=node42");
}

fn err(query: &str) -> IdentError {
    match AgentIdentifiers::parse(query) {
        Ok(ids) => panic!("{query:?} should fail, parsed as {ids:?}"),
        Err(e) => e,
    }
}

#[test]
fn invalid_values_name_key_and_value() {
    let long_label = format!("host={}", "a".repeat(64));
    let long_host = format!("host={}b", ["a"; 127].join(".")); // 254 bytes
    let long_id = format!("id={}", "x".repeat(254));
    let cases: Vec<(&str, &str, &str)> = vec![
        ("ipv4=10.0.0.999", "ipv4", "10.0.0.999"),
        ("ipv4=10.0.0", "ipv4", "10.0.0"),
        ("ipv4=010.0.0.1", "ipv4", "010.0.0.1"),
        ("ipv4=::1", "ipv4", "::1"),
        ("ipv4=node1", "ipv4", "node1"),
        ("ipv6=10.0.0.5", "ipv6", "10.0.0.5"),
        ("ipv6=fd00:::5", "ipv6", "fd00:::5"),
        ("ipv6=[fd00::5", "ipv6", "[fd00::5"),
        ("ipv6=fd00::5]", "ipv6", "fd00::5]"),
        ("cidr=10.0.0.0", "cidr", "10.0.0.0"),
        ("cidr=10.0.0.0/33", "cidr", "10.0.0.0/33"),
        ("cidr=fd00::/129", "cidr", "fd00::/129"),
        ("cidr=node1/24", "cidr", "node1/24"),
        ("host=-node", "host", "-node"),
        ("host=node-", "host", "node-"),
        ("host=a..b", "host", "a..b"),
        ("host=.", "host", "."),
        ("host=node1..", "host", "node1.."),
        ("host=.node1", "host", ".node1"),
        ("host=no+de", "host", "no de"),
        ("host=n%C3%B6de", "host", "nöde"),
        ("host=[fd00::5]", "host", "[fd00::5]"),
        ("host=a:b", "host", "a:b"),
        (&long_label, "host", &long_label[5..]),
        (&long_host, "host", &long_host[5..]),
        ("id=has+space", "id", "has space"),
        ("id=tab%09", "id", "tab\t"),
        ("id=caf%C3%A9", "id", "café"),
        (&long_id, "id", &long_id[3..]),
        ("default-route=yes", "default-route", "yes"),
        ("default-route=1", "default-route", "1"),
        ("default-route=0", "default-route", "0"),
    ];
    for (query, key, value) in cases {
        let e = err(query);
        match &e {
            IdentError::Invalid {
                key: k, value: v, ..
            } => {
                assert_eq!((k.as_str(), v.as_str()), (key, value), "query {query:?}");
            }
            other => panic!("{query:?}: expected Invalid, got {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{value:?}")),
            "{msg:?} names the value"
        );
        assert!(
            msg.ends_with(&format!("for key {key}")),
            "{msg:?} names the key"
        );
    }
}

#[test]
fn invalid_message_format() {
    assert_eq!(
        err("ipv4=10.0.0.999").to_string(),
        r#"invalid ipv4 address "10.0.0.999" for key ipv4"#
    );
    assert_eq!(
        err("ipv6=10.0.0.5").to_string(),
        r#"invalid ipv6 address (this is an IPv4 address: use ipv4=) "10.0.0.5" for key ipv6"#
    );
    // A bare address as a cidr is told what is missing; anything else gets the shape.
    assert_eq!(
        err("cidr=10.0.0.0").to_string(),
        r#"invalid cidr (address/prefix-length; the prefix length is missing) "10.0.0.0" for key cidr"#
    );
    assert_eq!(
        err("cidr=node1/24").to_string(),
        r#"invalid cidr (address/prefix-length) "node1/24" for key cidr"#
    );
}

#[test]
fn empty_values() {
    for key in ["id", "host", "ipv4", "ipv6", "cidr", "default-route"] {
        for query in [
            format!("{key}="),
            key.to_string(),
            format!("host=a&{key}=&ipv4=10.0.0.1"),
        ] {
            let e = err(&query);
            assert_eq!(e, IdentError::Empty { key: key.into() }, "query {query:?}");
            assert_eq!(e.to_string(), format!("empty value for key {key}"));
        }
    }
}

#[test]
fn duplicate_id() {
    assert_eq!(err("id=a&id=b"), IdentError::DuplicateId);
    assert_eq!(err("id=a&host=x&id=a"), IdentError::DuplicateId);
    assert!(err("id=a&id=b").to_string().contains("id"));
}

#[test]
fn malformed() {
    for query in [
        "host=%FF",
        "id=a%C3",
        "zone=%C3%28",
        "%E2%82=1",
        "=value",
        "=",
        "host=a&=b",
    ] {
        match err(query) {
            IdentError::Malformed(msg) => assert!(!msg.is_empty()),
            other => panic!("{query:?}: expected Malformed, got {other:?}"),
        }
    }
    assert!(err("=value").to_string().contains("\"value\""));
}

#[test]
fn reject_unknown_names_the_first_unknown_key() {
    let ids = parse("host=a&zone=x&rack=1&zone=y");
    assert_eq!(
        ids.reject_unknown(),
        Err(IdentError::UnknownKey { key: "zone".into() })
    );
    assert_eq!(
        ids.reject_unknown().unwrap_err().to_string(),
        r#"unknown identifier key "zone""#
    );
    assert_eq!(parse("host=a&ipv4=10.0.0.1").reject_unknown(), Ok(()));
    assert_eq!(AgentIdentifiers::default().reject_unknown(), Ok(()));
}

#[test]
fn to_query_order_and_encoding() {
    let ids = parse(
        "zone=eu+1&cidr=10.244.1.9/24&default-route=true&ipv6=[fd00::5]&ipv4=10.0.0.5&host=node1&id=agent/1",
    );
    assert_eq!(
        ids.to_query(),
        "id=agent%2F1&host=node1&ipv4=10.0.0.5&ipv6=fd00%3A%3A5&cidr=10.244.1.0%2F24\
         &default-route=true&zone=eu+1"
    );
    assert_eq!(parse(&ids.to_query()), ids);
    assert_eq!(
        ids.to_string(),
        "id=agent/1 host=node1 ipv4=10.0.0.5 ipv6=fd00::5 cidr=10.244.1.0/24 default-route=true \
         zone=\"eu 1\""
    );
    assert_eq!(AgentIdentifiers::default().to_query(), "");
    assert_eq!(AgentIdentifiers::default().to_string(), "");
}

#[test]
fn display_escapes_untrusted_unknown_values() {
    let ids = parse("zone=a%0Aid%3Dforged&k%22=v");
    assert_eq!(ids.to_string(), r#"zone="a\nid=forged" "k\""=v"#);
}

#[test]
fn from_str_is_parse() {
    let ids: AgentIdentifiers = "host=node1".parse().unwrap();
    assert_eq!(ids, parse("host=node1"));
}

fn label() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_]([A-Za-z0-9_-]{0,8}[A-Za-z0-9_])?"
}

fn host() -> impl Strategy<Value = String> {
    (prop::collection::vec(label(), 1..4), any::<bool>())
        // A numeric last label reads as an IPv4 address: refused (host_names_are_not_numbers).
        .prop_filter("numeric last label", |(labels, _)| {
            !labels
                .last()
                .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
        })
        .prop_map(|(labels, dot)| {
            let mut name = labels.join(".");
            if dot {
                name.push('.');
            }
            name
        })
}

fn ident() -> impl Strategy<Value = AgentIdentifiers> {
    let unknown_key = "[a-z%&=+ ./é-]{1,8}".prop_filter("known key", |k| {
        !["id", "host", "ipv4", "ipv6", "cidr", "default-route"].contains(&k.as_str())
    });
    (
        proptest::option::of("[!-~]{1,20}"),
        prop::collection::vec(host(), 0..3),
        prop::collection::vec(any::<Ipv4Addr>(), 0..3),
        prop::collection::vec(any::<Ipv6Addr>(), 0..3),
        prop::collection::vec(
            prop_oneof![
                (any::<Ipv4Addr>(), 0u8..=32).prop_map(|(a, p)| IpNet::new(a.into(), p).unwrap()),
                (any::<Ipv6Addr>(), 0u8..=128).prop_map(|(a, p)| IpNet::new(a.into(), p).unwrap()),
            ]
            .prop_map(|n| n.trunc()),
            0..3,
        ),
        any::<bool>(),
        prop::collection::vec((unknown_key, "\\PC{0,10}"), 0..3),
    )
        .prop_map(
            |(id, hosts, ipv4, ipv6, cidrs, default_route, unknown)| AgentIdentifiers {
                id,
                hosts,
                ipv4,
                ipv6,
                cidrs,
                default_route,
                unknown,
            },
        )
}

proptest! {
    #[test]
    fn to_query_round_trips(ids in ident()) {
        let query = ids.to_query();
        prop_assert_eq!(AgentIdentifiers::parse(&query), Ok(ids.clone()), "query {}", query);
        prop_assert_eq!(AgentIdentifiers::parse(&format!("?{query}")), Ok(ids));
    }

    #[test]
    fn parse_never_panics(query in "\\PC{0,64}") {
        let _ = AgentIdentifiers::parse(&query);
    }

    #[test]
    fn parse_ok_round_trips(query in "((id|host|ipv4|ipv6|cidr|default-route|zone)=[0-9a-f.:/%\\[\\]A-Za-z-]{0,12}&?){0,4}") {
        if let Ok(ids) = AgentIdentifiers::parse(&query) {
            prop_assert_eq!(AgentIdentifiers::parse(&ids.to_query()), Ok(ids));
        }
    }
}
