//! Clients: one that speaks exactly as kube-apiserver's egress dialer does — blocking here,
//! async in [`tunnel`], the bytes in [`kube`] and the TLS settings in [`tls`] shared by both —
//! curl, and a minimal HTTP GET for health endpoints.

pub mod kube;
pub mod tls;
pub mod tunnel;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::Pki;

/// Every blocking client read or write gives up after this long, so no test can hang.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A blocking byte stream to the frontend: mTLS over TCP, or a Unix socket.
pub trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// What the frontend answered to a CONNECT.
#[derive(Debug)]
pub struct ConnectReply {
    /// The status code.
    pub status: u16,
    /// The whole response head, as received.
    pub head: String,
    /// Bytes that arrived in the same reads as the head, after it (kube-apiserver fails when
    /// there are any on a 200).
    pub extra: Vec<u8>,
}

/// TLS client config towards the frontend: `pki`'s frontend CA and, unless `cert` is `None`, a
/// client certificate (`("client.crt", "client.key")`); kube-apiserver's settings
/// ([`tls::config`]).
pub fn tls_config(pki: &Pki, cert: Option<(&str, &str)>) -> anyhow::Result<Arc<ClientConfig>> {
    config_trusting(pki, "frontend-ca.crt", cert)
}

/// TLS client config towards the agent endpoint: `pki`'s cluster CA and, unless `cert` is
/// `None`, a client certificate (`("agent.crt", "agent.key")`).
pub fn agent_tls_config(
    pki: &Pki,
    cert: Option<(&str, &str)>,
) -> anyhow::Result<Arc<ClientConfig>> {
    config_trusting(pki, "cluster-ca.crt", cert)
}

fn config_trusting(
    pki: &Pki,
    ca: &str,
    cert: Option<(&str, &str)>,
) -> anyhow::Result<Arc<ClientConfig>> {
    let (crt, key) = match cert {
        Some((crt, key)) => (Some(pki.path(crt)), Some(pki.path(key))),
        None => (None, None),
    };
    tls::config(&pki.path(ca), crt.as_deref().zip(key.as_deref()))
}

/// Opens an mTLS connection to the frontend as kube-apiserver does (fresh connection, no
/// session resumption), with `client.crt`.
pub fn tls_connect(pki: &Pki, frontend: SocketAddr) -> anyhow::Result<Box<dyn Conn>> {
    tls_connect_with(
        tls_config(pki, Some(("client.crt", "client.key")))?,
        frontend,
    )
}

/// Like [`tls_connect`] with an explicit TLS config.
pub fn tls_connect_with(
    config: Arc<ClientConfig>,
    frontend: SocketAddr,
) -> anyhow::Result<Box<dyn Conn>> {
    Ok(Box::new(tls_stream(config, frontend)?))
}

/// An mTLS connection to the frontend as its concrete type, for what [`Conn`] cannot do
/// (half-close with [`tls_shutdown_write`]).
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// Like [`tls_connect_with`], returning the concrete stream.
pub fn tls_stream(config: Arc<ClientConfig>, frontend: SocketAddr) -> anyhow::Result<TlsStream> {
    tls_stream_named(
        config,
        frontend,
        ServerName::IpAddress(frontend.ip().into()),
    )
}

/// Like [`tls_stream`], verifying the server certificate for `name` instead of the address.
pub fn tls_stream_named(
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    name: ServerName<'static>,
) -> anyhow::Result<TlsStream> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    tcp.set_write_timeout(Some(IO_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let conn = ClientConnection::new(config, name)?;
    let mut stream = StreamOwned::new(conn, tcp);
    // Drive the handshake now so certificate errors surface here.
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// Ends the client's direction of a TLS connection and keeps reading possible: close_notify,
/// flushed, then a TCP half-close (what Go's `CloseWrite` on a `tls.Conn` does).
pub fn tls_shutdown_write(stream: &mut TlsStream) -> std::io::Result<()> {
    stream.conn.send_close_notify();
    stream.flush()?;
    while stream.conn.wants_write() {
        stream.conn.write_tls(&mut stream.sock)?;
    }
    stream.sock.shutdown(std::net::Shutdown::Write)
}

/// Opens the Unix-socket frontend.
pub fn uds_connect(path: &Path) -> anyhow::Result<Box<dyn Conn>> {
    Ok(Box::new(uds_stream(path)?))
}

/// Like [`uds_connect`], returning the concrete stream (which can half-close).
pub fn uds_stream(path: &Path) -> anyhow::Result<std::os::unix::net::UnixStream> {
    let sock = std::os::unix::net::UnixStream::connect(path)?;
    sock.set_read_timeout(Some(IO_TIMEOUT))?;
    sock.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(sock)
}

/// Writes exactly what kube-apiserver writes — `CONNECT <target> HTTP/1.1\r\nHost:
/// 127.0.0.1\r\n\r\n` — and reads the response head the way Go's `http.ReadResponse` over a
/// `bufio.Reader` does: whatever the reads return past the head is reported in `extra`.
pub fn kube_connect(conn: &mut dyn Conn, target: &str) -> anyhow::Result<ConnectReply> {
    raw_request(conn, kube::connect_head(target).as_bytes())
}

/// A CONNECT to a who-am-i target ([`crate::netns::TestNet::who_am_i`]).
pub struct WhoAmI {
    pub status: u16,
    /// On 200 the target's answer (its name, trimmed), otherwise the response body.
    pub text: String,
    /// Still open (the client's direction), so the tunnel counts as open on its agent.
    pub conn: Box<dyn Conn>,
}

/// Opens a tunnel through the mTLS frontend at `frontend` to a who-am-i `target` and reads its
/// answer (up to the target's EOF on a 200).
pub fn who_am_i(pki: &Pki, frontend: SocketAddr, target: &str) -> anyhow::Result<WhoAmI> {
    who_am_i_with(
        tls_config(pki, Some(("client.crt", "client.key")))?,
        frontend,
        target,
    )
}

/// [`who_am_i`] with an explicit TLS config (for a thread that has no [`Pki`]).
pub fn who_am_i_with(
    config: Arc<ClientConfig>,
    frontend: SocketAddr,
    target: &str,
) -> anyhow::Result<WhoAmI> {
    let mut conn = tls_connect_with(config, frontend)?;
    let reply = kube_connect(conn.as_mut(), target)?;
    let mut bytes = reply.extra;
    if reply.status == 200 {
        // The target answers its name and ends its direction: read up to that EOF.
        conn.read_to_end(&mut bytes)
            .with_context(|| format!("reading the answer through {target}"))?;
    } else {
        // The frontend closes after an error reply (perhaps abruptly): keep what arrived.
        let _ = conn.read_to_end(&mut bytes);
    }
    Ok(WhoAmI {
        status: reply.status,
        text: String::from_utf8_lossy(&bytes).trim().to_owned(),
        conn,
    })
}

impl std::fmt::Debug for WhoAmI {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhoAmI")
            .field("status", &self.status)
            .field("text", &self.text)
            .finish_non_exhaustive()
    }
}

/// Sends `request` verbatim and reads the response head.
pub fn raw_request(conn: &mut dyn Conn, request: &[u8]) -> anyhow::Result<ConnectReply> {
    conn.write_all(request)?;
    conn.flush()?;
    read_head(conn)
}

fn read_head(conn: &mut dyn Conn) -> anyhow::Result<ConnectReply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = kube::head_len(&buf) {
            break end;
        }
        let n = conn
            .read(&mut chunk)
            .context("reading the CONNECT response")?;
        if n == 0 {
            bail!(
                "connection closed before the response head ended: {:?}",
                String::from_utf8_lossy(&buf)
            );
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = kube::status(&head)?;
    Ok(ConnectReply {
        status,
        head,
        extra: buf[end..].to_vec(),
    })
}

/// A complete non-200 answer: the head, then the body by its `content-length`.
#[derive(Debug)]
pub struct ErrorReply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl ErrorReply {
    /// The value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        kube::header(&self.head, name)
    }
}

/// Sends `request` and reads the whole answer, body included (by `content-length`, else to
/// EOF): for error replies.
pub fn request_reply(conn: &mut dyn Conn, request: &[u8]) -> anyhow::Result<ErrorReply> {
    let reply = raw_request(conn, request)?;
    request_body(conn, reply)
}

/// The rest of `reply`: its body, by `content-length`, else to EOF.
fn request_body(conn: &mut dyn Conn, reply: ConnectReply) -> anyhow::Result<ErrorReply> {
    let mut body = reply.extra;
    match kube::header(&reply.head, "content-length") {
        Some(length) => {
            let length: usize = length.parse().context("bad content-length")?;
            if body.len() < length {
                let mut rest = vec![0u8; length - body.len()];
                conn.read_exact(&mut rest).context("reading the body")?;
                body.extend_from_slice(&rest);
            }
        }
        None => {
            let _ = conn.read_to_end(&mut body);
        }
    }
    Ok(ErrorReply {
        status: reply.status,
        head: reply.head,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// An agent's WebSocket upgrade to the agent endpoint at `addr` (its certificate checked for
/// `127.0.0.1`), with the client certificate in `config`, `bearer` as `Authorization: Bearer`
/// if given, and `query` as identifiers; the answer's status and reason (101 on success, the
/// connection then closed by the caller's drop).
pub fn agent_upgrade(
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    bearer: Option<&str>,
    query: &str,
) -> anyhow::Result<ErrorReply> {
    let authorization = bearer.map_or(String::new(), |token| {
        format!("authorization: Bearer {token}\r\n")
    });
    websocket_upgrade(
        config,
        addr,
        &format!("/connect?{query}"),
        bridgehead_proto::SUBPROTOCOL,
        &authorization,
    )
}

/// A WebSocket upgrade to `target` on the TLS port at `addr` (its certificate checked for
/// `127.0.0.1`) with the client certificate in `config`, offering `subprotocol`, with
/// `extra_headers` (each ending in CRLF); the answer's status and reason (101 on success,
/// the connection then closed by the caller's drop).
pub fn websocket_upgrade(
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    target: &str,
    subprotocol: &str,
    extra_headers: &str,
) -> anyhow::Result<ErrorReply> {
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut tls = tls_stream_named(config, addr, name)?;
    let request = format!(
        "GET {target} HTTP/1.1\r\nhost: bridgehead\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-protocol: {subprotocol}\r\n{extra_headers}\r\n"
    );
    let reply = raw_request(&mut tls, request.as_bytes())?;
    if reply.status == 101 {
        return Ok(ErrorReply {
            status: 101,
            head: reply.head,
            body: String::new(),
        });
    }
    request_body(&mut tls, reply)
}

/// Reads until EOF (bounded by [`IO_TIMEOUT`] per read).
pub fn read_to_end(conn: &mut dyn Conn) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    conn.read_to_end(&mut all)?;
    Ok(all)
}

/// Runs `curl -p` through the mTLS frontend to `url`; returns curl's output.
pub fn curl(pki: &Pki, frontend: &str, url: &str, extra: &[&str]) -> anyhow::Result<Output> {
    let mut command = Command::new("curl");
    command.args([
        "-sS",
        "--max-time",
        "20",
        "-p",
        "-x",
        &format!("https://{frontend}"),
    ]);
    command
        .arg("--proxy-cacert")
        .arg(pki.path("frontend-ca.crt"));
    command.arg("--proxy-cert").arg(pki.path("client.crt"));
    command.arg("--proxy-key").arg(pki.path("client.key"));
    command.args(extra).arg(url);
    Ok(command.output()?)
}

/// A plain HTTP/1.1 GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "GET", path, "")
}

/// One HTTP/1.1 request with `body` (a length header when not empty): (status, body).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    let length = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{length}Connection: close\r\n\r\n{body}"
    )?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no response head")?;
    Ok((kube::status(head)?, body.to_owned()))
}

/// The value of `series` (its name and labels exactly as written) on a Prometheus page.
pub fn metric_in(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series)
                .then(|| value.trim().parse().ok())
                .flatten()
        })
}

/// An mTLS tunnel to `target` through the frontend at `frontend`, with `pki`'s client
/// certificate; panics unless the answer is 200.
pub fn open_tunnel(pki: &Pki, frontend: SocketAddr, target: &str) -> Box<dyn Conn> {
    let mut conn = tls_connect(pki, frontend).unwrap();
    let reply = kube_connect(conn.as_mut(), target).unwrap();
    assert_eq!(reply.status, 200, "CONNECT {target}: {}", reply.head);
    conn
}

/// Writes `message` and reads it back from an echo target; panics on any difference.
pub fn echo_round_trip(conn: &mut dyn Conn, message: &[u8]) {
    conn.write_all(message).expect("writing to the tunnel");
    conn.flush().expect("flushing the tunnel");
    let mut back = vec![0u8; message.len()];
    conn.read_exact(&mut back).expect("reading the echo");
    assert_eq!(back, message, "the echo differs");
}
