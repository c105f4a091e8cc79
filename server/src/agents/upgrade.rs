//! The server's side of the WebSocket upgrade (RFC 6455 §4.2), for both ports that take one:
//! the agent port (`GET /connect`) and the peer port (`GET /peer`). [`pre_auth`] is what a
//! connection does before it has proved who it is (TLS, then the request head, on a socket
//! that reports stalls to its admission place); [`request`] checks the head as both ports
//! need it — method, path, `Upgrade`, `Connection`, `Sec-WebSocket-Version`,
//! `Sec-WebSocket-Key`, the subprotocol — and [`switching`] writes the `101`. The client's
//! side is `bridgehead_runtime::upgrade`.
//!
//! What this leaves out: what each port reads beyond the WebSocket headers (an agent's
//! identifiers and token, a peer's server id), authentication, and the admission and time
//! bounds around it (`admission.rs`, each port's timeouts).

use http::StatusCode;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::agents::admission::Watched;
use crate::process::http_head::{self, RawHead, MAX_HEADERS};

/// A connection's TLS stream from its accept on: its socket reports to its admission place
/// until the upgrade request is in ([`Watched::release`]).
pub type PreAuthTls = tokio_rustls::server::TlsStream<Watched<TcpStream>>;

/// TLS and the upgrade request's head: all a connection does before it has proved who it is.
/// The caller bounds the time.
pub async fn pre_auth(
    tcp: Watched<TcpStream>,
    acceptor: TlsAcceptor,
) -> std::io::Result<(PreAuthTls, RawHead)> {
    let mut tls = acceptor.accept(tcp).await?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(bridgehead_mux::SESSION_TLS_BUFFER));
    let head = http_head::read(&mut tls).await;
    Ok((tls, head))
}

/// A checked upgrade request: its query and header fields, for what the port reads next.
#[derive(Debug)]
pub struct Upgrade {
    /// The request target's query (after `?`; empty without one).
    pub query: String,
    /// `Sec-WebSocket-Key`, for the answer's accept key.
    pub key: String,
    /// Every header field, name and value as sent (values that are not UTF-8 left out).
    fields: Vec<(String, String)>,
}

/// What a port expects of an upgrade request.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// Who connects, for the reasons: `agents`, `peers`.
    pub who: &'static str,
    /// The path (the target without its query).
    pub path: &'static str,
    /// The subprotocol the port speaks.
    pub subprotocol: &'static str,
}

/// Why an upgrade request is refused: the status and one-line reason it is answered with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BadUpgrade {
    pub status: StatusCode,
    pub reason: String,
}

impl BadUpgrade {
    fn bad(reason: impl Into<String>) -> BadUpgrade {
        BadUpgrade {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
        }
    }
}

/// Checks `head` (a whole request head) against what the port expects.
pub fn request(head: &[u8], expect: Expect) -> Result<Upgrade, BadUpgrade> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(BadUpgrade::bad("incomplete request head")),
        Err(error) => return Err(BadUpgrade::bad(format!("malformed request: {error}"))),
    }
    let Expect {
        who,
        path,
        subprotocol,
    } = expect;
    if request.method != Some("GET") {
        return Err(BadUpgrade {
            status: StatusCode::METHOD_NOT_ALLOWED,
            reason: format!("{who} connect with GET (a WebSocket upgrade)"),
        });
    }
    let target = request.path.unwrap_or("");
    let (asked, query) = target.split_once('?').unwrap_or((target, ""));
    if asked != path {
        return Err(BadUpgrade {
            status: StatusCode::NOT_FOUND,
            reason: format!("{who} connect to {path}"),
        });
    }
    let upgrade = Upgrade {
        query: query.to_owned(),
        key: String::new(),
        fields: request
            .headers
            .iter()
            .filter_map(|h| {
                Some((
                    h.name.to_owned(),
                    std::str::from_utf8(h.value).ok()?.to_owned(),
                ))
            })
            .collect(),
    };
    if !upgrade.has_token("upgrade", "websocket") || !upgrade.has_token("connection", "upgrade") {
        return Err(BadUpgrade::bad("not a WebSocket upgrade"));
    }
    if !upgrade.has_token("sec-websocket-version", "13") {
        return Err(BadUpgrade::bad(
            "unsupported WebSocket version (13 is served)",
        ));
    }
    let key = upgrade
        .values("sec-websocket-key")
        .next()
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .ok_or_else(|| BadUpgrade::bad("no Sec-WebSocket-Key"))?
        .to_owned();
    if !upgrade.has_token("sec-websocket-protocol", subprotocol) {
        return Err(BadUpgrade::bad(format!(
            "unsupported protocol version: this server speaks {subprotocol}"
        )));
    }
    Ok(Upgrade { key, ..upgrade })
}

impl Upgrade {
    /// The values of the header fields named `name` (case-insensitive).
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.fields
            .iter()
            .filter(move |(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Whether a comma-separated list in the fields named `name` holds `token`
    /// (case-insensitive, as RFC 6455 compares these).
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.values(name)
            .flat_map(|value| value.split(','))
            .any(|item| item.trim().eq_ignore_ascii_case(token))
    }
}

/// The `101` for `key`, naming `subprotocol`, then `extra_headers` (each ending in CRLF).
pub fn switching(key: &str, subprotocol: &str, extra_headers: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\nsec-websocket-protocol: {subprotocol}\r\n{extra_headers}\r\n",
        derive_accept_key(key.as_bytes()),
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEERS: Expect = Expect {
        who: "peers",
        path: "/peer",
        subprotocol: "bridgehead-peer.v1",
    };

    fn head(request_line: &str, headers: &[&str]) -> Vec<u8> {
        let mut text = format!("{request_line}\r\n");
        for header in headers {
            text.push_str(header);
            text.push_str("\r\n");
        }
        text.push_str("\r\n");
        text.into_bytes()
    }

    const GOOD: [&str; 5] = [
        "Upgrade: WebSocket",
        "Connection: keep-alive, Upgrade",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Protocol: bridgehead.v1, bridgehead-peer.v1",
    ];

    /// Every header RFC 6455 asks of a client is checked, whichever port reads it: the peer
    /// port did not check `Upgrade`, `Connection` or the version (issue 49, finding 7).
    #[test]
    fn each_websocket_header_is_required() {
        let upgrade = request(&head("GET /peer?x=1 HTTP/1.1", &GOOD), PEERS).unwrap();
        assert_eq!(upgrade.key, "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(upgrade.query, "x=1");
        for (missing, says) in [
            (0, "not a WebSocket upgrade"),
            (1, "not a WebSocket upgrade"),
            (2, "unsupported WebSocket version"),
            (3, "no Sec-WebSocket-Key"),
            (4, "this server speaks bridgehead-peer.v1"),
        ] {
            let mut headers = GOOD.to_vec();
            headers.remove(missing);
            let refused = request(&head("GET /peer HTTP/1.1", &headers), PEERS).unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{missing}");
            assert!(refused.reason.contains(says), "{missing}: {refused}");
        }
        let mut old = GOOD.to_vec();
        old[2] = "Sec-WebSocket-Version: 8";
        assert!(request(&head("GET /peer HTTP/1.1", &old), PEERS).is_err());
    }

    #[test]
    fn method_and_path_are_the_ports() {
        let refused = request(&head("POST /peer HTTP/1.1", &GOOD), PEERS).unwrap_err();
        assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            refused.reason,
            "peers connect with GET (a WebSocket upgrade)"
        );
        let refused = request(&head("GET /connect HTTP/1.1", &GOOD), PEERS).unwrap_err();
        assert_eq!(refused.status, StatusCode::NOT_FOUND);
        assert_eq!(refused.reason, "peers connect to /peer");
        let refused = request(b"GET /peer HTTP/1.1\r\nHost", PEERS).unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_answer_carries_the_accept_key_and_the_subprotocol() {
        let answer = String::from_utf8(switching(
            "dGhlIHNhbXBsZSBub25jZQ==",
            "bridgehead-peer.v1",
            "bridgehead-server-id: s1\r\n",
        ))
        .unwrap();
        // RFC 6455 §1.3's example key and answer.
        assert!(answer.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(answer.ends_with(
            "sec-websocket-protocol: bridgehead-peer.v1\r\nbridgehead-server-id: s1\r\n\r\n"
        ));
    }
}
