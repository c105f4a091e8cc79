//! Reaching a server: TCP, TLS, then the WebSocket upgrade to `/connect?<identifiers>`, which
//! names the servers the agent already holds and is answered with the server's id and count.

use rustls_pki_types::ServerName;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bridgehead_mux::{WebSocket, WsRole};
use bridgehead_proto::servers::{
    check_server_id, parse_server_count, CONNECTED_SERVERS_HEADER, SERVER_COUNT_HEADER,
    SERVER_ID_HEADER,
};
use bridgehead_proto::SUBPROTOCOL;
use http::header::{HeaderValue, AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use http::{HeaderMap, StatusCode};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as RequestError;

use crate::config::Config;
use crate::first_answer::{self, Heard};
use bridgehead_runtime::timeouts::{
    AGENT_CONNECT, AGENT_FIRST_ANSWER, AGENT_TLS_HANDSHAKE, AGENT_UPGRADE_ANSWER,
};
use bridgehead_runtime::upgrade::{upgrade, Answer, UpgradeError};

/// Longest part of a refusal's body that makes it into the logs.
const MAX_LOGGED_BODY: usize = 512;

/// The WebSocket to the server.
pub(crate) type ServerWebSocket = WebSocket<TlsStream<Heard<TcpStream>>>;

/// A connected, upgraded session transport.
#[derive(Debug)]
pub(crate) struct Connected {
    pub(crate) ws: ServerWebSocket,
    /// The server's address as connected.
    pub(crate) peer: SocketAddr,
    /// The server's id (its address, for a server that does not say).
    pub(crate) server_id: String,
    /// How many servers the server says there are, if it says.
    pub(crate) server_count: Option<u32>,
}

/// Why connecting to the server failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// Resolving or connecting failed.
    #[error("connecting to {server}: {source}")]
    Tcp { server: String, source: io::Error },
    /// A step did not finish in time.
    #[error("{step} with {server} timed out after {timeout:?}")]
    TimedOut {
        step: &'static str,
        server: String,
        timeout: Duration,
    },
    /// The CA or client certificate files did not load.
    #[error("{0:#}")]
    TlsFiles(anyhow::Error),
    /// The TLS handshake failed (certificate, name, protocol).
    #[error("TLS handshake with {server}: {source}")]
    Tls { server: String, source: io::Error },
    /// The token file did not read or holds an unusable token.
    #[error("service account token: {0:#}")]
    Token(anyhow::Error),
    /// The server answered the upgrade with an HTTP error, and perhaps when to come back.
    #[error("server refused the connection with {status}: {body}")]
    Refused {
        status: StatusCode,
        body: String,
        retry_after: Option<Duration>,
    },
    /// The address led to a server the agent holds a session with already.
    #[error("reached server {0} again, which this agent holds a session with")]
    Duplicate(String),
    /// The upgrade request could not be made (the server's address as a URI).
    #[error("WebSocket upgrade request for {server}: {source}")]
    Request {
        server: String,
        source: RequestError,
    },
    /// The upgrade failed otherwise.
    #[error("WebSocket upgrade with {server}: {source}")]
    WebSocket {
        server: String,
        source: UpgradeError,
    },
    /// The server picked another protocol version.
    #[error("server answered subprotocol {0:?}, expected {SUBPROTOCOL:?}")]
    Subprotocol(Option<String>),
}

/// Connects to the server at `address` (or, when `None`, the name and port configured),
/// verifies its certificate for `name` (or the configured server name), and upgrades, telling
/// it the ids of the servers in `held`; every step has a timeout.
pub(crate) async fn connect_to_server(
    config: &Config,
    held: &[String],
    address: Option<SocketAddr>,
    name: Option<ServerName<'static>>,
) -> Result<Connected, ConnectError> {
    let server = address.map_or_else(|| config.server_authority(), |address| address.to_string());
    let tls = crate::tls::current_client_config(config).map_err(ConnectError::TlsFiles)?;
    let tcp_error = |source| ConnectError::Tcp {
        server: server.clone(),
        source,
    };
    let connect = async {
        match address {
            Some(address) => TcpStream::connect(address).await,
            None => TcpStream::connect((config.servers.host.as_str(), config.servers.port)).await,
        }
    };
    let tcp = within(AGENT_CONNECT, "TCP connect", &server, connect, tcp_error).await?;
    let peer = tcp.peer_addr().map_err(tcp_error)?;
    // Small frames (pings, window grants) must not wait for Nagle.
    let _ = tcp.set_nodelay(true);

    let name = name.unwrap_or_else(|| config.tls.server_name.clone());
    let (tcp, answered) = Heard::new(tcp);
    let handshake = TlsConnector::from(tls).connect(name, tcp);
    let handshake = first_answer::within(
        &answered,
        AGENT_FIRST_ANSWER,
        AGENT_TLS_HANDSHAKE,
        handshake,
    );
    let mut tls = handshake
        .await
        .map_err(|timeout| ConnectError::TimedOut {
            step: "TLS handshake",
            server: server.clone(),
            timeout,
        })?
        .map_err(|source| ConnectError::Tls {
            server: server.clone(),
            source,
        })?;

    let request = upgrade_request(config, &server, held)?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(bridgehead_mux::SESSION_TLS_BUFFER));
    let ws_error = |source| ConnectError::WebSocket {
        server: server.clone(),
        source,
    };
    let answer = upgrade(&mut tls, &request);
    let answer = within(
        AGENT_UPGRADE_ANSWER,
        "WebSocket upgrade",
        &server,
        answer,
        ws_error,
    )
    .await?;
    let (headers, early) = match answer {
        Answer::Upgraded { headers, early } => (headers, early),
        Answer::Refused {
            status,
            headers,
            body,
        } => return Err(refused(status, &headers, &body, held)),
    };
    let subprotocol = headers
        .get(SEC_WEBSOCKET_PROTOCOL)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    if subprotocol.as_deref() != Some(SUBPROTOCOL) {
        return Err(ConnectError::Subprotocol(subprotocol));
    }
    let ws = WebSocket::new(tls, WsRole::Client, early);
    let server_id = header(&headers, SERVER_ID_HEADER)
        .filter(|id| check_server_id(id).is_ok())
        .unwrap_or_else(|| peer.to_string());
    let server_count = header(&headers, SERVER_COUNT_HEADER).and_then(|n| parse_server_count(&n));
    Ok(Connected {
        ws,
        peer,
        server_id,
        server_count,
    })
}

/// One step of reaching `server`, bounded by `timeout`; its own failure mapped by `error`.
async fn within<T, E>(
    timeout: Duration,
    step: &'static str,
    server: &str,
    future: impl std::future::Future<Output = Result<T, E>>,
    error: impl FnOnce(E) -> ConnectError,
) -> Result<T, ConnectError> {
    tokio::time::timeout(timeout, future)
        .await
        .map_err(|_| ConnectError::TimedOut {
            step,
            server: server.to_owned(),
            timeout,
        })?
        .map_err(error)
}

/// A refused upgrade: a `409` from a server the agent holds already is a duplicate; any
/// other answer a refusal, with the `Retry-After` the server asked for.
fn refused(status: StatusCode, headers: &HeaderMap, body: &[u8], held: &[String]) -> ConnectError {
    match header(headers, SERVER_ID_HEADER) {
        Some(id) if status == StatusCode::CONFLICT && held.contains(&id) => {
            ConnectError::Duplicate(id)
        }
        _ => ConnectError::Refused {
            status,
            body: body_text(Some(body)),
            retry_after: header(headers, "retry-after").and_then(|s| retry_after(&s)),
        },
    }
}

/// Longest wait a server's `Retry-After` can ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// `Retry-After` in seconds (the HTTP-date form is not sent by Bridgehead servers), at most
/// [`MAX_RETRY_AFTER`].
fn retry_after(value: &str) -> Option<Duration> {
    let seconds: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The first value of header `name`, if it is text.
fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_owned())
}

/// `GET wss://<server>/connect?id=…&host=…` with the subprotocol and, if configured, the token.
fn upgrade_request(
    config: &Config,
    server: &str,
    held: &[String],
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, ConnectError> {
    let uri = format!("wss://{server}/connect?{}", config.identifiers.to_query());
    let mut request = uri
        .into_client_request()
        .map_err(|source| ConnectError::Request {
            server: server.to_owned(),
            source,
        })?;
    let headers = request.headers_mut();
    headers.insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    // Ids are checked when received (header-safe), so the value always forms.
    if let Ok(value) = HeaderValue::from_str(&held.join(",")) {
        if !held.is_empty() {
            headers.insert(CONNECTED_SERVERS_HEADER, value);
        }
    }
    if let Some(path) = &config.tls.token_path {
        headers.insert(
            AUTHORIZATION,
            crate::token::bearer(path).map_err(ConnectError::Token)?,
        );
    }
    Ok(request)
}

/// The body of a refusal as one printable line, shortened.
fn body_text(body: Option<&[u8]>) -> String {
    let text = String::from_utf8_lossy(body.unwrap_or_default());
    let text: String = text
        .trim()
        .chars()
        .take(MAX_LOGGED_BODY)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.is_empty() {
        "(no reason given)".to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_is_bounded() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(retry_after("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after("-1"), None);
    }
}
