//! The agent endpoint: agents connect with a WebSocket over mTLS and announce their
//! identifiers in the upgrade URL's query string.

use std::net::SocketAddr;
use std::sync::Arc;

use bridgehead_mux::{websocket_config, Mux};
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::SUBPROTOCOL;
use http::{HeaderValue, StatusCode};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::context::Context;

/// Path of the upgrade request.
pub const CONNECT_PATH: &str = "/connect";

/// Accepts agents until `shutdown`; each session runs until the agent leaves or `sessions`
/// is cancelled.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    sessions: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "agent accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let span = tracing::info_span!("agent", peer = %peer, agent = tracing::field::Empty);
        tracker.spawn(
            session(tcp, peer, acceptor.clone(), ctx.clone(), sessions.clone()).instrument(span),
        );
    }
}

#[allow(clippy::result_large_err)] // the upgrade callback's error type is tungstenite's
async fn session(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    ctx: Arc<Context>,
    sessions: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let handshake = async {
        let tls = acceptor
            .accept(tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let mut announced = None;
        let callback = |request: &Request, response: Response| {
            let identifiers = check_upgrade(request)?;
            announced = Some(identifiers);
            let mut response = response;
            response.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_static(SUBPROTOCOL),
            );
            Ok(response)
        };
        let ws = tokio_tungstenite::accept_hdr_async_with_config(
            tls,
            callback,
            Some(websocket_config()),
        )
        .await
        .map_err(|e| format!("WebSocket upgrade: {e}"))?;
        let identifiers = announced.ok_or_else(|| "no identifiers".to_owned())?;
        Ok::<_, String>((ws, identifiers))
    };
    let (ws, identifiers) = match tokio::time::timeout(ctx.handshake_timeout, handshake).await {
        Ok(Ok(done)) => done,
        Ok(Err(error)) => return info!(%error, "agent refused"),
        Err(_) => return info!("agent handshake timed out"),
    };
    let name = identifiers.id.clone().unwrap_or_else(|| peer.to_string());
    tracing::Span::current().record("agent", tracing::field::display(&name));
    let mux = Mux::new(SessionConfig {
        max_streams: ctx.registry.max_tunnels_per_agent(),
        ..SessionConfig::new(Role::Server)
    });
    let key = ctx
        .registry
        .register(name.clone(), identifiers.clone(), peer, mux.clone());
    ctx.metrics.agents_connected.inc();
    info!(identifiers = %identifiers, "agent connected");
    let watch_drain = {
        let mux = mux.clone();
        let registry = ctx.registry.clone();
        async move {
            mux.peer_drained().await;
            if mux.peer_draining() {
                info!("agent drains: routing no new tunnels to it");
                registry.set_draining(key);
            }
            std::future::pending::<()>().await
        }
    };
    let result = tokio::select! {
        result = mux.run(ws, ctx.keepalive, sessions) => result,
        () = watch_drain => Ok(()),
    };
    ctx.registry.unregister(key);
    ctx.metrics.agents_connected.dec();
    match result {
        Ok(()) => info!("agent disconnected"),
        Err(error) => info!(%error, "agent session ended"),
    }
}

/// Checks the upgrade request: path, protocol version and identifiers. A refusal carries the
/// reason as its body.
#[allow(clippy::result_large_err)] // the error type is tungstenite's, passed straight back
fn check_upgrade(request: &Request) -> Result<AgentIdentifiers, ErrorResponse> {
    if request.uri().path() != CONNECT_PATH {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            format!("agents connect to {CONNECT_PATH}"),
        ));
    }
    let offered = request
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|protocol| protocol.trim() == SUBPROTOCOL);
    if !offered {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("unsupported protocol version: this server speaks {SUBPROTOCOL}"),
        ));
    }
    let query = request.uri().query().unwrap_or("");
    let identifiers = AgentIdentifiers::parse(query).map_err(|error| {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("bad agent identifiers: {error}"),
        )
    })?;
    if !identifiers.unknown.is_empty() {
        let keys: Vec<&str> = identifiers
            .unknown
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        debug!(?keys, "ignoring unknown identifier keys (newer agent?)");
    }
    Ok(identifiers)
}

fn refuse(status: StatusCode, reason: String) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(reason));
    *response.status_mut() = status;
    response
}
