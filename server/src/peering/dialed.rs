//! The peers this server forwards to: every address `--peer-host` resolves to, or the other
//! servers' Leases give (again every `--peer-sync-interval`), is dialed until a session with
//! the server there is up, and dialed again when it ends. In each session this server takes the server's role: it opens the view
//! stream first and keeps the registry's table of that peer's agents current from it; the
//! frontend opens a stream per forwarded tunnel.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use bridgehead_kubeapi::leases::LeaseCount;
use bridgehead_mux::{Mux, MuxStream, Serve, WebSocket, WsRole};
use bridgehead_proto::servers::{check_server_id, CONNECTED_SERVERS_HEADER, SERVER_ID_HEADER};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::PEER_SUBPROTOCOL;
use bridgehead_runtime::addresses::Addresses;
use bridgehead_runtime::timeouts::{PEER_CONNECT, PEER_VIEW_OPEN};
use bridgehead_runtime::tls;
use bridgehead_runtime::upgrade::{upgrade, Answer};
use bytes::BytesMut;
use http::header::{HeaderValue, SEC_WEBSOCKET_PROTOCOL};
use http::StatusCode;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use super::accepted::PEER_PATH;
use super::identity::PeerPolicy;
use super::view::{self, Held, Update, ViewError, ViewLimits, MAX_LINE, VIEW_DIAL, VIEW_STREAM};
use crate::config::PeeringConfig;
use crate::context::Context;
use crate::process::metrics::GaugeShare;
use crate::routing::registry::PeerSession;

/// Outcomes of attempts not yet recorded; attempts wait while it is full.
const OUTCOMES: usize = 64;

/// What became of an address.
#[derive(Debug)]
enum Outcome {
    /// It is this server.
    Own,
    /// A session with server `id` is up there, and its agents known.
    Up(String),
    /// It leads to server `id`, which another address's session holds already.
    Held(String),
    /// The attempt failed; dial again at the next round.
    Failed(String),
    /// The session with server `id` there ended.
    Ended(String),
}

/// Where each resolved address stands.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Dialing,
    Live(String),
    Own,
    Held(String),
}

/// Where the peers are.
#[derive(Debug)]
pub enum Source {
    /// The addresses `--peer-host` resolves to.
    Names(Addresses),
    /// The addresses on the other servers' Leases (`--peer-advertise-address`), this
    /// server's Lease being `own`.
    Leases {
        leases: LeaseCount,
        own: String,
        found: Addresses,
    },
}

impl Source {
    /// `--peer-host`'s names, at `peering.port` unless an entry names its port.
    pub fn names(peering: &PeeringConfig) -> Source {
        Source::Names(Addresses::new(
            peering.hosts.clone(),
            peering.port,
            peering.sync_interval,
        ))
    }

    /// The peers on the Leases `leases` watches, but this server's (`own`, its Lease's name).
    pub fn leases(leases: LeaseCount, own: String, peering: &PeeringConfig) -> Source {
        let found = Addresses::new(Vec::new(), peering.port, peering.sync_interval);
        Source::Leases { leases, own, found }
    }

    /// The addresses now (names resolved again at most once a sync interval).
    async fn refresh(&mut self) -> Vec<SocketAddr> {
        let addresses = match self {
            Source::Names(addresses) => addresses,
            Source::Leases { leases, own, found } => {
                let listed = leases.peer_addresses(own);
                if !found.is_for(&listed) {
                    let every = found.every();
                    *found = Addresses::new(listed, 0, every);
                }
                found
            }
        };
        addresses.refresh().await;
        addresses.resolved().to_vec()
    }

    /// The name `address` was found by, which its certificate must carry (unless
    /// `--peer-server-name` says otherwise).
    fn name(&self, address: SocketAddr) -> String {
        let addresses = match self {
            Source::Names(addresses)
            | Source::Leases {
                found: addresses, ..
            } => addresses,
        };
        addresses.entry(address).unwrap_or_default().to_owned()
    }
}

/// Dials the peers `source` finds until `stop`; their sessions end with `end`. `settled` turns
/// true once every address of the first resolution was tried (the frontend holds CONNECTs
/// that find no agent until then: a server just started knows its peers' agents a moment
/// later).
pub async fn dial_peers(
    ctx: Arc<Context>,
    peering: PeeringConfig,
    mut source: Source,
    settled: watch::Sender<bool>,
    stop: CancellationToken,
    end: CancellationToken,
    tracker: TaskTracker,
) {
    let peering = Arc::new(peering);
    let mut slots: HashMap<SocketAddr, Slot> = HashMap::new();
    let mut failing = HashSet::new();
    let (outcomes, mut results) = mpsc::channel(OUTCOMES);
    loop {
        let resolved = source.refresh().await;
        slots.retain(|address, slot| resolved.contains(address) || *slot == Slot::Dialing);
        for &address in &resolved {
            if slots.contains_key(&address) {
                continue;
            }
            let held: Vec<String> = slots
                .values()
                .filter_map(|slot| match slot {
                    Slot::Live(id) => Some(id.clone()),
                    _ => None,
                })
                .collect();
            slots.insert(address, Slot::Dialing);
            let name = source.name(address);
            let attempt = attempt(
                ctx.clone(),
                peering.clone(),
                address,
                name,
                held,
                outcomes.clone(),
                end.clone(),
            );
            tracker.spawn(attempt.instrument(tracing::info_span!("peer", %address)));
        }
        if !slots.values().any(|slot| *slot == Slot::Dialing) {
            settled.send_replace(true);
        }
        let round = tokio::time::sleep(peering.sync_interval);
        tokio::pin!(round);
        loop {
            tokio::select! {
                Some((address, outcome)) = results.recv() => {
                    record(&mut slots, &mut failing, address, outcome);
                    if !slots.values().any(|slot| *slot == Slot::Dialing) {
                        settled.send_replace(true);
                    }
                }
                () = &mut round => break,
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Notes what became of `address`.
/// An address that failed is said once (at warn: peers that cannot reach each other cannot
/// forward), and again when it is reached.
fn record(
    slots: &mut HashMap<SocketAddr, Slot>,
    failing: &mut HashSet<SocketAddr>,
    address: SocketAddr,
    outcome: Outcome,
) {
    match outcome {
        Outcome::Own => {
            slots.insert(address, Slot::Own);
        }
        Outcome::Up(id) => {
            if failing.remove(&address) {
                info!(%address, server = %id, "the peer can be reached again");
            }
            slots.insert(address, Slot::Live(id));
        }
        Outcome::Held(id) => {
            slots.insert(address, Slot::Held(id));
        }
        Outcome::Failed(error) => {
            if failing.insert(address) {
                warn!(%address, %error, "cannot reach a peer; trying again every --peer-sync-interval");
            } else {
                debug!(%address, %error, "dialing a peer");
            }
            slots.remove(&address);
        }
        Outcome::Ended(id) => {
            slots.remove(&address);
            // Addresses that led to the same server are dialed again too.
            slots.retain(|_, slot| *slot != Slot::Held(id.clone()));
        }
    }
}

/// Dials `address` and, once connected, runs the session until it ends.
async fn attempt(
    ctx: Arc<Context>,
    peering: Arc<PeeringConfig>,
    address: SocketAddr,
    name: String,
    held: Vec<String>,
    outcomes: mpsc::Sender<(SocketAddr, Outcome)>,
    end: CancellationToken,
) {
    let own = &ctx.config.routing.server_id;
    let connecting = connect(&peering, address, &name, own, &held);
    let connected = tokio::time::timeout(PEER_CONNECT, connecting)
        .await
        .unwrap_or_else(|_| {
            Err(Refused::Failed(format!(
                "no session within {PEER_CONNECT:?}"
            )))
        });
    let (ws, id) = match connected {
        Ok(connected) => connected,
        Err(refused) => {
            let outcome = match refused {
                Refused::Conflict(id) if id == *own => Outcome::Own,
                Refused::Conflict(id) => Outcome::Held(id),
                Refused::Failed(error) => Outcome::Failed(error),
            };
            let _ = outcomes.send((address, outcome)).await;
            return;
        }
    };
    let (synced, known) = oneshot::channel();
    let up = async {
        if known.await.is_ok() {
            let _ = outcomes.send((address, Outcome::Up(id.clone()))).await;
        }
    };
    tokio::join!(run(ws, &id, &ctx, end, synced), up);
    let _ = outcomes.send((address, Outcome::Ended(id))).await;
}

/// Why no session came of an attempt.
#[derive(Debug)]
enum Refused {
    /// `409` from server `id`: this server itself, or one held already.
    Conflict(String),
    Failed(String),
}

type PeerWebSocket = WebSocket<tokio_rustls::client::TlsStream<TcpStream>>;

/// TCP, mutual TLS, the peer's certificate checked ([`PeerPolicy`]), and the upgrade to
/// [`PEER_PATH`] naming this server and the peers it holds: the peer's WebSocket and id.
async fn connect(
    peering: &PeeringConfig,
    address: SocketAddr,
    name: &str,
    own: &str,
    held: &[String],
) -> Result<(PeerWebSocket, String), Refused> {
    let failed = |error: &dyn std::fmt::Display| Refused::Failed(error.to_string());
    let tls = client_config(peering).map_err(|error| failed(&format!("{error:#}")))?;
    let name = peering.server_name.as_deref().unwrap_or(name);
    let name = ServerName::try_from(name.to_owned()).map_err(|error| failed(&error))?;
    let tcp = TcpStream::connect(address).await.map_err(|e| failed(&e))?;
    let _ = tcp.set_nodelay(true);
    let mut tls = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|error| failed(&format!("TLS handshake: {error}")))?;
    // The chain and the name are TLS's; that the certificate is a peer's, not the frontend's
    // or a client's from the same CA, is ours.
    let certificate = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
    PeerPolicy::new(peering)
        .check(certificate)
        .map_err(|not_a_peer| failed(&not_a_peer))?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(bridgehead_mux::SESSION_TLS_BUFFER));
    let mut request = format!("wss://{address}{PEER_PATH}")
        .into_client_request()
        .map_err(|error| failed(&error))?;
    let headers = request.headers_mut();
    headers.insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(PEER_SUBPROTOCOL),
    );
    // Ids are checked when configured and received (header-safe), so the values form.
    if let Ok(value) = HeaderValue::from_str(own) {
        headers.insert(SERVER_ID_HEADER, value);
    }
    if let Ok(value) = HeaderValue::from_str(&held.join(",")) {
        if !held.is_empty() {
            headers.insert(CONNECTED_SERVERS_HEADER, value);
        }
    }
    let answer = upgrade(&mut tls, &request)
        .await
        .map_err(|error| failed(&error))?;
    let id_in = |headers: &http::HeaderMap| {
        headers
            .get(SERVER_ID_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|id| check_server_id(id).is_ok())
            .map(str::to_owned)
    };
    match answer {
        Answer::Upgraded { headers, early } => {
            let speaks = headers
                .get(SEC_WEBSOCKET_PROTOCOL)
                .and_then(|value| value.to_str().ok())
                .is_some_and(|value| value.trim() == PEER_SUBPROTOCOL);
            if !speaks {
                return Err(failed(&format!(
                    "the peer's 101 does not name {PEER_SUBPROTOCOL}"
                )));
            }
            let id = id_in(&headers).ok_or_else(|| failed(&"the peer sent no server id"))?;
            Ok((WebSocket::new(tls, WsRole::Client, early), id))
        }
        Answer::Refused {
            status, headers, ..
        } => match id_in(&headers) {
            Some(id) if status == StatusCode::CONFLICT => Err(Refused::Conflict(id)),
            _ => Err(failed(&format!("the peer answered {status}"))),
        },
    }
}

/// The peer TLS client: the peer CA's roots, this server's peer certificate. Read again for
/// every attempt, so rotated files take effect on the next session.
fn client_config(peering: &PeeringConfig) -> anyhow::Result<Arc<ClientConfig>> {
    let roots = tls::load_roots(&peering.ca).context("--peer-ca-cert")?;
    let certs = tls::load_certs(&peering.cert).context("--peer-cert")?;
    let key = tls::load_key(&peering.key).context("--peer-key")?;
    let mut config = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .context("configuring TLS")?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .context("--peer-cert and --peer-key do not make a usable pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Runs the session with peer `id`: its agents in the registry while it lives and does not
/// drain. `synced` hears once they are all known.
async fn run(
    ws: PeerWebSocket,
    id: &str,
    ctx: &Arc<Context>,
    end: CancellationToken,
    synced: oneshot::Sender<()>,
) {
    let mux = Mux::new(SessionConfig {
        budget: ctx.memory.budget.clone(),
        max_window: ctx.memory.max_window,
        max_streams: usize::MAX,
        ..SessionConfig::new(Role::Server)
    });
    let (session, replaced) = ctx.registry.add_peer(id, mux.clone());
    if let Some(old) = replaced {
        old.close("replaced by a new session with the same peer");
    }
    ctx.metrics.peering.peers_connected.inc();
    info!(server = %id, "forwarding to peer: tunnels to its agents go through it");
    let watch_view = async {
        let limits = ViewLimits::default();
        if let Err(error) = follow(&mux, id, session, ctx, synced, limits).await {
            warn!(server = %id, %error, "the peer's view of its agents failed; closing the session");
            mux.close("the view of the peer's agents failed");
        }
    };
    let on_drain = async {
        info!(server = %id, "peer drains: forwarding nothing new to it");
        ctx.registry.remove_peer(id, session);
        ctx.metrics.peering.peer_agents.set(count(ctx));
    };
    let serve = Serve::new(ctx.config.agent_endpoint.keepalive(), end)
        .on_peer_drain(on_drain)
        .beside(watch_view);
    let result = mux.serve(ws, serve).await;
    ctx.registry.remove_peer(id, session);
    ctx.metrics.peering.peer_agents.set(count(ctx));
    ctx.metrics.peering.peers_connected.dec();
    match result {
        Ok(()) => {
            let reason = mux.closed().await;
            info!(server = %id, %reason, "peer session ended");
        }
        Err(error) => info!(server = %id, %error, "peer session ended"),
    }
}

fn count(ctx: &Context) -> i64 {
    i64::try_from(ctx.registry.peer_agent_count()).unwrap_or(i64::MAX)
}

/// Opens the view stream and applies each line to the registry until the session ends; an
/// error when the view is malformed or goes past `limits` (the caller closes the session).
pub(super) async fn follow(
    mux: &Mux,
    id: &str,
    session: PeerSession,
    ctx: &Context,
    synced: oneshot::Sender<()>,
    limits: ViewLimits,
) -> Result<(), String> {
    let mut synced = Some(synced);
    let (host, port) = VIEW_DIAL;
    let stream: MuxStream = mux
        .open(host, port, PEER_VIEW_OPEN)
        .await
        .map_err(|error| format!("opening the view stream: {error}"))?;
    // Nothing is routed to a peer before its view names an agent, so this is the session's
    // first stream; were it not, the peer would take it for a tunnel.
    if stream.id() != VIEW_STREAM {
        return Err(format!(
            "the view stream is stream {}, not {VIEW_STREAM}",
            stream.id()
        ));
    }
    let mut pending = BytesMut::new();
    let mut held = Held::default();
    let mut counted = GaugeShare::new(&ctx.metrics.peering.peer_view_bytes);
    loop {
        let chunk = match stream.read().await {
            Ok(Some(chunk)) => chunk,
            // The stream ends with the session; the session's end says why.
            Ok(None) | Err(_) => return Ok(()),
        };
        pending.extend_from_slice(&chunk);
        let applied = apply_lines(&mut pending, &mut held, limits, |update| match update {
            Update::Agent {
                key,
                draining,
                identifiers,
            } => ctx
                .registry
                .set_peer_agent(id, session, key, &identifiers, draining),
            Update::Gone { key } => ctx.registry.remove_peer_agent(id, session, key),
            Update::Synced => {
                if let Some(synced) = synced.take() {
                    let _ = synced.send(());
                }
            }
        });
        // The bytes first: whoever sees the agents counted sees their bytes too.
        counted.set(held.bytes());
        ctx.metrics.peering.peer_agents.set(count(ctx));
        applied.map_err(|error| error.to_string())?;
    }
}

/// Takes every whole line off `pending`, each checked against `held` and `limits` before
/// `apply` sees it; a line still open may not grow past [`MAX_LINE`].
fn apply_lines(
    pending: &mut BytesMut,
    held: &mut Held,
    limits: ViewLimits,
    mut apply: impl FnMut(Update),
) -> Result<(), ViewError> {
    while let Some(at) = pending.iter().position(|&b| b == b'\n') {
        let line = pending.split_to(at + 1);
        let line = std::str::from_utf8(&line[..at]).map_err(|_| ViewError::NotUtf8)?;
        let update = view::parse(line)?;
        held.apply(&update, line.len(), limits)?;
        apply(update);
    }
    if pending.len() > MAX_LINE {
        return Err(ViewError::LineTooLong);
    }
    Ok(())
}
