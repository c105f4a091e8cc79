//! Peering's series: the peer servers held, their agents and views, and the tunnels
//! forwarded each way, by server id (bounded: a peer names itself).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::registered;

/// Most distinct server ids the peer families keep a series for. A peer names itself (and a
/// server without `--server-id` draws a new id at every start), so the ids seen over a
/// server's life have no end; past this many, the rest share [`OTHER_SERVERS`].
pub const MAX_SERVER_LABELS: usize = 64;
/// The `server` label of the ids past [`MAX_SERVER_LABELS`].
pub const OTHER_SERVERS: &str = "other";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

/// The server ids given a series so far.
#[derive(Debug, Default)]
struct ServerLabels(std::sync::Mutex<std::collections::HashSet<String>>);

impl ServerLabels {
    fn label(&self, server: &str) -> ServerLabel {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let server = if known.contains(server) {
            server
        } else if known.len() < MAX_SERVER_LABELS {
            known.insert(server.to_owned());
            server
        } else {
            OTHER_SERVERS
        };
        ServerLabel {
            server: server.to_owned(),
        }
    }
}

/// Peering's series.
#[derive(Debug)]
pub struct Peering {
    /// `tunnels_forwarded{server}`: tunnels this server carried to a peer's agent.
    forwarded: Family<ServerLabel, Counter>,
    /// `peer_tunnels{server}`: tunnels peers carried to this server's agents.
    peer_tunnels: Family<ServerLabel, Counter>,
    /// The server ids those two families were given a series for.
    server_labels: ServerLabels,
    /// Peer servers this server holds a session with, to forward to their agents.
    pub peers_connected: Gauge,
    /// Agents of those peers, which tunnels may be forwarded to.
    pub peer_agents: Gauge,
    /// Bytes of identifier lines the peers' views hold, all peers together.
    pub peer_view_bytes: Gauge,
}

impl Peering {
    /// Peering's series, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Peering {
        let forwarded = registered(r, "tunnels_forwarded", "Tunnels this server forwarded to a peer server that holds their agent, by that server's id", Family::default());
        let peer_tunnels = registered(
            r,
            "peer_tunnels",
            "Tunnels peer servers forwarded to this server's agents, by the forwarding server's id",
            Family::default(),
        );
        let peers_connected = registered(
            r,
            "peers_connected",
            "Peer servers this server holds a session with, to forward tunnels to their agents",
            Gauge::default(),
        );
        let peer_agents = registered(
            r,
            "peer_agents",
            "Agents of peer servers that tunnels may be forwarded to",
            Gauge::default(),
        );
        let peer_view_bytes = registered(
            r,
            "peer_view_bytes",
            "Bytes of identifier lines held for the peers' agents, all peers together (each peer's view is bounded at 32 MiB)",
            Gauge::default(),
        );
        Peering {
            forwarded,
            peer_tunnels,
            server_labels: ServerLabels::default(),
            peers_connected,
            peer_agents,
            peer_view_bytes,
        }
    }

    /// A tunnel was forwarded to peer server `server`'s agent.
    pub fn forwarded(&self, server: &str) {
        self.forwarded
            .get_or_create(&self.server_labels.label(server))
            .inc();
    }

    /// Peer server `server` forwarded a tunnel to one of this server's agents.
    pub fn peer_tunnel(&self, server: &str) {
        self.peer_tunnels
            .get_or_create(&self.server_labels.label(server))
            .inc();
    }
}
