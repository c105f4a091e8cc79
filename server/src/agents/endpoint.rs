//! The agent endpoint: agents connect with a WebSocket over TLS, announce their identifiers in
//! the upgrade URL's query string, and authenticate with a client certificate, a bearer token,
//! or both ([`crate::agents::auth`]).
//!
//! The endpoint reads the upgrade request itself ([`crate::agents::upgrade`], as the peer port does),
//! so that authentication — a TokenReview against kube-apiserver — can run before the answer;
//! then it answers `101` and hands the connection to the session driver. A refusal is the
//! status and a one-line reason (in the status line and the body), which the agent logs.

use std::net::SocketAddr;
use std::sync::Arc;

use bridgehead_mux::{Mux, Serve, WebSocket, WsRole};
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_proto::servers::{
    parse_connected_servers, CONNECTED_SERVERS_HEADER, SERVER_COUNT_HEADER, SERVER_ID_HEADER,
};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::SUBPROTOCOL;
use bridgehead_runtime::threads::{spawn_home, Home};
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::agents::admission::{Place, Room};
use crate::agents::auth::{AgentIdentity, AuthRefusal, Presented};
use crate::agents::upgrade::{self, Expect, PreAuthTls};
use crate::context::Context;
use crate::process::http_head::{self, RawHead};
use crate::process::metrics::AgentHandshake;
use crate::routing::registry::{RegisterError, Registration, Replaced};

pub use bridgehead_proto::ident::{MAX_IDENTIFIERS, MAX_QUERY_BYTES};

/// Path of the upgrade request.
pub const CONNECT_PATH: &str = "/connect";

/// What the agent port expects of an upgrade request.
const AGENT_UPGRADE: Expect = Expect {
    who: "agents",
    path: CONNECT_PATH,
    subprotocol: SUBPROTOCOL,
};

/// Accepts agents until `shutdown`; each session runs until the agent leaves or `sessions`
/// is cancelled.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<crate::process::tls_config::ReloadingConfig>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    sessions: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        // A place first, then the connection: while every place is taken by a handshake that
        // is moving, newcomers wait in the listen backlog, in order.
        let (place, room) = tokio::select! {
            placed = ctx.agent_admission.place() => placed,
            () = shutdown.cancelled() => return,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    bridgehead_runtime::accept::failed("agent endpoint", &error, &ctx.refusal_log)
                        .await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        if room == Room::Cut {
            ctx.metrics.process.handshake_refused("agent");
            if let Some(suppressed) = ctx.refusal_log.admit() {
                warn!(
                    suppressed,
                    stall = ?ctx.agent_admission.stall_time(),
                    "every agent handshake place was taken: one whose agent had stalled was closed"
                );
            }
        }
        let span = tracing::info_span!("agent", peer = %peer, agent = tracing::field::Empty);
        let acceptor = TlsAcceptor::from(tls.current());
        let (ctx, sessions, stop) = (ctx.clone(), sessions.clone(), shutdown.clone());
        let Some(home) = ctx.shards.home() else {
            let ends = Ends { stop, sessions };
            let here = session(tcp, peer, acceptor, ctx, ends, place, None);
            spawn_home(None, &tracker, here.instrument(span));
            continue;
        };
        // The whole session runs on its shard: its socket leaves this runtime's reactor
        // here and joins the shard's there.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(error) => {
                debug!(%error, "taking an agent's connection to its session thread");
                continue;
            }
        };
        let handle = home.handle().clone();
        let on_home = async move {
            match tokio::net::TcpStream::from_std(tcp) {
                Ok(tcp) => {
                    let ends = Ends { stop, sessions };
                    session(tcp, peer, acceptor, ctx, ends, place, Some(home)).await
                }
                Err(error) => debug!(%error, "registering an agent's connection"),
            }
        };
        spawn_home(Some(&handle), &tracker, on_home.instrument(span));
    }
}

/// Why an agent's connection ended before its session started.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("connection closed during the upgrade")]
    Closed,
    #[error("no TLS handshake and upgrade request within {0:?}")]
    PreAuthTimeout(std::time::Duration),
    #[error("handshake stalled, and closed to make room for another agent")]
    Stalled,
    #[error("the server shut down during the handshake")]
    ShuttingDown,
    #[error("the upgrade answer could not be written within {0:?}")]
    AnswerTimeout(std::time::Duration),
    /// Answered with this status and reason.
    #[error("{1}")]
    Answered(StatusCode, String),
    #[error(transparent)]
    Auth(#[from] AuthRefusal),
    /// The agent holds a session with this server already.
    #[error("this agent already holds a session with this server (server id {0})")]
    Duplicate(String),
}

impl Refused {
    /// The `agent_handshakes` label of this ending.
    fn label(&self) -> AgentHandshake {
        match self {
            Refused::Tls(_) => AgentHandshake::TlsError,
            Refused::Closed | Refused::ShuttingDown => AgentHandshake::Closed,
            Refused::PreAuthTimeout(_) | Refused::AnswerTimeout(_) => AgentHandshake::TimedOut,
            Refused::Stalled => AgentHandshake::Stalled,
            Refused::Auth(refusal) => match refusal.status() {
                StatusCode::UNAUTHORIZED => AgentHandshake::Unauthorized,
                StatusCode::FORBIDDEN => AgentHandshake::Forbidden,
                _ => AgentHandshake::Refused,
            },
            Refused::Answered(..) => AgentHandshake::Refused,
            Refused::Duplicate(_) => AgentHandshake::Duplicate,
        }
    }

    fn bad(reason: impl Into<String>) -> Refused {
        Refused::Answered(StatusCode::BAD_REQUEST, reason.into())
    }
}

/// A checked upgrade request.
struct Upgrade {
    key: String,
    bearer: Option<String>,
    identifiers: AgentIdentifiers,
    /// The agent already holds a live session with this server (its id is in
    /// `bridgehead-connected-servers`).
    duplicate: bool,
}

/// When a connection's work ends: `stop` (the server stops accepting) ends a handshake,
/// `sessions` (the grace period is over) a session.
struct Ends {
    stop: CancellationToken,
    sessions: CancellationToken,
}

async fn session(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    ctx: Arc<Context>,
    ends: Ends,
    place: Place,
    home: Option<Home>,
) {
    let _ = tcp.set_nodelay(true);
    // Before authentication: TLS and the upgrade request, cut for room only when the agent
    // has stalled (the rule that tells a slowloris from a slow agent), and bounded in all by
    // `--agent-handshake-timeout`, a backstop past what an agent itself waits for, so that
    // it never throws away a handshake whose agent is still answering. Nothing waits for
    // one at shutdown: it has not proved who it is.
    let backstop = ctx.config.agent_endpoint.handshake_timeout;
    let read = tokio::select! {
        read = tokio::time::timeout(backstop, upgrade::pre_auth(place.watch(tcp), acceptor)) => {
            match read {
                Ok(read) => read.map_err(Refused::Tls),
                Err(_) => Err(Refused::PreAuthTimeout(backstop)),
            }
        }
        () = place.cut() => Err(Refused::Stalled),
        () = ends.stop.cancelled() => Err(Refused::ShuttingDown),
    };
    drop(place);
    let outcome = match read {
        Ok((mut tls, head)) => {
            tls.get_mut().0.release();
            establish(tls, head, peer, &ctx, home.as_ref()).await
        }
        Err(refused) => Err(refused),
    };
    ctx.metrics.agents.agent_handshake(match &outcome {
        Ok(_) => AgentHandshake::Ok,
        Err(refused) => refused.label(),
    });
    let established = match outcome {
        Ok(established) => established,
        Err(error) => {
            if let Some(suppressed) = ctx.refusal_log.admit() {
                info!(%error, suppressed, "agent refused");
            }
            return;
        }
    };
    serve_session(established, &ctx, ends.sessions).await;
}

/// A session that was answered `101`, registered under `key`.
struct Established {
    ws: Session,
    identifiers: AgentIdentifiers,
    identity: AgentIdentity,
    name: String,
    mux: Mux,
    key: crate::routing::router::AgentKey,
}

/// Runs an established session until it ends, then takes it out of the registry.
async fn serve_session(established: Established, ctx: &Arc<Context>, sessions: CancellationToken) {
    let Established {
        ws,
        identifiers,
        identity,
        name,
        mux,
        key,
    } = established;
    tracing::Span::current().record("agent", tracing::field::display(&name));
    if let Some(verified) = identity.verified.clone() {
        ctx.revocation.watch(key, *verified, mux.clone());
    }
    ctx.metrics.agents.agents_connected.inc();
    ctx.metrics
        .routing
        .set_ready_backends(&ctx.registry.ready_backends());
    info!(identifiers = %identifiers, identity = %identity.subject, "agent connected");
    let on_drain = async {
        info!("agent drains: routing no new tunnels to it");
        ctx.registry.set_draining(key);
        ctx.metrics
            .routing
            .set_ready_backends(&ctx.registry.ready_backends());
    };
    let serve = Serve::new(ctx.config.agent_endpoint.keepalive(), sessions).on_peer_drain(on_drain);
    let result = mux.serve(ws, serve).await;
    ctx.registry.unregister(key);
    ctx.revocation.forget(key);
    ctx.metrics.agents.agents_connected.dec();
    ctx.metrics
        .routing
        .set_ready_backends(&ctx.registry.ready_backends());
    match result {
        Ok(()) => {
            let reason = mux.closed().await;
            info!(%reason, "agent disconnected");
        }
        Err(error) => info!(%error, "agent session ended"),
    }
}

/// The agent's TLS connection; its socket reports stalls to the handshake's place until the
/// upgrade request is in.
type AgentTls = PreAuthTls;
type Session = WebSocket<AgentTls>;

/// The upgrade request checked, the agent authenticated and registered, the `101` written;
/// or why not (answered to the agent where it still listens). Authentication bounds its own
/// waits; writing the answer has `--handshake-timeout`.
async fn establish(
    mut tls: AgentTls,
    head: RawHead,
    peer: SocketAddr,
    ctx: &Context,
    home: Option<&Home>,
) -> Result<Established, Refused> {
    let (buf, end) = match head {
        RawHead::Complete { buf, end } => (buf, end),
        RawHead::Closed => return Err(Refused::Closed),
        RawHead::TooLarge => {
            let refused = Refused::Answered(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "upgrade request head too large".to_owned(),
            );
            return Err(answer(&mut tls, refused).await);
        }
    };
    let upgrade = match check_upgrade(&buf[..end], &ctx.config.routing.server_id) {
        Ok(upgrade) => upgrade,
        Err(refused) => return Err(answer(&mut tls, refused).await),
    };
    let presented = Presented {
        bearer: upgrade.bearer.as_deref(),
        certificate: tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first()),
    };
    let identity = match ctx
        .agent_auth
        .check(presented, &upgrade.identifiers, &ctx.metrics.agents)
        .await
    {
        Ok(identity) => identity,
        Err(refusal) => return Err(answer(&mut tls, refusal.into()).await),
    };
    if upgrade.duplicate {
        // Looking for the other servers behind the address, the agent reached this one
        // again: refuse the new session rather than replace the live one.
        let refused = Refused::Duplicate(ctx.config.routing.server_id.clone());
        return Err(answer(&mut tls, refused).await);
    }
    let (name, mux, key) = match register(ctx, &upgrade, &identity, peer, home) {
        Ok(registered) => registered,
        Err(refused) => return Err(answer(&mut tls, refused).await),
    };
    let early = buf.freeze().slice(end..);
    let accepted = tokio::time::timeout(
        ctx.config.agent_endpoint.answer_timeout,
        accept(tls, &upgrade.key, early, ctx),
    )
    .await
    .unwrap_or(Err(Refused::AnswerTimeout(
        ctx.config.agent_endpoint.answer_timeout,
    )));
    match accepted {
        Ok(ws) => Ok(Established {
            ws,
            identifiers: upgrade.identifiers,
            identity,
            name,
            mux,
            key,
        }),
        Err(refused) => {
            ctx.registry.unregister(key);
            Err(refused)
        }
    }
}

/// The agent's session made (on `home`, the thread it will run on) and registered under its
/// id: its name, the session and its registry key; a session of the same agent it replaces
/// drains (closed only where the identity's limit leaves no room for both). Refused when the
/// id is another identity's or the identity has its limit.
fn register(
    ctx: &Context,
    upgrade: &Upgrade,
    identity: &AgentIdentity,
    peer: SocketAddr,
    home: Option<&Home>,
) -> Result<(String, Mux, crate::routing::router::AgentKey), Refused> {
    let name = upgrade
        .identifiers
        .id
        .clone()
        .unwrap_or_else(|| peer.to_string());
    let mux = Mux::new(SessionConfig {
        max_streams: ctx.registry.max_tunnels_per_agent(),
        budget: ctx.memory.budget.clone(),
        max_window: ctx.memory.max_window,
        ..SessionConfig::new(Role::Server)
    });
    if let Some(home) = home {
        mux.set_home(home.handle().clone());
    }
    let registration = Registration {
        name: name.clone(),
        identity: identity.subject.clone(),
        identifiers: upgrade.identifiers.clone(),
        peer,
        mux: mux.clone(),
    };
    let (key, replaced) = ctx.registry.register(registration).map_err(|error| {
        let status = match error {
            RegisterError::IdTaken { .. } => StatusCode::CONFLICT,
            RegisterError::TooManySessions { .. } => StatusCode::TOO_MANY_REQUESTS,
        };
        Refused::Answered(status, error.to_string())
    })?;
    match replaced {
        Some(Replaced::Draining) => info!(
            agent = %name,
            "a new session of the same agent takes its place; the old one drains"
        ),
        Some(Replaced::Close(old)) => {
            info!(agent = %name, "a new session of the same agent replaces the old one");
            old.close("replaced by a new session of the same agent");
        }
        None => {}
    }
    Ok((name, mux, key))
}

/// Answers `101` with this server's id and count, and makes the WebSocket, starting with the
/// `early` bytes.
async fn accept(
    mut tls: AgentTls,
    key: &str,
    early: bytes::Bytes,
    ctx: &Context,
) -> Result<Session, Refused> {
    let servers = format!(
        "{SERVER_ID_HEADER}: {}\r\n{SERVER_COUNT_HEADER}: {}\r\n",
        ctx.config.routing.server_id, ctx.config.routing.server_count,
    );
    tls.write_all(&upgrade::switching(key, SUBPROTOCOL, &servers))
        .await
        .map_err(|_| Refused::Closed)?;
    Ok(WebSocket::new(tls, WsRole::Server, early))
}

/// Writes `refused`'s answer (if it has one) and closes; returns it for the log. A duplicate's
/// answer names this server, so the agent knows which session it already holds.
async fn answer(tls: &mut AgentTls, refused: Refused) -> Refused {
    let (status, headers) = match &refused {
        Refused::Answered(status, _) => (*status, String::new()),
        Refused::Auth(refusal) => (
            refusal.status(),
            refusal
                .retry_after()
                .map(|wait| format!("retry-after: {}\r\n", wait.as_secs()))
                .unwrap_or_default(),
        ),
        Refused::Duplicate(id) => (
            StatusCode::CONFLICT,
            format!("{SERVER_ID_HEADER}: {id}\r\n"),
        ),
        Refused::Tls(_)
        | Refused::Closed
        | Refused::PreAuthTimeout(_)
        | Refused::Stalled
        | Refused::ShuttingDown
        | Refused::AnswerTimeout(_) => return refused,
    };
    let _ = tls
        .write_all(&http_head::answer(
            status.as_u16(),
            &refused.to_string(),
            &headers,
        ))
        .await;
    let _ = tls.shutdown().await;
    refused
}

/// Checks the upgrade request: method, path, WebSocket headers, protocol version
/// ([`upgrade::request`]) and identifiers; notes whether the agent already holds a session
/// with `server_id`.
fn check_upgrade(head: &[u8], server_id: &str) -> Result<Upgrade, Refused> {
    let upgrade = upgrade::request(head, AGENT_UPGRADE)
        .map_err(|bad| Refused::Answered(bad.status, bad.reason))?;
    let query = upgrade.query.as_str();
    let bearer = upgrade.values("authorization").find_map(|value| {
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_owned())
    });
    let identifiers = AgentIdentifiers::parse(query)
        .map_err(|error| Refused::bad(format!("bad agent identifiers: {error}")))?;
    let count = identifiers.count();
    if count > MAX_IDENTIFIERS {
        return Err(Refused::bad(format!(
            "{count} identifiers: an agent may announce at most {MAX_IDENTIFIERS}"
        )));
    }
    if query.len() > MAX_QUERY_BYTES {
        return Err(Refused::bad(format!(
            "identifier query of {} bytes: at most {MAX_QUERY_BYTES}",
            query.len()
        )));
    }
    if !identifiers.unknown.is_empty() {
        let keys: Vec<&str> = identifiers
            .unknown
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        debug!(?keys, "ignoring unknown identifier keys (newer agent?)");
    }
    let duplicate = upgrade
        .values(CONNECTED_SERVERS_HEADER)
        .flat_map(parse_connected_servers)
        .any(|id| id == server_id);
    Ok(Upgrade {
        key: upgrade.key,
        bearer,
        identifiers,
        duplicate,
    })
}
