//! The peer port: servers that forward to this one connect here, under the agent port's
//! pre-authentication admission ([`HandshakeAdmission`]: a few places, a stalled handshake cut for
//! a waiting one), with mutual TLS and a peer's certificate ([`super::identity`]); they
//! upgrade to a WebSocket at [`PEER_PATH`] naming themselves ([`crate::agents::upgrade`], the agent
//! port's checks), and run a session in which this server takes the agent's role. Each stream
//! they open is a tunnel for one of this server's own agents ([`super::forwarded`]), or the
//! view stream (the first, `bridgehead-peer.v1`'s stream 1), on which this server keeps them
//! told of its agents ([`super::view`]).

use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::{DialRequest, Mux, Serve, WebSocket, WsRole};
use bridgehead_proto::servers::{check_server_id, SERVER_ID_HEADER};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::PEER_SUBPROTOCOL;
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use super::identity::{NotAPeer, PeerPolicy};
use super::view::{self, Sent};
use crate::agents::admission::{HandshakeAdmission, Place, Room};
use crate::agents::upgrade::{self, BadUpgrade, Expect, PreAuthTls};
use crate::context::Context;
use crate::process::http_head::{self, RawHead};
use crate::routing::admission::ClientKey;

/// Path of a peer's upgrade request.
pub const PEER_PATH: &str = "/peer";

/// What the peer port expects of an upgrade request.
const PEER_UPGRADE: Expect = Expect {
    who: "peers",
    path: PEER_PATH,
    subprotocol: PEER_SUBPROTOCOL,
};

/// Most connections in their TLS handshake and upgrade request on the peer port at once. A
/// handful of servers dial it, each once per session (the agent port holds thousands, the
/// frontend 512); more wait in the listen backlog, and a place whose peer stalls for
/// `--agent-handshake-stall` is given to a waiting one, as on the agent port.
pub const PEER_HANDSHAKES: usize = 16;

/// Most peer sessions this server serves at once: each peer holds one (two while it
/// reconnects), so this is room for a control plane of dozens of servers; past it a peer is
/// answered 503, since every session holds a view and its tunnels.
pub const PEER_SESSIONS: usize = 64;

/// After a change of this server's agents, how long the view waits for more before it tells
/// the peers: a fleet reconnecting at once goes out in a few batches, not a line per change
/// and a scan of every agent per line.
const VIEW_BATCH: Duration = Duration::from_millis(20);

/// Accepts peers until `stop`; each session runs until the peer leaves or `end` fires.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<crate::process::tls_config::ReloadingConfig>,
    policy: PeerPolicy,
    ctx: Arc<Context>,
    stop: CancellationToken,
    end: CancellationToken,
    tracker: TaskTracker,
) {
    let admission = HandshakeAdmission::new(
        PEER_HANDSHAKES,
        ctx.config.agent_endpoint.handshake_stall,
        ctx.config.agent_endpoint.handshake_timeout,
    );
    let sessions = Arc::new(Semaphore::new(PEER_SESSIONS));
    loop {
        // A place first, then the connection, as on the agent port.
        let (place, room) = tokio::select! {
            placed = admission.place() => placed,
            () = stop.cancelled() => return,
        };
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
        if room == Room::Cut {
            ctx.metrics.process.handshake_refused("peer");
            if let Some(suppressed) = ctx.refusal_log.admit() {
                warn!(
                    suppressed,
                    "every peer handshake place was taken: one whose peer had stalled was closed"
                );
            }
        }
        let acceptor = TlsAcceptor::from(tls.current());
        let span = tracing::info_span!("peer", %address, server = tracing::field::Empty);
        let peer = Peer {
            policy: policy.clone(),
            sessions: sessions.clone(),
            ctx: ctx.clone(),
        };
        let session = peer.session(tcp, place, acceptor, stop.clone(), end.clone());
        tracker.spawn(session.instrument(span));
    }
}

/// Why a peer's connection ended before its session started.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("connection closed during the upgrade")]
    Closed,
    #[error("no TLS handshake and upgrade request within {0:?}")]
    TimedOut(Duration),
    #[error("handshake stalled, and closed to make room for another peer")]
    Stalled,
    #[error(transparent)]
    NotAPeer(#[from] NotAPeer),
    #[error(transparent)]
    Bad(#[from] BadUpgrade),
    #[error("no valid {SERVER_ID_HEADER}")]
    NoServerId,
    /// The peer is this server (its own address among `--peer-host`).
    #[error("this is the server itself")]
    Itself,
    #[error("this server serves {PEER_SESSIONS} peer sessions already")]
    TooManySessions,
}

impl Refused {
    /// The status the peer is answered with, if it still listens.
    fn status(&self) -> Option<StatusCode> {
        match self {
            Refused::Tls(_) | Refused::Closed | Refused::TimedOut(_) | Refused::Stalled => None,
            Refused::NotAPeer(_) => Some(StatusCode::FORBIDDEN),
            Refused::Bad(bad) => Some(bad.status),
            Refused::NoServerId => Some(StatusCode::BAD_REQUEST),
            Refused::Itself => Some(StatusCode::CONFLICT),
            Refused::TooManySessions => Some(StatusCode::SERVICE_UNAVAILABLE),
        }
    }
}

/// What each peer connection's task needs.
#[derive(Debug)]
struct Peer {
    policy: PeerPolicy,
    /// A permit per session served ([`PEER_SESSIONS`]).
    sessions: Arc<Semaphore>,
    ctx: Arc<Context>,
}

impl Peer {
    /// One peer's connection: TLS and the upgrade request within
    /// `--agent-handshake-timeout` (cut for room only when the peer stalled), the answer,
    /// then the session.
    async fn session(
        self,
        tcp: TcpStream,
        place: Place,
        acceptor: TlsAcceptor,
        stop: CancellationToken,
        end: CancellationToken,
    ) {
        let ctx = &self.ctx;
        let _ = tcp.set_nodelay(true);
        let timeout = ctx.config.agent_endpoint.handshake_timeout;
        let read = tokio::select! {
            read = tokio::time::timeout(timeout, upgrade::pre_auth(place.watch(tcp), acceptor)) => {
                match read {
                    Ok(read) => read.map_err(Refused::Tls),
                    Err(_) => Err(Refused::TimedOut(timeout)),
                }
            }
            () = place.cut() => Err(Refused::Stalled),
        };
        drop(place);
        let opened = match read {
            Ok((mut tls, head)) => {
                tls.get_mut().0.release();
                let answering = self.establish(tls, head);
                tokio::time::timeout(ctx.config.agent_endpoint.answer_timeout, answering)
                    .await
                    .unwrap_or(Err(Refused::TimedOut(
                        ctx.config.agent_endpoint.answer_timeout,
                    )))
            }
            Err(refused) => Err(refused),
        };
        let (ws, peer, _session) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                if let Some(suppressed) = ctx.refusal_log.admit() {
                    info!(%error, suppressed, "peer refused");
                }
                return;
            }
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
            let accepting = accept_loop(&mux, ctx, &peer, &streams);
            // A draining server tells its peers, which forward nothing new here.
            let drain = async {
                stop.cancelled().await;
                mux.drain();
            };
            tokio::join!(accepting, drain);
        };
        let serve = Serve::new(ctx.config.agent_endpoint.keepalive(), end).beside(beside);
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

    /// The certificate a peer's (else `403`), the upgrade request checked, a session's permit
    /// (else `503`), `101` answered with this server's id: the WebSocket, the peer's id and the
    /// permit, held while the session lives. A peer that turns out to be this server is
    /// answered `409` with the id, and stops dialing that address.
    async fn establish(
        &self,
        mut tls: PreAuthTls,
        head: RawHead,
    ) -> Result<(WebSocket<PreAuthTls>, String, OwnedSemaphorePermit), Refused> {
        let own = &self.ctx.config.routing.server_id;
        let checked = self.check(&tls, head, own).and_then(|checked| {
            let permit = self.sessions.clone().try_acquire_owned();
            Ok((checked, permit.map_err(|_| Refused::TooManySessions)?))
        });
        let ((upgrade, peer, early), permit) = match checked {
            Ok(checked) => checked,
            Err(refused) => return Err(answer(&mut tls, refused, own).await),
        };
        let own_id = format!("{SERVER_ID_HEADER}: {own}\r\n");
        tls.write_all(&upgrade::switching(&upgrade.key, PEER_SUBPROTOCOL, &own_id))
            .await
            .map_err(|_| Refused::Closed)?;
        Ok((WebSocket::new(tls, WsRole::Server, early), peer, permit))
    }

    /// The certificate, the request and the server id it names, in that order: a stranger's
    /// request is not read further than its head.
    fn check(
        &self,
        tls: &PreAuthTls,
        head: RawHead,
        own: &str,
    ) -> Result<(upgrade::Upgrade, String, bytes::Bytes), Refused> {
        let (buf, end) = match head {
            RawHead::Complete { buf, end } => (buf, end),
            RawHead::Closed => return Err(Refused::Closed),
            RawHead::TooLarge => {
                return Err(Refused::Bad(BadUpgrade {
                    status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    reason: "upgrade request head too large".to_owned(),
                }))
            }
        };
        let certificate = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
        self.policy.check(certificate)?;
        let upgrade = upgrade::request(&buf[..end], PEER_UPGRADE)?;
        let peer = upgrade
            .values(SERVER_ID_HEADER)
            .map(str::trim)
            .find(|id| check_server_id(id).is_ok())
            .ok_or(Refused::NoServerId)?
            .to_owned();
        if peer == own {
            return Err(Refused::Itself);
        }
        Ok((upgrade, peer, buf.freeze().slice(end..)))
    }
}

/// Writes `refused`'s answer (if the peer still listens) and closes; returns it for the log.
/// A `409` names this server, `own`.
async fn answer(tls: &mut PreAuthTls, refused: Refused, own: &str) -> Refused {
    let Some(status) = refused.status() else {
        return refused;
    };
    let headers = match refused {
        Refused::Itself => format!("{SERVER_ID_HEADER}: {own}\r\n"),
        _ => String::new(),
    };
    let reason = refused.to_string();
    let _ = tls
        .write_all(&http_head::answer(status.as_u16(), &reason, &headers))
        .await;
    let _ = tls.shutdown().await;
    refused
}

/// Takes the peer's streams until the session ends: the view stream ([`view::VIEW_STREAM`],
/// by its id: one per session, since ids are never reused), or a tunnel each.
pub(super) async fn accept_loop(mux: &Mux, ctx: &Arc<Context>, peer: &str, streams: &TaskTracker) {
    // A peer's dials count against the pending-dial bounds as a CONNECT client's do.
    let client: ClientKey = Arc::from(format!("peer {peer}").as_bytes());
    while let Some(request) = mux.accept().await {
        if request.id() == view::VIEW_STREAM {
            streams.spawn(tell(request, ctx.clone()));
            continue;
        }
        ctx.metrics.peering.peer_tunnel(peer);
        let span = tracing::debug_span!(
            "tunnel",
            stream = request.id(),
            target = tracing::field::Empty,
            agent = tracing::field::Empty
        );
        let tunnel =
            super::forwarded::forwarded(request, ctx.clone(), client.clone(), ctx.tunnels.token());
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
