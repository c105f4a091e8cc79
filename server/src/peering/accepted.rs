//! The peer port: servers that forward to this one connect here (mutual TLS, the peer CA),
//! upgrade to a WebSocket at [`PEER_PATH`] naming themselves, and run a session in which this
//! server takes the agent's role. Each stream they open is a tunnel for one of this server's
//! own agents, routed and dialed as a CONNECT is, then pumped stream to stream under both
//! streams' flow control; or the view stream, on which this server keeps them told of its
//! agents ([`super::view`]).

use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::{DialRequest, Mux, MuxStream, Serve, StreamEnd, WebSocket, WsRole};
use bridgehead_proto::servers::{check_server_id, SERVER_ID_HEADER};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::{ErrorCode, SUBPROTOCOL};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, Instrument};

use super::view::{self, Sent};
use crate::admission::ClientKey;
use crate::context::Context;
use crate::dial;
use crate::http_head::{self, RawHead, MAX_HEADERS};
use crate::refusal::Refusal;
use crate::router::Target;

/// Path of a peer's upgrade request.
pub const PEER_PATH: &str = "/peer";

/// After a change of this server's agents, how long the view waits for more before it tells
/// the peers: a fleet reconnecting at once goes out in a few batches, not a line per change
/// and a scan of every agent per line.
const VIEW_BATCH: Duration = Duration::from_millis(20);

/// Longest a peer may take for its TLS handshake and upgrade: servers on the control plane
/// answer at once, so this stays short (the agent endpoint's backstop waits for slow agents).
const PEER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts peers until `stop`; each session runs until the peer leaves or `end` fires.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<crate::tls_config::ReloadingConfig>,
    ctx: Arc<Context>,
    stop: CancellationToken,
    end: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let (tcp, address) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    bridgehead_runtime::accept::failed("peer port", &error, &ctx.refusal_log).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let acceptor = TlsAcceptor::from(tls.current());
        let span = tracing::info_span!("peer", %address, server = tracing::field::Empty);
        let session = session(tcp, acceptor, ctx.clone(), stop.clone(), end.clone());
        tracker.spawn(session.instrument(span));
    }
}

/// One peer's connection: TLS, the upgrade, then the session.
async fn session(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    ctx: Arc<Context>,
    stop: CancellationToken,
    end: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let timeout = PEER_HANDSHAKE_TIMEOUT;
    let opened = tokio::time::timeout(timeout, upgrade(tcp, acceptor, &ctx)).await;
    let (ws, peer) = match opened {
        Ok(Ok(upgraded)) => upgraded,
        Ok(Err(error)) => return debug!(%error, "peer refused"),
        Err(_) => return debug!(?timeout, "peer's handshake timed out"),
    };
    tracing::Span::current().record("server", tracing::field::display(&peer));
    info!("peer connected: it may forward tunnels to this server's agents");
    let mux = Mux::new(SessionConfig {
        budget: ctx.memory.budget.clone(),
        max_window: ctx.memory.max_window,
        max_streams: usize::MAX,
        ..SessionConfig::new(Role::Agent)
    });
    let streams = TaskTracker::new();
    let beside = async {
        let accepting = accept_loop(&mux, &ctx, &peer, &streams);
        // A draining server tells its peers, which forward nothing new here.
        let drain = async {
            stop.cancelled().await;
            mux.drain();
        };
        tokio::join!(accepting, drain);
    };
    let serve = Serve::new(ctx.keepalive, end).beside(beside);
    let result = mux.serve(ws, serve).await;
    streams.close();
    match result {
        Ok(()) => {
            let reason = mux.closed().await;
            info!(%reason, "peer disconnected");
        }
        Err(error) => info!(%error, "peer session ended"),
    }
}

/// TLS (the peer's certificate chains to the peer CA, or the handshake fails), the upgrade
/// request checked, `101` answered with this server's id. A peer that turns out to be this
/// server (its own address among `--peer-host`) is answered `409` with the id, and stops
/// dialing that address.
async fn upgrade(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    ctx: &Context,
) -> Result<(WebSocket<TlsStream<TcpStream>>, String), String> {
    let mut tls = acceptor
        .accept(tcp)
        .await
        .map_err(|error| format!("TLS handshake: {error}"))?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(bridgehead_mux::SESSION_TLS_BUFFER));
    let (buf, end) = match http_head::read(&mut tls).await {
        RawHead::Complete { buf, end } => (buf, end),
        RawHead::Closed => return Err("closed before its upgrade request".to_owned()),
        RawHead::TooLarge => return Err("upgrade request head too large".to_owned()),
    };
    let own = &ctx.config.routing.server_id;
    let checked = check(&buf[..end]);
    let (status, reason, headers) = match &checked {
        Ok((_, peer)) if peer == own => (409, "this is the server itself", own_id(own)),
        Ok((key, _)) => {
            let answer = format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\nsec-websocket-protocol: {SUBPROTOCOL}\r\n{}\r\n",
                derive_accept_key(key.as_bytes()),
                own_id(own),
            );
            tls.write_all(answer.as_bytes())
                .await
                .map_err(|error| format!("writing the answer: {error}"))?;
            let peer = checked.map(|(_, peer)| peer).unwrap_or_default();
            let early = buf.freeze().slice(end..);
            return Ok((WebSocket::new(tls, WsRole::Server, early), peer));
        }
        Err(reason) => (400, reason.as_str(), String::new()),
    };
    let _ = tls
        .write_all(&http_head::answer(status, reason, &headers))
        .await;
    let _ = tls.shutdown().await;
    Err(reason.to_owned())
}

fn own_id(id: &str) -> String {
    format!("{SERVER_ID_HEADER}: {id}\r\n")
}

/// The upgrade request's WebSocket key and the peer's server id.
fn check(head: &[u8]) -> Result<(String, String), String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed upgrade request".to_owned()),
    }
    if request.method != Some("GET") || request.path != Some(PEER_PATH) {
        return Err(format!("peers upgrade with GET {PEER_PATH}"));
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let protocols = header("sec-websocket-protocol").unwrap_or_default();
    if !protocols.split(',').any(|p| p.trim() == SUBPROTOCOL) {
        return Err(format!("this server speaks {SUBPROTOCOL}"));
    }
    let key = header("sec-websocket-key")
        .filter(|key| !key.is_empty())
        .ok_or("no Sec-WebSocket-Key")?;
    let peer = header(SERVER_ID_HEADER)
        .filter(|id| check_server_id(id).is_ok())
        .ok_or_else(|| format!("no valid {SERVER_ID_HEADER}"))?;
    Ok((key.to_owned(), peer.to_owned()))
}

/// Takes the peer's streams until the session ends: the view stream, or a tunnel each.
async fn accept_loop(mux: &Mux, ctx: &Arc<Context>, peer: &str, streams: &TaskTracker) {
    // A peer's dials count against the pending-dial bounds as a CONNECT client's do.
    let client: ClientKey = Arc::from(format!("peer {peer}").as_bytes());
    while let Some(request) = mux.accept().await {
        if request.host == view::VIEW_HOST && request.port == view::VIEW_PORT {
            streams.spawn(tell(request, ctx.clone()));
            continue;
        }
        ctx.metrics.peer_tunnel(peer);
        let span = tracing::debug_span!("tunnel", stream = request.id());
        let tunnel = forwarded(request, ctx.clone(), client.clone(), ctx.tunnels.token());
        streams.spawn(tunnel.instrument(span));
    }
}

/// The view stream: every agent of this server now, then each change, until the peer
/// closes the stream or the session ends.
async fn tell(request: DialRequest, ctx: Arc<Context>) {
    let Ok(stream) = request.accept() else {
        return;
    };
    let mut changes = ctx.registry.changes();
    let mut sent = Sent::default();
    let mut first = true;
    loop {
        changes.borrow_and_update();
        let mut lines = sent.diff(&ctx.registry.local_agents());
        if first {
            lines.extend_from_slice(view::SYNCED);
            first = false;
        }
        if !lines.is_empty() && stream.write(lines.into()).await.is_err() {
            return;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            // The peer never writes here: a read returns only when the stream or session ends.
            _ = stream.read() => return,
        }
        tokio::time::sleep(VIEW_BATCH).await;
    }
}

/// One forwarded tunnel: routed among this server's own agents (never forwarded again),
/// dialed within the forwarding server's deadline, answered, then pumped.
async fn forwarded(
    request: DialRequest,
    ctx: Arc<Context>,
    client: ClientKey,
    _tunnel: tokio_util::task::task_tracker::TaskTrackerToken,
) {
    let admitted = if ctx.memory.budget.admit() {
        ctx.admission.admit(&client)
    } else {
        Err(Refusal::MemoryBudget {
            buffered: ctx.memory.budget.buffered(),
            limit: ctx.memory.budget.limit(),
        })
    };
    // Held while the dial is pending, as a CONNECT's is.
    let slot = match admitted {
        Ok(slot) => slot,
        Err(refusal) => {
            let (code, message) = answer(&refusal);
            return request.reject(code, &message);
        }
    };
    let authority = bridgehead_proto::host::HostPort(&request.host, request.port).to_string();
    let dialed = match Target::parse(&authority) {
        Ok(target) => match ctx.registry.route_local(&target.host) {
            Ok(candidates) => {
                let timeout = request.timeout.min(ctx.config.routing.dial_timeout);
                tokio::select! {
                    dialed = dial::dial(candidates, &target, timeout) => dialed,
                    () = request.cancelled() => return debug!("the forwarding server gave up"),
                }
            }
            Err(error) => Err(Refusal::from(error)),
        },
        Err(bad) => Err(Refusal::BadTarget(bad)),
    };
    drop(slot);
    let agent = match dialed {
        Ok(dialed) => dialed.stream,
        Err(refusal) => {
            let (code, message) = answer(&refusal);
            debug!(%refusal, "forwarded dial failed");
            return request.reject(code, &message);
        }
    };
    let Ok(peer) = request.accept() else {
        return debug!("the forwarding server gave up before the dial finished");
    };
    pump(&peer, &agent).await;
}

/// The code and message a failed forwarded dial answers with, so that the forwarding server
/// answers its client what this server would have.
fn answer(refusal: &Refusal) -> (ErrorCode, String) {
    let code = match refusal {
        Refusal::Dial { code, .. } => *code,
        Refusal::TimedOut { .. } => ErrorCode::TimedOut,
        Refusal::AgentLost { .. } => ErrorCode::ConnectionReset,
        Refusal::Overloaded(_) | Refusal::ClientOverloaded(_) | Refusal::MemoryBudget { .. } => {
            ErrorCode::Overloaded
        }
        // No agent (or none with room) here any more: the view is a moment behind.
        _ => ErrorCode::Draining,
    };
    let message = match refusal {
        Refusal::Dial { message, .. } => message.clone(),
        other => other.to_string(),
    };
    (code, message)
}

/// Both directions between two streams, each under its own streams' flow control: a chunk is
/// read only once the previous one was written, so a slow reader on one side holds back only
/// this tunnel. An end passes through as it came: FIN as FIN, a reset as a reset.
async fn pump(a: &MuxStream, b: &MuxStream) {
    let (up, down) = tokio::join!(one_way(a, b), one_way(b, a));
    if let Err(end) = up.and(down) {
        a.reset(end.code, &end.reason);
        b.reset(end.code, &end.reason);
    }
}

async fn one_way(from: &MuxStream, to: &MuxStream) -> Result<(), StreamEnd> {
    loop {
        match from.read().await {
            Ok(Some(chunk)) => {
                if let Err(end) = to.write(chunk).await {
                    from.reset(end.code, &end.reason);
                    return Err(end);
                }
            }
            Ok(None) => return to.finish(),
            Err(end) => {
                to.reset(end.code, &end.reason);
                return Err(end);
            }
        }
    }
}
