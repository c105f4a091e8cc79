//! Several servers behind one address: how a server says who it is in its upgrade answer, and
//! how an agent says which servers it already holds a session with (docs/protocol.md §1.1).
//!
//! The server answers the upgrade (101, and a 409 for a duplicate) with
//! [`SERVER_ID_HEADER`] and, on a 101, [`SERVER_COUNT_HEADER`]. The agent sends
//! [`CONNECTED_SERVERS_HEADER`]: the ids of its live sessions, so that a server it already
//! holds refuses the new one (409) instead of replacing the old.

use std::fmt;

/// Response header: the answering server's id.
pub const SERVER_ID_HEADER: &str = "bridgehead-server-id";
/// Response header: how many servers the answering server says there are (decimal, ≥ 1).
pub const SERVER_COUNT_HEADER: &str = "bridgehead-server-count";
/// Request header: the ids of the servers the agent holds a live session with, comma
/// separated.
pub const CONNECTED_SERVERS_HEADER: &str = "bridgehead-connected-servers";

/// Longest server id, in bytes.
pub const MAX_SERVER_ID_LEN: usize = 128;
/// Most ids an agent lists in [`CONNECTED_SERVERS_HEADER`]; a server ignores the rest.
pub const MAX_CONNECTED_SERVERS: usize = 64;
/// Largest server count a server may announce (a guard against a typo making every agent
/// search forever, not a limit anyone reaches).
pub const MAX_SERVER_COUNT: u32 = 1024;

/// Why a server id is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadServerId(String);

impl fmt::Display for BadServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadServerId {}

/// Checks a server id: 1 to [`MAX_SERVER_ID_LEN`] bytes of `A-Z a-z 0-9 . _ - : @` (safe in a
/// header, a comma-separated list, a log line and, lower-case, a Lease name).
pub fn check_server_id(id: &str) -> Result<(), BadServerId> {
    if id.is_empty() {
        return Err(BadServerId("empty server id".to_owned()));
    }
    if id.len() > MAX_SERVER_ID_LEN {
        return Err(BadServerId(format!(
            "server id of {} bytes: at most {MAX_SERVER_ID_LEN}",
            id.len()
        )));
    }
    match id.bytes().find(|&b| !is_id_byte(b)) {
        Some(b) => Err(BadServerId(format!(
            "server id \"{}\" holds {:?}: use A-Z a-z 0-9 . _ - : @",
            crate::text::Printable::cut(id, MAX_SERVER_ID_LEN).ascii(),
            char::from(b)
        ))),
        None => Ok(()),
    }
}

fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'@')
}

/// The ids in a [`CONNECTED_SERVERS_HEADER`] value: items trimmed, empty and invalid ones
/// skipped, at most [`MAX_CONNECTED_SERVERS`].
pub fn parse_connected_servers(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|id| check_server_id(id).is_ok())
        .take(MAX_CONNECTED_SERVERS)
}

/// A [`SERVER_COUNT_HEADER`] value: a decimal from 1 to [`MAX_SERVER_COUNT`].
pub fn parse_server_count(value: &str) -> Option<u32> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value
        .parse()
        .ok()
        .filter(|n| (1..=MAX_SERVER_COUNT).contains(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids() {
        for good in [
            "a",
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "cp-1.example.com",
            "node_1:8132@x",
            &"x".repeat(MAX_SERVER_ID_LEN),
        ] {
            assert_eq!(check_server_id(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("", "empty"),
            ("a,b", "','"),
            ("a b", "' '"),
            ("a\r\nx: y", "'\\r'"),
            ("é", "'Ã'"),
            (&"x".repeat(MAX_SERVER_ID_LEN + 1), "at most 128"),
        ] {
            let error = check_server_id(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    #[test]
    fn connected_servers() {
        let ids: Vec<&str> = parse_connected_servers(" a , b,,bad id, c ").collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let many = (0..100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            parse_connected_servers(&many).count(),
            MAX_CONNECTED_SERVERS
        );
        assert_eq!(parse_connected_servers("").count(), 0);
    }

    #[test]
    fn server_counts() {
        assert_eq!(parse_server_count("3"), Some(3));
        assert_eq!(parse_server_count(" 1 "), Some(1));
        assert_eq!(parse_server_count("1024"), Some(1024));
        for bad in [
            "0",
            "1025",
            "-1",
            "+2",
            "2.0",
            "",
            "x",
            "99999999999999999999",
        ] {
            assert_eq!(parse_server_count(bad), None, "{bad}");
        }
    }
}
