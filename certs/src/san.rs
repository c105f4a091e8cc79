//! Subject alternative names for the server-side certificates and the per-node agent
//! certificates: parsing and checking.

use std::net::{IpAddr, Ipv6Addr};

use rcgen::SanType;

use crate::CertError;

/// Longest DNS name, in characters, without the trailing dot.
const MAX_NAME_LEN: usize = 253;

/// Longest DNS label, in characters.
const MAX_LABEL_LEN: usize = 63;

/// The SANs every server-side certificate carries: `localhost`, `127.0.0.1` and `::1`, then each
/// of `extra` (an IP literal becomes an IP SAN, anything else must be a DNS name), without
/// duplicates.
pub(crate) fn server_sans(extra: &[String]) -> Result<Vec<SanType>, CertError> {
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
    names.extend_from_slice(extra);
    sans(&names)
}

/// The SANs of node `node`'s agent certificate: `node`, which must be a DNS name
/// ([`CertError::InvalidNodeName`] otherwise), then each of `addresses` (IP literals or DNS
/// names), without duplicates.
pub(crate) fn agent_sans(node: &str, addresses: &[String]) -> Result<Vec<SanType>, CertError> {
    node_name(node)?;
    let mut names = vec![node.to_owned()];
    names.extend_from_slice(addresses);
    sans(&names)
}

/// Checks that `node` is a DNS name (no IP literal, no wildcard): it names one node.
fn node_name(node: &str) -> Result<(), CertError> {
    let invalid = |reason| CertError::InvalidNodeName {
        name: node.to_owned(),
        reason,
    };
    if parse(node).is_ok_and(|san| matches!(san, SanType::IpAddress(_))) {
        return Err(invalid("an IP address; a node name is a DNS name"));
    }
    if node.starts_with("*.") {
        return Err(invalid("a wildcard; a node name names one node"));
    }
    match dns_name(node) {
        Ok(_) => Ok(()),
        Err(CertError::InvalidSan { reason, .. }) => Err(invalid(reason)),
        Err(other) => Err(other),
    }
}

/// Each of `names` as a SAN ([`parse`]), without duplicates and without implicit ones.
pub(crate) fn sans(names: &[String]) -> Result<Vec<SanType>, CertError> {
    let mut sans: Vec<SanType> = Vec::new();
    for name in names {
        let san = parse(name)?;
        if !sans.iter().any(|known| same(known, &san)) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// Parses one SAN: an IPv4 or IPv6 literal (brackets allowed around IPv6), or a DNS name.
fn parse(name: &str) -> Result<SanType, CertError> {
    let unbracketed = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'));
    if let Some(inner) = unbracketed {
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| SanType::IpAddress(IpAddr::V6(ip)))
            .map_err(|_| invalid(name, "brackets must hold an IPv6 address"));
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => Ok(SanType::IpAddress(ip)),
        Err(_) => Ok(SanType::DnsName(dns_name(name)?)),
    }
}

/// Checks `name` is a DNS name a TLS client can match (RFC 1123 labels; `_` tolerated as
/// webpki does; a leading `*.` wildcard label allowed) and converts it.
fn dns_name(name: &str) -> Result<rcgen::string::Ia5String, CertError> {
    if name.is_empty() {
        return Err(invalid(name, "empty"));
    }
    if name.ends_with('.') {
        return Err(invalid(name, "remove the trailing dot"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(name, "longer than 253 characters"));
    }
    let rest = name.strip_prefix("*.").unwrap_or(name);
    let mut last_label = "";
    for label in rest.split('.') {
        check_label(name, label)?;
        last_label = label;
    }
    if last_label.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            name,
            "not a valid IP address, and a DNS name cannot end in a numeric label",
        ));
    }
    rcgen::string::Ia5String::try_from(name).map_err(|_| invalid(name, "not ASCII"))
}

fn check_label(name: &str, label: &str) -> Result<(), CertError> {
    if label.is_empty() {
        return Err(invalid(
            name,
            "empty label (two dots in a row, or a leading dot)",
        ));
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(invalid(name, "a label is longer than 63 characters"));
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            name,
            "DNS names may only hold letters, digits, '-', '_' and '.' (and a leading '*.')",
        ));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(invalid(name, "a label starts or ends with '-'"));
    }
    Ok(())
}

/// Whether two SANs name the same thing (DNS names compare case-insensitively).
fn same(a: &SanType, b: &SanType) -> bool {
    match (a, b) {
        (SanType::DnsName(a), SanType::DnsName(b)) => a.as_str().eq_ignore_ascii_case(b.as_str()),
        _ => a == b,
    }
}

fn invalid(name: &str, reason: &'static str) -> CertError {
    CertError::InvalidSan {
        san: name.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sans(extra: &[&str]) -> Result<Vec<SanType>, CertError> {
        server_sans(&extra.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn dns(name: &str) -> SanType {
        SanType::DnsName(name.try_into().unwrap())
    }

    fn ip(addr: &str) -> SanType {
        SanType::IpAddress(addr.parse().unwrap())
    }

    #[test]
    fn defaults_are_localhost_and_loopback_addresses() {
        assert_eq!(
            sans(&[]).unwrap(),
            vec![dns("localhost"), ip("127.0.0.1"), ip("::1")]
        );
    }

    #[test]
    fn extras_become_ip_or_dns_sans_in_order() {
        assert_eq!(
            sans(&[
                "10.0.0.5",
                "bridgehead.kube-system.svc",
                "[fd00::5]",
                "fd00::6",
                "*.example.com"
            ])
            .unwrap()[3..],
            [
                ip("10.0.0.5"),
                dns("bridgehead.kube-system.svc"),
                ip("fd00::5"),
                ip("fd00::6"),
                dns("*.example.com"),
            ]
        );
    }

    #[test]
    fn duplicates_are_dropped() {
        assert_eq!(
            sans(&[
                "LOCALHOST",
                "127.0.0.1",
                "0:0:0:0:0:0:0:1",
                "a.example",
                "A.example"
            ])
            .unwrap(),
            vec![
                dns("localhost"),
                ip("127.0.0.1"),
                ip("::1"),
                dns("a.example")
            ]
        );
    }

    #[test]
    fn invalid_names_are_rejected_with_the_name() {
        for bad in [
            "",
            " ",
            "a..b",
            ".a",
            "a.",
            "-a.b",
            "a-.b",
            "a b",
            "a/b",
            "10.0.0.256",
            "1.2.3",
            "[10.0.0.1]",
            "[::1",
            "ünïcode.example",
            "a.*.example",
            &"a".repeat(64),
            &format!("{}.example", ["a"; 125].join(".")),
        ] {
            match sans(&[bad]) {
                Err(CertError::InvalidSan { san, .. }) => assert_eq!(san, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    fn agent(node: &str, addresses: &[&str]) -> Result<Vec<SanType>, CertError> {
        let addresses = addresses.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        agent_sans(node, &addresses)
    }

    #[test]
    fn agent_sans_are_the_node_then_its_addresses() {
        assert_eq!(
            agent(
                "node-1",
                &["10.0.0.5", "fd00::5", "node-1.example", "NODE-1"]
            )
            .unwrap(),
            [
                dns("node-1"),
                ip("10.0.0.5"),
                ip("fd00::5"),
                dns("node-1.example")
            ]
        );
        assert_eq!(agent("node-1", &[]).unwrap(), [dns("node-1")]);
    }

    #[test]
    fn a_node_name_must_be_one_dns_name() {
        for (bad, reason) in [
            ("10.0.0.5", "an IP address; a node name is a DNS name"),
            ("[fd00::5]", "an IP address; a node name is a DNS name"),
            ("::1", "an IP address; a node name is a DNS name"),
            ("*.example", "a wildcard; a node name names one node"),
            ("", "empty"),
            (
                "node/1",
                "DNS names may only hold letters, digits, '-', '_' and '.' (and a leading '*.')",
            ),
            (
                "node..1",
                "empty label (two dots in a row, or a leading dot)",
            ),
        ] {
            match agent(bad, &[]) {
                Err(CertError::InvalidNodeName { name, reason: got }) => {
                    assert_eq!((name.as_str(), got), (bad, reason))
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!(matches!(
            agent("node-1", &["bad..address"]),
            Err(CertError::InvalidSan { san, .. }) if san == "bad..address"
        ));
    }

    #[test]
    fn error_message_names_the_san_and_the_reason() {
        let err = sans(&["a..b"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid SAN "a..b": empty label (two dots in a row, or a leading dot)"#
        );
    }
}
