//! Host names and `host:port` as every part of Bridgehead writes and checks them: one DNS-name
//! check (the server's CONNECT targets, the agents' `host=` identifiers), one way to put
//! brackets around an IPv6 literal and one to take them off.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// Longest DNS name, in bytes, not counting an optional trailing dot.
pub const MAX_NAME_LEN: usize = 253;
/// Longest label of a DNS name, in bytes.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a string is not a host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameError {
    Empty,
    TooLong,
    EmptyLabel,
    LabelTooLong,
    Character,
    Hyphen,
    Numeric,
}

impl std::error::Error for NameError {}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl NameError {
    /// What is wrong, for callers that keep `&'static str` reasons.
    pub fn message(self) -> &'static str {
        match self {
            NameError::Empty => "host name (empty)",
            NameError::TooLong => "host name (longer than 253 bytes)",
            NameError::EmptyLabel => "host name (empty label)",
            NameError::LabelTooLong => "host name (label longer than 63 bytes)",
            NameError::Character => "host name (letters, digits, '-', '_' and dots only)",
            NameError::Hyphen => "host name (a label starts or ends with '-')",
            NameError::Numeric => {
                "host name (ends in a numeric label: not an IP address in canonical form, and no DNS name)"
            }
        }
    }
}

/// Checks a DNS or node name: labels of 1 to [`MAX_LABEL_LEN`] bytes of `[A-Za-z0-9_-]`, not
/// starting or ending with `-`, at most [`MAX_NAME_LEN`] bytes, optionally one trailing dot,
/// and a last label that is not all digits. That last rule (RFC 1123's: no top-level domain is
/// numeric) refuses the spellings resolvers read as IPv4 addresses — `2130706433`, `0x7f.1`,
/// `0177.0.0.1`, `10.0.0.5.` — which would otherwise slip past name-based routing and any
/// address policy as "names".
pub fn check_name(name: &str) -> Result<(), NameError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    let mut last = "";
    for label in name.split('.') {
        last = label;
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong);
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(NameError::Character);
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(NameError::Hyphen);
        }
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NameError::Numeric);
    }
    Ok(())
}

/// Checks a host: an IP literal (IPv6 without brackets) or a name ([`check_name`]).
pub fn check_host(host: &str) -> Result<(), NameError> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    check_name(host)
}

/// `host` without the brackets around it, if it has both.
pub fn strip_brackets(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `host:port` for URLs, logs and CONNECT lines: `[fd00::5]:10250` for an IPv6 literal
/// (given without brackets), `node1:10250` and `10.0.0.5:10250` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPort<'a>(pub &'a str, pub u16);

impl fmt::Display for HostPort<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let HostPort(host, port) = *self;
        if host.parse::<Ipv6Addr>().is_ok() {
            write!(f, "[{host}]:{port}")
        } else {
            write!(f, "{host}:{port}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in [
            "node1",
            "Node-1.example.com.",
            "a_b",
            &"a".repeat(63),
            "1password.com",
        ] {
            assert_eq!(check_name(good), Ok(()), "{good:?}");
        }
        let long = vec!["a".repeat(63); 4].join(".");
        for (bad, error) in [
            ("", NameError::Empty),
            (".", NameError::Empty),
            (long.as_str(), NameError::TooLong),
            ("a..b", NameError::EmptyLabel),
            (&"a".repeat(64), NameError::LabelTooLong),
            ("a b", NameError::Character),
            ("fd00::5", NameError::Character),
            ("-a", NameError::Hyphen),
            ("a-.b", NameError::Hyphen),
            ("2130706433", NameError::Numeric),
            ("0x7f.1", NameError::Numeric),
            ("0177.0.0.1", NameError::Numeric),
            ("10.0.0.5.", NameError::Numeric),
            ("10.0.0.5", NameError::Numeric),
        ] {
            assert_eq!(check_name(bad), Err(error), "{bad:?}");
            assert_eq!(error.to_string(), error.message());
        }
        assert_eq!(check_host("fd00::5"), Ok(()));
        assert_eq!(check_host("10.0.0.5"), Ok(()));
        assert_eq!(check_host("[fd00::5]"), Err(NameError::Character));
    }

    /// The messages reach 400 answers and startup errors as they are.
    #[test]
    fn messages_name_the_problem() {
        for (error, message) in [
            (NameError::Empty, "host name (empty)"),
            (NameError::TooLong, "host name (longer than 253 bytes)"),
            (NameError::EmptyLabel, "host name (empty label)"),
            (
                NameError::LabelTooLong,
                "host name (label longer than 63 bytes)",
            ),
            (
                NameError::Character,
                "host name (letters, digits, '-', '_' and dots only)",
            ),
            (
                NameError::Hyphen,
                "host name (a label starts or ends with '-')",
            ),
            (
                NameError::Numeric,
                "host name (ends in a numeric label: not an IP address in canonical form, and no DNS name)",
            ),
        ] {
            assert_eq!(error.message(), message);
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn brackets() {
        assert_eq!(strip_brackets("[fd00::5]"), "fd00::5");
        assert_eq!(strip_brackets("fd00::5"), "fd00::5");
        assert_eq!(strip_brackets("[fd00::5"), "[fd00::5");
        assert_eq!(HostPort("fd00::5", 1).to_string(), "[fd00::5]:1");
        assert_eq!(HostPort("10.0.0.5", 2).to_string(), "10.0.0.5:2");
        assert_eq!(HostPort("node1", 3).to_string(), "node1:3");
    }
}
