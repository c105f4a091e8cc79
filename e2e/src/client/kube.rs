//! The bytes of a CONNECT exchange as kube-apiserver's egress dialer makes it, shared by the
//! blocking and the async client: what it writes, and how it reads the answer.

use anyhow::Context;

/// Exactly what kube-apiserver writes on a fresh connection to ask for a tunnel.
pub fn connect_head(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
}

/// The length of the response head at the start of `buf` (through its `\r\n\r\n`), once it
/// has arrived whole.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|end| end + 4)
}

/// The status code of a response head.
pub fn status(head: &str) -> anyhow::Result<u16> {
    head.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))
}

/// The value of header `name` (case-insensitive) in a response head, if present.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then_some(value.trim())
    })
}
