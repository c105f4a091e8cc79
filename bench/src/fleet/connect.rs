//! One simulated agent's way to a session, as the agent takes it (agent/src/server_connection.rs,
//! written again here from docs/protocol.md §1: the agent's own is private to its crate): TCP,
//! TLS with the agent's client certificate, the WebSocket upgrade to `/connect?<identifiers>`
//! with the subprotocol, when given `Authorization: Bearer`, and the servers the agent holds
//! already (`bridgehead-connected-servers`, §1.1). Every step has the agent's timeout, TLS's
//! counted from the server's first answer as the agent counts it (`bridgehead_agent::first_answer`). A
//! failure says what kind it was, so a storm's failed attempts can be counted by kind, and
//! carries the server's retry hint when it gave one; a 409 (a server held already) is not a
//! failure. With a [`Lateness`], the agent answers each step of the handshake late
//! (`bridgehead_e2e::late`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bridgehead_mux::{WebSocket, WsRole};
use bridgehead_proto::SUBPROTOCOL;
use bridgehead_runtime::http_head::{self, RawHead, MAX_HEADERS};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use bridgehead_agent::first_answer::{self, Heard, AGENT_FIRST_ANSWER};
use bridgehead_e2e::late::{Late, Lateness};

/// The agent's bounds: the TCP connect, the TLS handshake once the server answered, the
/// upgrade, each.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's socket: late during the handshake when the fleet's agents are slow.
pub type AgentTcp = Late<Heard<TcpStream>>;
/// The WebSocket of an upgraded session.
pub type AgentWebSocket = WebSocket<TlsStream<AgentTcp>>;

/// An upgraded session and who answered (docs/protocol.md §1.1).
#[derive(Debug)]
pub struct Connected {
    pub ws: AgentWebSocket,
    /// `bridgehead-server-id`.
    pub server_id: String,
    /// `bridgehead-server-count`, when given and in range.
    pub server_count: Option<usize>,
}

/// Most servers an agent counts (the protocol's range of `bridgehead-server-count`).
const MAX_SERVER_COUNT: usize = 1024;

/// Where and how the simulated agents connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    /// How late the agents answer each step of the handshake (none: at once).
    pub lateness: Option<Lateness>,
}

/// Why an attempt did not end in a session.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Nothing listens (the server is down).
    Refused,
    /// The server closed or reset the connection at this step, before the upgrade was
    /// answered (a handshake cut, or a connection queued on a listener that closed).
    Reset(Step),
    /// A step took longer than [`STEP_TIMEOUT`].
    TimedOut(Step),
    /// The TLS handshake failed otherwise (certificate, protocol).
    Tls(String),
    /// The upgrade was answered with this status; `retry_after` is its `Retry-After`, if any.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// A 409: this server (its id) holds a session with the agent already. Not a failure.
    Duplicate(String),
    /// Anything else (a malformed answer, a wrong accept key or subprotocol, a local error).
    Other(String),
}

/// A step of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Tcp,
    Tls,
    Upgrade,
}

impl Failure {
    /// The kind counted: `refused`, `reset:tcp|tls|upgrade`, `timeout:tcp|tls|upgrade`, `tls`,
    /// `http:NNN`, `duplicate`, `other`.
    pub fn kind(&self) -> String {
        match self {
            Failure::Refused => "refused".to_owned(),
            Failure::Reset(Step::Tcp) => "reset:tcp".to_owned(),
            Failure::Reset(Step::Tls) => "reset:tls".to_owned(),
            Failure::Reset(Step::Upgrade) => "reset:upgrade".to_owned(),
            Failure::TimedOut(Step::Tcp) => "timeout:tcp".to_owned(),
            Failure::TimedOut(Step::Tls) => "timeout:tls".to_owned(),
            Failure::TimedOut(Step::Upgrade) => "timeout:upgrade".to_owned(),
            Failure::Tls(_) => "tls".to_owned(),
            Failure::Status { status, .. } => format!("http:{status}"),
            Failure::Duplicate(_) => "duplicate".to_owned(),
            Failure::Other(_) => "other".to_owned(),
        }
    }

    /// The server's hint of when to come back: `Retry-After` on a 503 or 429.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Status {
                status: 503 | 429,
                retry_after,
            } => *retry_after,
            _ => None,
        }
    }

    /// An I/O error of `step`, by what it says about the server.
    fn io(step: Step, error: &io::Error) -> Failure {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => Failure::Refused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Failure::Reset(step),
            io::ErrorKind::TimedOut => Failure::TimedOut(step),
            _ if step == Step::Tls => Failure::Tls(error.to_string()),
            _ => Failure::Other(error.to_string()),
        }
    }
}

/// Connects, shakes hands and upgrades: the session's WebSocket and its server, or why not.
/// `held` are the ids of the servers the agent holds a live session with.
pub async fn connect(
    endpoint: &Endpoint,
    query: &str,
    token: Option<&str>,
    held: &[String],
) -> Result<Connected, Failure> {
    let tcp = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(endpoint.addr))
        .await
        .map_err(|_| Failure::TimedOut(Step::Tcp))?
        .map_err(|error| Failure::io(Step::Tcp, &error))?;
    // Small frames (pings, window grants) must not wait for Nagle, as in the agent.
    let _ = tcp.set_nodelay(true);
    let (tcp, answered) = Heard::new(tcp);
    let tcp = Late::new(tcp, endpoint.lateness);
    let name = ServerName::IpAddress(endpoint.addr.ip().into());
    let handshake = TlsConnector::from(endpoint.tls.clone()).connect(name, tcp);
    let mut tls = first_answer::within(&answered, AGENT_FIRST_ANSWER, STEP_TIMEOUT, handshake)
        .await
        .map_err(|_| Failure::TimedOut(Step::Tls))?
        .map_err(|error| Failure::io(Step::Tls, &error))?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(bridgehead_mux::SESSION_TLS_BUFFER));
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
    let request = request(endpoint.addr, query, token, held, &key);
    // The upgrade request is a step of its own, late too.
    tls.get_mut().0.arm();
    let answer = tokio::time::timeout(STEP_TIMEOUT, upgrade(&mut tls, &request, &key))
        .await
        .map_err(|_| Failure::TimedOut(Step::Upgrade))??;
    tls.get_mut().0.release();
    Ok(Connected {
        ws: WebSocket::new(tls, WsRole::Client, answer.early),
        server_id: answer.server_id,
        server_count: answer.server_count,
    })
}

/// The upgrade request's bytes (docs/protocol.md §1).
fn request(
    addr: SocketAddr,
    query: &str,
    token: Option<&str>,
    held: &[String],
    key: &str,
) -> Vec<u8> {
    let mut head = format!(
        "GET /connect?{query} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if !held.is_empty() {
        head.push_str(&format!(
            "bridgehead-connected-servers: {}\r\n",
            held.join(",")
        ));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// A `101` answer.
struct Upgraded {
    /// The bytes that followed the head (the server's first frames).
    early: bytes::Bytes,
    server_id: String,
    server_count: Option<usize>,
}

/// Sends the upgrade request and checks the answer: `101`, the accept key, the subprotocol,
/// the server's id.
async fn upgrade(
    tls: &mut TlsStream<AgentTcp>,
    request: &[u8],
    key: &str,
) -> Result<Upgraded, Failure> {
    tls.write_all(request)
        .await
        .map_err(|error| Failure::io(Step::Upgrade, &error))?;
    tls.flush()
        .await
        .map_err(|error| Failure::io(Step::Upgrade, &error))?;
    let (buf, end) = match http_head::read(tls).await {
        RawHead::Complete { buf, end } => (buf, end),
        RawHead::Closed => return Err(Failure::Reset(Step::Upgrade)),
        RawHead::TooLarge => return Err(Failure::Other("answer head too large".to_owned())),
    };
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    match response.parse(&buf[..end]) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(Failure::Other("malformed answer".to_owned())),
    }
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_owned())
    };
    let status = response.code.unwrap_or(0);
    if let (409, Some(id)) = (status, header("bridgehead-server-id")) {
        return Err(Failure::Duplicate(id));
    }
    if status != 101 {
        return Err(Failure::Status {
            status,
            retry_after: header("retry-after").as_deref().and_then(retry_after),
        });
    }
    if header("sec-websocket-accept").as_deref() != Some(&derive_accept_key(key.as_bytes())) {
        return Err(Failure::Other("wrong Sec-WebSocket-Accept".to_owned()));
    }
    if header("sec-websocket-protocol").as_deref() != Some(SUBPROTOCOL) {
        return Err(Failure::Other("no bridgehead.v1 subprotocol".to_owned()));
    }
    let server_id = header("bridgehead-server-id")
        .filter(|id| !id.is_empty())
        .ok_or_else(|| Failure::Other("no bridgehead-server-id".to_owned()))?;
    let server_count = header("bridgehead-server-count")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| (1..=MAX_SERVER_COUNT).contains(n));
    Ok(Upgraded {
        early: buf.freeze().slice(end..),
        server_id,
        server_count,
    })
}

/// `Retry-After` as delay-seconds (RFC 9110 §10.2.3; a fraction is taken too), up to an hour.
/// A date is not taken: a server asking agents to come back at a wall-clock time would need
/// their clocks.
fn retry_after(value: &str) -> Option<Duration> {
    let seconds: f64 = value.trim().parse().ok()?;
    (0.0..=3600.0)
        .contains(&seconds)
        .then(|| Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_kind_and_only_503_and_429_carry_a_hint() {
        let hint = Some(Duration::from_secs(2));
        let busy = Failure::Status {
            status: 503,
            retry_after: hint,
        };
        assert_eq!(busy.kind(), "http:503");
        assert_eq!(busy.retry_after(), hint);
        let forbidden = Failure::Status {
            status: 403,
            retry_after: hint,
        };
        assert_eq!(forbidden.retry_after(), None);
        assert_eq!(Failure::TimedOut(Step::Tls).kind(), "timeout:tls");
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(Failure::io(Step::Tcp, &refused), Failure::Refused);
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(Failure::io(Step::Tls, &eof), Failure::Reset(Step::Tls));
        assert_eq!(Failure::Reset(Step::Tls).kind(), "reset:tls");
    }

    #[test]
    fn retry_after_takes_seconds_and_refuses_dates_and_nonsense() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after("Wed, 21 Oct 2026 07:28:00 GMT"), None);
        assert_eq!(retry_after("-1"), None);
        assert_eq!(retry_after("NaN"), None);
    }
}
