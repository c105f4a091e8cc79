//! Command line and environment into a validated [`Config`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bridgehead_kubeapi::args::KubeArgs;
use bridgehead_kubeapi::labels::parse_labels;
use bridgehead_kubeapi::leases::{self, LeaseSettings};
use bridgehead_proto::servers::{check_server_id, MAX_SERVER_COUNT};
use bridgehead_runtime::compat::{AnpIgnoredArgs, KlogArgs, LogSettings, Notes};
use bridgehead_runtime::duration;
use bridgehead_runtime::logging::LogFormat;
use bridgehead_runtime::memory::MemoryArgs;
use bridgehead_runtime::process_args::{ProcessArgs, Wording};
use clap::Parser;
use serde::Serialize;

use crate::process::tls_config::TlsPolicy;
use crate::routing::router::{parse_strategies, Strategy};

/// `--dial-timeout`'s default, also taken for ANP's 0.
const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// `--allowed-peers`' default: the common name of `bridgehead-certs init`'s `peer.crt`.
pub const DEFAULT_ALLOWED_PEER: &str = "bridgehead-peer";

/// bridgehead-server: HTTP CONNECT tunnels into a private network, through connected agents.
///
/// kube-apiserver (EgressSelectorConfiguration, proxyProtocol HTTPConnect), curl -p or any
/// HTTP CONNECT client connects to the frontend (mTLS TCP, or a Unix socket with --uds-name);
/// bridgehead-agents connect to the agent port with a WebSocket over TLS. Every flag can also
/// be set through the environment variable named in its help.
#[derive(Debug, Parser)]
#[command(
    name = "bridgehead-server",
    version = bridgehead_runtime::build::VERSION_AND_COMMIT,
    args_override_self = true,
    mut_args = |arg| ProcessArgs::word(arg, WORDINGS)
)]
pub struct Cli {
    /// Frontend (CONNECT) TCP port; 0 binds an ephemeral port. Ignored (must be 0 or default)
    /// with --uds-name.
    #[arg(long, env = "BRIDGEHEAD_SERVER_PORT", default_value_t = 8131)]
    pub server_port: u16,
    /// Address the frontend binds.
    #[arg(
        long,
        env = "BRIDGEHEAD_SERVER_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub server_bind_address: IpAddr,
    /// Frontend certificate (PEM), presented to kube-apiserver / curl.
    #[arg(long, env = "BRIDGEHEAD_SERVER_CERT")]
    pub server_cert: Option<PathBuf>,
    /// Frontend private key (PEM).
    #[arg(long, env = "BRIDGEHEAD_SERVER_KEY")]
    pub server_key: Option<PathBuf>,
    /// CA bundle (PEM) that client certificates of CONNECT clients must chain to. Required for
    /// the TCP frontend: clients without a valid certificate are refused.
    #[arg(long, env = "BRIDGEHEAD_SERVER_CA_CERT")]
    pub server_ca_cert: Option<PathBuf>,
    /// CONNECT clients allowed on the mTLS frontend, by their certificate's common name or a
    /// DNS SAN (comma-separated); empty: any certificate from --server-ca-cert. Name
    /// kube-apiserver's client certificate here.
    #[arg(
        long,
        env = "BRIDGEHEAD_ALLOWED_CLIENTS",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub allowed_clients: Vec<String>,
    /// Start even though --server-ca-cert and --cluster-ca-cert hold the same CA (a PKI made
    /// by an older bridgehead-certs): every agent certificate is then a valid CONNECT client
    /// certificate too. Warned about at every start; make a new PKI instead.
    #[arg(long, env = "BRIDGEHEAD_ALLOW_SHARED_CA")]
    pub allow_shared_ca: bool,
    /// Where a CONNECT that the strategies route to no agent goes instead of a 503: another
    /// HTTP CONNECT proxy, such as konnectivity's server in http-connect mode while agents are
    /// migrated (docs/migrating.md). `unix:///path` or `https://host:port`.
    #[arg(long, env = "BRIDGEHEAD_FALLBACK_PROXY", value_name = "URL")]
    pub fallback_proxy: Option<String>,
    /// CA bundle (PEM) the https:// fallback proxy's certificate must chain to.
    #[arg(long, env = "BRIDGEHEAD_FALLBACK_PROXY_CA_CERT")]
    pub fallback_proxy_ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) presented to the https:// fallback proxy.
    #[arg(long, env = "BRIDGEHEAD_FALLBACK_PROXY_CLIENT_CERT")]
    pub fallback_proxy_client_cert: Option<PathBuf>,
    /// Private key (PEM) for --fallback-proxy-client-cert.
    #[arg(long, env = "BRIDGEHEAD_FALLBACK_PROXY_CLIENT_KEY")]
    pub fallback_proxy_client_key: Option<PathBuf>,
    /// IP targets that may be relayed to --fallback-proxy, as the agent's
    /// --allowed-destinations: comma-separated `CIDR`, `CIDR:PORT`, `CIDR:LOW-HIGH`
    /// (`[IPv6/len]:PORT`); empty: any not denied.
    #[arg(
        long,
        env = "BRIDGEHEAD_FALLBACK_ALLOWED_DESTINATIONS",
        default_value = "",
        hide_default_value = true,
        value_name = "RULES"
    )]
    pub fallback_allowed_destinations: String,
    /// IP targets never relayed to --fallback-proxy (403), on top of the defaults the agent
    /// denies too: link-local and cloud metadata addresses, 0.0.0.0/8 and ::.
    #[arg(
        long,
        env = "BRIDGEHEAD_FALLBACK_DENIED_DESTINATIONS",
        default_value = "",
        hide_default_value = true,
        value_name = "RULES"
    )]
    pub fallback_denied_destinations: String,
    /// Widens the fallback's policy for a migration window: IP targets the defaults deny that
    /// may still be relayed to --fallback-proxy (what the cluster reached through konnectivity
    /// on purpose), in the same syntax; --fallback-denied-destinations still wins.
    #[arg(
        long,
        env = "BRIDGEHEAD_FALLBACK_EXEMPT_DESTINATIONS",
        default_value = "",
        hide_default_value = true,
        value_name = "RULES"
    )]
    pub fallback_exempt_destinations: String,
    /// Serve plain HTTP CONNECT on this Unix socket instead of the TCP frontend (mode 0660;
    /// a stale socket file is replaced).
    #[arg(long, env = "BRIDGEHEAD_UDS_NAME")]
    pub uds_name: Option<PathBuf>,
    /// ANP compatibility: Bridgehead always removes a stale socket file at --uds-name (nobody
    /// answers on it) and never a live one (another server answers); accepted either way.
    #[arg(
        long,
        env = "BRIDGEHEAD_DELETE_EXISTING_UDS_FILE",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub delete_existing_uds_file: Option<bool>,
    /// Port agents connect to (WebSocket over TLS); 0 binds an ephemeral port.
    #[arg(long, env = "BRIDGEHEAD_AGENT_PORT", default_value_t = 8132)]
    pub agent_port: u16,
    /// Address the agent endpoint binds.
    #[arg(long, env = "BRIDGEHEAD_AGENT_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub agent_bind_address: IpAddr,
    /// Certificate (PEM) presented to agents.
    #[arg(long, env = "BRIDGEHEAD_CLUSTER_CERT")]
    pub cluster_cert: PathBuf,
    /// Private key (PEM) for --cluster-cert.
    #[arg(long, env = "BRIDGEHEAD_CLUSTER_KEY")]
    pub cluster_key: PathBuf,
    /// CA bundle (PEM) that agent client certificates must chain to. Optional with token
    /// authentication (--agent-namespace ...): agents then present no certificate; given both,
    /// an agent must pass both.
    #[arg(long, env = "BRIDGEHEAD_CLUSTER_CA_CERT")]
    pub cluster_ca_cert: Option<PathBuf>,
    /// Token authentication of agents: the namespace of their ServiceAccount (with
    /// --agent-service-account and --authentication-audience). Tokens are checked with a
    /// TokenReview against kube-apiserver (--kubeconfig).
    #[arg(long, env = "BRIDGEHEAD_AGENT_NAMESPACE")]
    pub agent_namespace: Option<String>,
    /// Token authentication: the agents' ServiceAccount name.
    #[arg(long, env = "BRIDGEHEAD_AGENT_SERVICE_ACCOUNT")]
    pub agent_service_account: Option<String>,
    /// Token authentication: the audience agent tokens must be valid for (the projected
    /// token's `audience`).
    #[arg(long, env = "BRIDGEHEAD_AUTHENTICATION_AUDIENCE")]
    pub authentication_audience: Option<String>,
    // `--kubeconfig` and `--lease-namespace`, which the agent takes too (worded below).
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Most requests a second to kube-apiserver; 0 = 5.
    #[arg(long, env = "BRIDGEHEAD_KUBECONFIG_QPS", default_value_t = 0.0)]
    pub kubeconfig_qps: f32,
    /// Requests to kube-apiserver allowed at once above --kubeconfig-qps; 0 = 10.
    #[arg(long, env = "BRIDGEHEAD_KUBECONFIG_BURST", default_value_t = 0)]
    pub kubeconfig_burst: u32,
    /// How agent tokens are checked: `local` verifies projected ServiceAccount tokens as
    /// kube-apiserver does (its issuer's keys, the claims, and watches of the agents' pods,
    /// service account and nodes), with no API call per connection, and sends to TokenReview
    /// only what it cannot decide; `review` asks TokenReview for every new token.
    #[arg(long, env = "BRIDGEHEAD_TOKEN_VERIFICATION", default_value = "local", value_parser = ["local", "review"])]
    pub token_verification: String,
    /// How long a token review's answer is reused for the same token; 0 asks every time.
    #[arg(long, env = "BRIDGEHEAD_TOKEN_REVIEW_CACHE_TTL", default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    pub token_review_cache_ttl: Duration,
    /// Agents may announce only the host/ipv4/ipv6 identifiers that belong to them: their
    /// certificate's SANs, or the name and addresses of the node their pod-bound token names.
    /// Off by default (konnectivity has no such check); turn it on in production: without it
    /// any agent can claim another node's name and receive its kubelet traffic.
    #[arg(long, env = "BRIDGEHEAD_BIND_AGENT_IDENTIFIERS")]
    pub bind_agent_identifiers: bool,
    /// Health, readiness and metrics port (`/healthz`, `/readyz`, `/metrics`); 0 binds an
    /// ephemeral port.
    #[arg(long, env = "BRIDGEHEAD_HEALTH_PORT", default_value_t = 8092)]
    pub health_port: u16,
    /// Admin port: what an operator debugs with (`/agents`: every agent, its peer address and
    /// identifiers; `/config`); 0 binds an ephemeral port.
    #[arg(long, env = "BRIDGEHEAD_ADMIN_PORT", default_value_t = 8095)]
    pub admin_port: u16,
    /// Ordered, comma-separated routing strategies; the first that finds a usable agent wins.
    /// Valid: destHost, destCIDR, defaultRoute, default.
    #[arg(long, env = "BRIDGEHEAD_PROXY_STRATEGIES", default_value = "default")]
    pub proxy_strategies: String,
    /// This server's id, unique per replica: agents hold one session per id (logged, shown in
    /// /agents, sent in the upgrade answer) [default: $PROXY_SERVER_ID, else a random id].
    #[arg(long, env = "BRIDGEHEAD_SERVER_ID")]
    pub server_id: Option<String>,
    /// How many servers share the agents' address: agents keep looking until they hold a
    /// session with this many distinct server ids (or what Leases count, on agents counting
    /// them).
    #[arg(long, env = "BRIDGEHEAD_SERVER_COUNT", default_value_t = 1)]
    pub server_count: u32,
    /// Hold a Lease for this server in --lease-namespace (renewed every third of
    /// --lease-duration, deleted on shutdown) and delete other servers' expired Leases, so
    /// that agents running with --count-server-leases count the servers.
    #[arg(
        long,
        env = "BRIDGEHEAD_ENABLE_LEASE_CONTROLLER",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub enable_lease_controller: Option<bool>,
    /// Labels of this server's Lease (`key=value,...`); agents count the Leases that match.
    #[arg(long, env = "BRIDGEHEAD_LEASE_LABEL", default_value = leases::DEFAULT_LABEL)]
    pub lease_label: String,
    /// How long a Lease is valid without renewal: a server that vanishes stops being counted
    /// after this long.
    #[arg(long, env = "BRIDGEHEAD_LEASE_DURATION", default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    pub lease_duration: Duration,
    /// How long a CONNECT may wait for its tunnel after its head before the client gets 504:
    /// the wait for a new server's first round of peers, the agent's dial and the fallback
    /// proxy's answer, together (`--backend-dial-timeout`, ANP's name, is the same flag; 0,
    /// ANP's "no timeout", keeps the default: a dial is always bounded).
    #[arg(long, alias = "backend-dial-timeout", env = "BRIDGEHEAD_DIAL_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    pub dial_timeout: Duration,
    /// Time allowed for a client's TLS handshake and CONNECT header, and an agent's handshake.
    #[arg(long, env = "BRIDGEHEAD_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    pub handshake_timeout: Duration,
    /// Longest an agent may take for its TLS handshake and upgrade request, before it has
    /// proved who it is (its token review then has its own bound): a backstop, at least the
    /// agent's own bounds on those steps once the server answered (10s each), since a
    /// handshake whose agent keeps answering, however late, is never cut before; a stalled one
    /// is cut sooner when another agent waits (--agent-handshake-stall).
    #[arg(long, env = "BRIDGEHEAD_AGENT_HANDSHAKE_TIMEOUT", default_value = "20s", value_parser = duration::parse, value_name = "DURATION")]
    pub agent_handshake_timeout: Duration,
    /// Most CONNECT clients in their TLS handshake at once; a newer one cuts the oldest (a flood
    /// of stalled handshakes cannot take the server's descriptors, nor lock honest clients
    /// out).
    #[arg(long, env = "BRIDGEHEAD_MAX_HANDSHAKES", default_value_t = 512)]
    pub max_handshakes: usize,
    /// Most agents in their TLS handshake and upgrade at once; more wait in the listen
    /// backlog until one finishes or stalls (see --agent-handshake-stall).
    #[arg(long, env = "BRIDGEHEAD_MAX_AGENT_HANDSHAKES", default_value_t = 4096)]
    pub max_agent_handshakes: usize,
    /// An agent whose handshake has owed the server bytes this long may be cut when a newer
    /// connection needs its place; one that keeps sending is never cut for room. The least
    /// stall time: while the agents that answered lately kept the server waiting longer, it is
    /// one and a half times their 99th percentile, up to half of --agent-handshake-timeout, so a
    /// fleet of slow agents needs no tuning and silent connections never lengthen it.
    #[arg(long, env = "BRIDGEHEAD_AGENT_HANDSHAKE_STALL", default_value = "2s", value_parser = duration::parse, value_name = "DURATION")]
    pub agent_handshake_stall: Duration,
    /// Most dials waiting for an agent's answer at once; beyond it clients get 503.
    #[arg(long, env = "BRIDGEHEAD_MAX_PENDING_DIALS", default_value_t = 1024)]
    pub max_pending_dials: usize,
    /// Most agent sessions one identity (a certificate, a token's account and node) holds at
    /// once; beyond it the agent gets 429. Give each node its own credential (`bridgehead-certs
    /// agent --node`, or pod-bound tokens) and keep this low.
    #[arg(
        long,
        env = "BRIDGEHEAD_MAX_SESSIONS_PER_IDENTITY",
        default_value_t = 100
    )]
    pub max_sessions_per_identity: usize,
    /// Most dials waiting for one agent's answer; beyond it the router picks another agent or
    /// 503 (an agent that never answers holds no more than this).
    #[arg(
        long,
        env = "BRIDGEHEAD_MAX_PENDING_DIALS_PER_AGENT",
        default_value_t = 256
    )]
    pub max_pending_dials_per_agent: usize,
    /// Most dials one CONNECT client (by its certificate; all Unix-socket clients together)
    /// has waiting; beyond it that client gets 503.
    #[arg(
        long,
        env = "BRIDGEHEAD_MAX_PENDING_DIALS_PER_CLIENT",
        default_value_t = 512
    )]
    pub max_pending_dials_per_client: usize,
    /// Most tunnels one agent carries at once; beyond it the router picks another or 503.
    #[arg(
        long,
        env = "BRIDGEHEAD_MAX_TUNNELS_PER_AGENT",
        default_value_t = 10_000
    )]
    pub max_tunnels_per_agent: usize,
    /// After the 200, how long a target's first bytes wait for the client's first byte
    /// (kube-apiserver fails if anything follows the 200 in the same read); 0 sends at once.
    #[arg(long, env = "BRIDGEHEAD_TARGET_BYTES_HOLD", default_value = "250ms", value_parser = duration::parse, value_name = "DURATION")]
    pub target_bytes_hold: Duration,
    /// On SIGTERM, how long open tunnels may continue before they are cut
    /// (`--graceful-shutdown-timeout`, ANP's name, is the same flag; 0 cuts them at once).
    #[arg(long, alias = "graceful-shutdown-timeout", env = "BRIDGEHEAD_SHUTDOWN_GRACE_PERIOD", default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    pub shutdown_grace_period: Duration,
    /// TLS 1.2 cipher suites both TLS endpoints allow, Go's names, comma-separated (TLS 1.3's
    /// are always on, as in Go); empty: rustls' defaults (ECDHE with AES-GCM or ChaCha20).
    #[arg(
        long,
        env = "BRIDGEHEAD_CIPHER_SUITES",
        value_delimiter = ',',
        value_name = "SUITES"
    )]
    pub cipher_suites: Vec<String>,
    /// Lowest TLS version of both endpoints: VersionTLS12 (default) or VersionTLS13
    /// (VersionTLS10/11 are accepted and mean 1.2).
    #[arg(long, env = "BRIDGEHEAD_TLS_MIN_VERSION", value_name = "VERSION")]
    pub tls_min_version: Option<String>,
    /// TCP keepalive on CONNECT clients' connections (ANP: the gRPC frontend's keepalive):
    /// the first probe after this much silence; unset: the kernel's default (2 h).
    #[arg(long, env = "BRIDGEHEAD_FRONTEND_KEEPALIVE_TIME", value_parser = duration::parse, value_name = "DURATION")]
    pub frontend_keepalive_time: Option<Duration>,
    /// One info line per tunnel end (target, agent, bytes each way, duration, how it ended);
    /// `false` logs it at debug only. The lines' target is `bridgehead::tunnel`, so
    /// `RUST_LOG=info,bridgehead::tunnel=off` also silences them.
    #[arg(long, env = "BRIDGEHEAD_LOG_TUNNELS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub log_tunnels: Option<bool>,
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub klog: KlogArgs,
    #[command(flatten)]
    pub anp_ignored: AnpIgnoredArgs,
    /// Serve peer servers on this port, and forward CONNECTs whose agent is a peer's to that
    /// peer (docs/ha.md, "Forwarding between servers"); 0 picks a free port. Unset: no
    /// forwarding.
    #[arg(long, env = "BRIDGEHEAD_PEER_PORT")]
    pub peer_port: Option<u16>,
    /// Address the peer port binds. Peers run on other control-plane nodes, so the default
    /// is every address, as the agent port's; give the control-plane network's address in
    /// production (docs/security.md).
    #[arg(long, env = "BRIDGEHEAD_PEER_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub peer_bind_address: IpAddr,
    /// Peer servers let in on the peer port (and accepted when dialed), by their
    /// certificate's common name or a DNS SAN (comma-separated). Their certificate must also
    /// carry both `serverAuth` and `clientAuth`, and name none of --allowed-clients: a CONNECT
    /// client's certificate is never a peer's. The default is the name of bridgehead-certs
    /// init's peer.crt.
    #[arg(
        long,
        env = "BRIDGEHEAD_ALLOWED_PEERS",
        value_delimiter = ',',
        value_name = "NAMES",
        default_value = DEFAULT_ALLOWED_PEER
    )]
    pub allowed_peers: Vec<String>,
    /// The peers: a DNS name with a record per server (a headless Service), or a
    /// comma-separated list of names and addresses, each at --peer-port unless it says
    /// `host:port`. This server's own address may be among them.
    #[arg(
        long,
        env = "BRIDGEHEAD_PEER_HOST",
        value_delimiter = ',',
        value_name = "HOSTS"
    )]
    pub peer_host: Vec<String>,
    /// The CA that peers' certificates chain to, both ways (bridgehead-certs init:
    /// frontend-ca.crt). Not the cluster CA: every agent's certificate chains to that one.
    #[arg(long, env = "BRIDGEHEAD_PEER_CA_CERT")]
    pub peer_ca_cert: Option<PathBuf>,
    /// The certificate this server presents to its peers, both ways (`serverAuth` and
    /// `clientAuth`; bridgehead-certs init: peer.crt).
    #[arg(long, env = "BRIDGEHEAD_PEER_CERT")]
    pub peer_cert: Option<PathBuf>,
    #[arg(long, env = "BRIDGEHEAD_PEER_KEY")]
    pub peer_key: Option<PathBuf>,
    /// The name peers' certificates are verified for (default: the --peer-host entry dialed,
    /// or the address a peer's Lease gives).
    #[arg(long, env = "BRIDGEHEAD_PEER_SERVER_NAME")]
    pub peer_server_name: Option<String>,
    /// Where peers reach this server (`host` or `host:port`; without a port, the --peer-port
    /// it listens on), written on its Lease: with --enable-lease-controller and no
    /// --peer-host, servers find each other by their Leases.
    #[arg(
        long,
        env = "BRIDGEHEAD_PEER_ADVERTISE_ADDRESS",
        value_name = "HOST[:PORT]"
    )]
    pub peer_advertise_address: Option<String>,
    /// How often the peers' names are resolved again and missing peers dialed.
    #[arg(long, env = "BRIDGEHEAD_PEER_SYNC_INTERVAL", default_value = "1s", value_parser = duration::parse, value_name = "DURATION")]
    pub peer_sync_interval: Duration,
    /// ANP compatibility: the frontend protocol. Only http-connect is served (kube-apiserver's
    /// proxyProtocol: HTTPConnect); grpc is refused at startup.
    #[arg(long, env = "BRIDGEHEAD_MODE", default_value = "http-connect")]
    pub mode: String,
}

/// How the server words the flags it shares with the agent ([`ProcessArgs`], [`KubeArgs`]):
/// the same flags, said of the server's side.
const WORDINGS: &[Wording] = &[
    Wording::help(
        "kubeconfig",
        "kubeconfig for the server's calls to kube-apiserver (TokenReview, Nodes, Leases); \
         empty: the pod's in-cluster configuration. Its identity needs \
         `system:auth-delegator` (and `get nodes` with --bind-agent-identifiers, and Leases in \
         --lease-namespace with --enable-lease-controller)",
    ),
    Wording::help("log_format", "Log format: text or json"),
    Wording::help(
        "session_threads",
        "Threads of their own for agent sessions: each session, and every tunnel spliced over \
         it, runs on one of them (the least loaded when it connects), so a tunnel's chunks \
         never cross between cores on their way to and from its session. `auto` = one per \
         worker thread (none with a single worker); 0 = none (sessions and tunnels run on the \
         workers, as TLS handshakes and dials always do)",
    ),
    Wording::help(
        "admin_bind_address",
        "Address the admin port binds: loopback, since it shows every node's addresses",
    ),
    Wording::help(
        "keepalive_time",
        "WebSocket ping interval towards agents; an agent silent for 3 intervals is dropped",
    ),
];

/// Validated configuration, in the groups an operator thinks in. The shared [`Context`]
/// holds it once; `/config` shows it whole, as JSON, from this one derived serialisation
/// (it holds file paths, never what is in them).
///
/// [`Context`]: crate::context::Context
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub frontend: FrontendConfig,
    pub agent_endpoint: AgentEndpointConfig,
    pub routing: RoutingConfig,
    pub limits: Limits,
    pub kubernetes: KubernetesConfig,
    /// `--peer-port`: forwarding to and from peer servers, when set.
    pub peering: Option<PeeringConfig>,
    pub tls: TlsPolicy,
    /// `--tunnel-memory-budget` and the tunnels' socket buffers.
    pub memory: MemoryArgs,
    pub logging: LoggingConfig,
    pub process: ProcessConfig,
    /// Lines about accepted-and-ignored flags, logged once logging is up.
    #[serde(skip)]
    pub notes: Notes,
}

/// Where CONNECT clients come in, and how long they may take to ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrontendConfig {
    pub listener: FrontendListen,
    /// The frontend's and the agents' CA are one (allowed by `--allow-shared-ca`): warned
    /// about at startup.
    pub shared_ca: bool,
    /// `--handshake-timeout`: TLS and the CONNECT head.
    #[serde(serialize_with = "duration::serialize")]
    pub handshake_timeout: Duration,
    /// `--max-handshakes`: CONNECT clients in their handshake at once.
    pub max_handshakes: usize,
    /// `--frontend-keepalive-time`: TCP keepalive on CONNECT clients' connections.
    #[serde(serialize_with = "duration::serialize_option")]
    pub keepalive: Option<Duration>,
    /// `--target-bytes-hold`: how long a target's first bytes wait for the client's.
    #[serde(serialize_with = "duration::serialize")]
    pub target_bytes_hold: Duration,
}

/// The frontend's listener kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FrontendListen {
    /// mTLS over TCP.
    Tcp {
        bind: SocketAddr,
        cert: PathBuf,
        key: PathBuf,
        client_ca: PathBuf,
        /// `--allowed-clients`: certificate names let in (empty: all).
        allowed_clients: Vec<String>,
    },
    /// Plain HTTP CONNECT on a Unix socket.
    Unix { path: PathBuf },
}

/// Where agents connect, how they prove who they are, and how their sessions are kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentEndpointConfig {
    pub bind: SocketAddr,
    /// `--cluster-cert`, `--cluster-key`: what the server presents to agents.
    pub cert: PathBuf,
    pub key: PathBuf,
    pub auth: AgentAuthConfig,
    /// `--agent-handshake-timeout`: TLS and the upgrade, before authentication; a backstop
    /// for peers that trickle (the stall rule cuts the silent ones when room is needed).
    #[serde(serialize_with = "duration::serialize")]
    pub handshake_timeout: Duration,
    /// `--handshake-timeout`: writing the upgrade answer once the agent is let in.
    #[serde(serialize_with = "duration::serialize")]
    pub answer_timeout: Duration,
    /// `--max-agent-handshakes`: places in the handshake admission.
    pub max_handshakes: usize,
    /// `--agent-handshake-stall`: how long a handshake may owe bytes before its place is
    /// given to a waiting one, at least (the admission learns longer from a slow fleet).
    #[serde(serialize_with = "duration::serialize")]
    pub handshake_stall: Duration,
    /// `--keepalive-time`: a ping after this much silence; the session ends after three.
    #[serde(serialize_with = "duration::serialize")]
    pub keepalive_time: Duration,
}

impl AgentEndpointConfig {
    /// The agent and peer sessions' keepalive: a ping every `--keepalive-time`, the session
    /// given up after `KEEPALIVE_MISSES` of them without an answer.
    pub fn keepalive(&self) -> bridgehead_mux::Keepalive {
        bridgehead_runtime::timeouts::keepalive(self.keepalive_time)
    }
}

/// How agents authenticate: a certificate from `cluster_ca`, a token, or both.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentAuthConfig {
    pub cluster_ca: Option<PathBuf>,
    pub token: Option<TokenConfig>,
    pub bind_identifiers: bool,
}

/// Token authentication of agents.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenConfig {
    pub namespace: String,
    pub service_account: String,
    pub audience: String,
    #[serde(serialize_with = "duration::serialize")]
    pub cache_ttl: Duration,
    /// `--token-verification=local`: verified here first, TokenReview as the fallback.
    pub local: bool,
}

/// Forwarding between servers: where peers connect, which peers to dial, their TLS.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeeringConfig {
    pub bind: SocketAddr,
    /// `--peer-host`: names or addresses, with or without a port.
    pub hosts: Vec<String>,
    /// The port of a `--peer-host` entry that names none: `--peer-port` (the port bound, when
    /// 0 picked one).
    pub port: u16,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server_name: Option<String>,
    #[serde(serialize_with = "duration::serialize")]
    pub sync_interval: Duration,
    /// `--peer-advertise-address`, written on this server's Lease.
    pub advertise: Option<String>,
    /// No `--peer-host`: the peers are the addresses on the other servers' Leases.
    pub from_leases: bool,
    /// `--allowed-peers`: the names a peer's certificate must carry one of.
    pub allowed: Vec<String>,
    /// `--allowed-clients`: names a peer's certificate must carry none of.
    pub clients: Vec<String>,
}

/// Which agent a CONNECT goes to, and where it goes when none matches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutingConfig {
    #[serde(serialize_with = "strategy_names")]
    pub strategies: Vec<Strategy>,
    pub server_id: String,
    /// How many servers agents are told there are.
    pub server_count: u32,
    /// `--dial-timeout`: how long a CONNECT waits for its tunnel: the first round of peers,
    /// the agent's dial and the fallback's answer, together (`crate::routing::open`).
    #[serde(serialize_with = "duration::serialize")]
    pub dial_timeout: Duration,
    /// `--fallback-proxy`: where CONNECTs with no agent go.
    pub fallback: Option<crate::routing::fallback::FallbackConfig>,
    /// What may be relayed there.
    pub fallback_destinations: crate::routing::fallback::FallbackDestinations,
}

/// The bounds on dials, tunnels and sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub max_pending_dials: usize,
    pub max_pending_dials_per_agent: usize,
    pub max_pending_dials_per_client: usize,
    pub max_tunnels_per_agent: usize,
    pub max_sessions_per_identity: usize,
}

/// The server's Kubernetes client and the Lease it holds.
#[derive(Debug, Clone, Serialize)]
pub struct KubernetesConfig {
    pub client: KubeClientConfig,
    #[serde(serialize_with = "lease_settings")]
    pub leases: Option<LeaseSettings>,
}

/// The server's Kubernetes client: `--kubeconfig` (in-cluster when `None`), pacing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KubeClientConfig {
    pub kubeconfig: Option<PathBuf>,
    pub qps: f32,
    pub burst: u32,
}

/// Where log lines go, and which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoggingConfig {
    pub format: LogFormat,
    pub settings: LogSettings,
    /// `--log-tunnels`: an info line per tunnel end.
    pub tunnels: bool,
}

/// The process: its other listeners, threads and shutdown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessConfig {
    pub health_bind: SocketAddr,
    pub admin_bind: SocketAddr,
    pub worker_threads: usize,
    pub session_threads: usize,
    /// `--shutdown-grace-period`: how long open tunnels get to finish.
    #[serde(serialize_with = "duration::serialize")]
    pub grace_period: Duration,
}

fn strategy_names<S: serde::Serializer>(strategies: &[Strategy], to: S) -> Result<S::Ok, S::Error> {
    to.collect_seq(strategies.iter().map(ToString::to_string))
}

fn lease_settings<S: serde::Serializer>(
    leases: &Option<LeaseSettings>,
    to: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Shown<'a> {
        namespace: &'a str,
        labels: &'a std::collections::BTreeMap<String, String>,
        duration: String,
    }
    let shown = leases.as_ref().map(|leases| Shown {
        namespace: &leases.namespace,
        labels: &leases.labels,
        duration: duration::format(leases.duration),
    });
    shown.serialize(to)
}

impl Config {
    /// Every certificate file in use, named for the expiry metric.
    pub fn certificate_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        if let FrontendListen::Tcp {
            cert, client_ca, ..
        } = &self.frontend.listener
        {
            files.push(("frontend", cert.clone()));
            files.push(("frontend-client-ca", client_ca.clone()));
        }
        files.push(("agent-endpoint", self.agent_endpoint.cert.clone()));
        if let Some(cluster_ca) = &self.agent_endpoint.auth.cluster_ca {
            files.push(("agent-client-ca", cluster_ca.clone()));
        }
        if let Some(peering) = &self.peering {
            files.push(("peer", peering.cert.clone()));
            files.push(("peer-ca", peering.ca.clone()));
        }
        files
    }

    /// The effective configuration as `/config` shows it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|error| format!("{error}"))
    }
}

impl Cli {
    /// Checks every flag and gathers them into groups; every error names its flag in one
    /// line, and every flag error comes before a file is read.
    pub fn validate(mut self) -> anyhow::Result<Config> {
        let mut notes = Notes::default();
        let log = self
            .klog
            .settings("bridgehead-server", &mut notes)
            .map_err(anyhow::Error::msg)?;
        self.anp_ignored.notes(&mut notes);
        let tls = TlsPolicy::from_flags(
            &self.cipher_suites,
            self.tls_min_version.as_deref(),
            &mut notes.0,
        )
        .map_err(anyhow::Error::msg)?;
        if self.mode != "http-connect" {
            bail!(
                "--mode {:?} is not supported: Bridgehead serves http-connect only (kube-apiserver's proxyProtocol: HTTPConnect)",
                self.mode
            );
        }
        let limits = self.limits()?;
        let routing = self.routing(&mut notes)?;
        let leases = self.leases(&routing.server_id)?;
        let mut frontend = self.frontend()?;
        let agent_endpoint = self.agent_endpoint()?;
        let clients = match &frontend.listener {
            FrontendListen::Tcp {
                allowed_clients, ..
            } => allowed_clients.clone(),
            FrontendListen::Unix { .. } => Vec::new(),
        };
        let peering = self.peering(leases.is_some(), &clients)?;
        // Files last: every flag error is reported before a file is read.
        frontend.shared_ca = match (&frontend.listener, &agent_endpoint.auth.cluster_ca) {
            (FrontendListen::Tcp { client_ca, .. }, Some(cluster_ca)) => {
                shares_a_ca(client_ca, cluster_ca)?
            }
            _ => false,
        };
        if frontend.shared_ca && !self.allow_shared_ca {
            bail!("--server-ca-cert and --cluster-ca-cert hold the same CA, so every agent certificate would open CONNECT tunnels: make a two-CA PKI with bridgehead-certs init (frontend-ca.crt, cluster-ca.crt), or pass --allow-shared-ca until you have rolled it out");
        }
        if let (Some(peering), Some(cluster_ca)) = (&peering, &agent_endpoint.auth.cluster_ca) {
            if shares_a_ca(&peering.ca, cluster_ca)? {
                bail!("--peer-ca-cert and --cluster-ca-cert hold the same CA, so every agent certificate would be a peer's and could open tunnels to every node: give the CA the frontend's clients chain to (bridgehead-certs init: frontend-ca.crt, peer.crt)");
            }
        }
        Ok(Config {
            frontend,
            agent_endpoint,
            routing,
            limits,
            kubernetes: KubernetesConfig {
                client: KubeClientConfig {
                    kubeconfig: self.kube.kubeconfig(),
                    qps: self.kubeconfig_qps,
                    burst: self.kubeconfig_burst,
                },
                leases,
            },
            peering,
            tls,
            memory: self.memory,
            logging: LoggingConfig {
                format: self.process.log_format,
                settings: log,
                tunnels: self.log_tunnels.unwrap_or(true),
            },
            process: ProcessConfig {
                health_bind: (self.process.health_bind_address, self.health_port).into(),
                admin_bind: (self.process.admin_bind_address, self.admin_port).into(),
                worker_threads: self.process.worker_threads,
                session_threads: self
                    .process
                    .session_threads
                    .count(self.process.worker_threads),
                grace_period: self.shutdown_grace_period,
            },
            notes,
        })
    }

    fn frontend(&mut self) -> anyhow::Result<FrontendConfig> {
        let listener = match self.uds_name.take() {
            Some(path) => {
                if self.server_port != 0 && self.server_port != 8131 {
                    bail!("--uds-name turns the TCP frontend off; pass --server-port=0 or leave it out");
                }
                FrontendListen::Unix { path }
            }
            None => {
                let (Some(cert), Some(key)) = (self.server_cert.take(), self.server_key.take())
                else {
                    bail!(
                        "the TCP frontend needs --server-cert and --server-key (or use --uds-name)"
                    );
                };
                let Some(client_ca) = self.server_ca_cert.take() else {
                    bail!("the TCP frontend needs --server-ca-cert: CONNECT clients must present a certificate");
                };
                FrontendListen::Tcp {
                    bind: (self.server_bind_address, self.server_port).into(),
                    cert,
                    key,
                    client_ca,
                    allowed_clients: self
                        .allowed_clients
                        .iter()
                        .map(|name| name.trim().to_owned())
                        .filter(|name| !name.is_empty())
                        .collect(),
                }
            }
        };
        Ok(FrontendConfig {
            listener,
            shared_ca: false,
            handshake_timeout: self.handshake_timeout,
            max_handshakes: self.max_handshakes,
            keepalive: self.frontend_keepalive_time.filter(|d| !d.is_zero()),
            target_bytes_hold: self.target_bytes_hold,
        })
    }

    fn agent_endpoint(&mut self) -> anyhow::Result<AgentEndpointConfig> {
        let token = match (
            self.agent_namespace.take(),
            self.agent_service_account.take(),
            self.authentication_audience.take(),
        ) {
            (None, None, None) => None,
            (Some(namespace), Some(service_account), Some(audience)) => Some(TokenConfig {
                namespace,
                service_account,
                audience,
                cache_ttl: self.token_review_cache_ttl,
                local: self.token_verification == "local",
            }),
            _ => bail!("token authentication needs all of --agent-namespace, --agent-service-account and --authentication-audience"),
        };
        if token.is_none() && self.cluster_ca_cert.is_none() {
            bail!("agents must authenticate: give --cluster-ca-cert, or token authentication with --agent-namespace, --agent-service-account and --authentication-audience");
        }
        if self.process.keepalive_time.is_zero() {
            bail!("--keepalive-time must be above 0");
        }
        Ok(AgentEndpointConfig {
            bind: (self.agent_bind_address, self.agent_port).into(),
            cert: self.cluster_cert.clone(),
            key: self.cluster_key.clone(),
            auth: AgentAuthConfig {
                cluster_ca: self.cluster_ca_cert.take(),
                token,
                bind_identifiers: self.bind_agent_identifiers,
            },
            handshake_timeout: self.agent_handshake_timeout,
            answer_timeout: self.handshake_timeout,
            max_handshakes: self.max_agent_handshakes,
            handshake_stall: self.agent_handshake_stall,
            keepalive_time: self.process.keepalive_time,
        })
    }

    /// `clients`: the frontend's `--allowed-clients`, which no peer may carry.
    fn peering(
        &mut self,
        leases: bool,
        clients: &[String],
    ) -> anyhow::Result<Option<PeeringConfig>> {
        let Some(port) = self.peer_port else {
            if !self.peer_host.is_empty() || self.peer_advertise_address.is_some() {
                bail!("--peer-host and --peer-advertise-address need --peer-port: the port peers connect to");
            }
            return Ok(None);
        };
        if let Some(address) = &self.peer_advertise_address {
            let (host, _) = bridgehead_runtime::addresses::split_port(address, port);
            if host.is_empty() || host.contains(['/', ' ']) {
                bail!("--peer-advertise-address {address:?}: give host or host:port, where peers reach this server's --peer-port");
            }
        }
        let (Some(ca), Some(cert), Some(key)) = (
            self.peer_ca_cert.take(),
            self.peer_cert.take(),
            self.peer_key.take(),
        ) else {
            bail!("--peer-port needs --peer-ca-cert, --peer-cert and --peer-key: peers authenticate each other with mutual TLS");
        };
        if self.peer_sync_interval.is_zero() {
            bail!("--peer-sync-interval must be above 0");
        }
        let hosts: Vec<String> = self
            .peer_host
            .iter()
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .collect();
        let from_leases = hosts.is_empty();
        if from_leases && !(leases && self.peer_advertise_address.is_some()) {
            bail!("--peer-port needs its peers: --peer-host (a DNS name or a list), or --enable-lease-controller with --peer-advertise-address on every server (peers found by their Leases)");
        }
        let allowed: Vec<String> = self
            .allowed_peers
            .iter()
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .collect();
        if allowed.is_empty() {
            bail!("--allowed-peers is empty: name the peer certificate (bridgehead-certs init: {DEFAULT_ALLOWED_PEER})");
        }
        if let Some(name) = allowed
            .iter()
            .find(|name| clients.iter().any(|c| c.eq_ignore_ascii_case(name)))
        {
            bail!("--allowed-peers and --allowed-clients both name {name:?}: a CONNECT client's certificate is never a peer's; give peers a certificate of their own (bridgehead-certs init: peer.crt)");
        }
        Ok(Some(PeeringConfig {
            bind: (self.peer_bind_address, port).into(),
            hosts,
            port,
            ca,
            cert,
            key,
            server_name: self.peer_server_name.take(),
            sync_interval: self.peer_sync_interval,
            advertise: self.peer_advertise_address.take(),
            from_leases,
            allowed,
            clients: clients.to_vec(),
        }))
    }

    fn routing(&mut self, notes: &mut Notes) -> anyhow::Result<RoutingConfig> {
        let dial_timeout = if self.dial_timeout.is_zero() {
            notes.0.push(format!(
                "--dial-timeout/--backend-dial-timeout 0 (ANP: no timeout): dials stay bounded by the default, {DEFAULT_DIAL_TIMEOUT:?}"
            ));
            DEFAULT_DIAL_TIMEOUT
        } else {
            self.dial_timeout
        };
        let fallback_destinations = self.fallback_destinations()?;
        let fallback = self.fallback(&fallback_destinations)?;
        let strategies = parse_strategies(&self.proxy_strategies).context("--proxy-strategies")?;
        let server_id = match self.server_id.take() {
            Some(id) => id,
            None => std::env::var("PROXY_SERVER_ID")
                .ok()
                .filter(|id| !id.is_empty())
                .unwrap_or_else(random_server_id),
        };
        check_server_id(&server_id).context("--server-id")?;
        if !(1..=MAX_SERVER_COUNT).contains(&self.server_count) {
            bail!("--server-count must be from 1 to {MAX_SERVER_COUNT}");
        }
        Ok(RoutingConfig {
            strategies,
            server_id,
            server_count: self.server_count,
            dial_timeout,
            fallback,
            fallback_destinations,
        })
    }

    fn fallback_destinations(
        &self,
    ) -> anyhow::Result<crate::routing::fallback::FallbackDestinations> {
        use bridgehead_runtime::destinations::parse_rules;
        Ok(crate::routing::fallback::FallbackDestinations {
            allowed: parse_rules(&self.fallback_allowed_destinations)
                .context("--fallback-allowed-destinations")?,
            denied: parse_rules(&self.fallback_denied_destinations)
                .context("--fallback-denied-destinations")?,
            exempt: parse_rules(&self.fallback_exempt_destinations)
                .context("--fallback-exempt-destinations")?,
        })
    }

    fn fallback(
        &mut self,
        destinations: &crate::routing::fallback::FallbackDestinations,
    ) -> anyhow::Result<Option<crate::routing::fallback::FallbackConfig>> {
        let Some(url) = self.fallback_proxy.as_deref().filter(|url| !url.is_empty()) else {
            if self.fallback_proxy_ca_cert.is_some()
                || self.fallback_proxy_client_cert.is_some()
                || self.fallback_proxy_client_key.is_some()
            {
                bail!("--fallback-proxy-ca-cert/-client-cert/-client-key need --fallback-proxy");
            }
            if *destinations != crate::routing::fallback::FallbackDestinations::default() {
                bail!("--fallback-allowed/-denied/-exempt-destinations need --fallback-proxy");
            }
            return Ok(None);
        };
        let config = crate::routing::fallback::FallbackConfig::parse(
            url,
            self.fallback_proxy_ca_cert.take(),
            self.fallback_proxy_client_cert.take(),
            self.fallback_proxy_client_key.take(),
        )?;
        // Its files load now, or the server does not start.
        crate::routing::fallback::Fallback::new(config.clone(), destinations)
            .map_err(|error| anyhow::anyhow!("--fallback-proxy: {error:#}"))?;
        Ok(Some(config))
    }

    fn leases(&self, server_id: &str) -> anyhow::Result<Option<LeaseSettings>> {
        if !self.enable_lease_controller.unwrap_or(false) {
            return Ok(None);
        }
        leases::lease_name(server_id).map_err(anyhow::Error::msg)?;
        if self.lease_duration < Duration::from_secs(3) {
            bail!("--lease-duration must be at least 3s (it is renewed every third)");
        }
        let namespace = self.kube.lease_namespace().map_err(anyhow::Error::msg)?;
        let labels =
            parse_labels(&self.lease_label).map_err(|e| anyhow::anyhow!("--lease-label: {e}"))?;
        if labels.is_empty() {
            bail!(
                "--lease-label is empty: agents could not tell this server's Lease from any other"
            );
        }
        Ok(Some(LeaseSettings {
            namespace,
            labels,
            duration: self.lease_duration,
            annotations: Default::default(),
        }))
    }

    fn limits(&self) -> anyhow::Result<Limits> {
        if self.max_pending_dials == 0
            || self.max_tunnels_per_agent == 0
            || self.max_sessions_per_identity == 0
            || self.max_pending_dials_per_agent == 0
            || self.max_pending_dials_per_client == 0
            || self.max_handshakes == 0
            || self.max_agent_handshakes == 0
        {
            bail!("--max-pending-dials(-per-agent, -per-client), --max-tunnels-per-agent and --max-sessions-per-identity must be at least 1");
        }
        Ok(Limits {
            max_pending_dials: self.max_pending_dials,
            max_pending_dials_per_agent: self.max_pending_dials_per_agent,
            max_pending_dials_per_client: self.max_pending_dials_per_client,
            max_tunnels_per_agent: self.max_tunnels_per_agent,
            max_sessions_per_identity: self.max_sessions_per_identity,
        })
    }
}

fn shares_a_ca(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<bool> {
    let certs = |path: &std::path::Path| {
        bridgehead_runtime::tls::load_certs(path).with_context(|| path.display().to_string())
    };
    let (a, b) = (certs(a)?, certs(b)?);
    Ok(a.iter().any(|cert| b.contains(cert)))
}

/// A random id in the shape of a UUID (version 4), as ANP's default: unique per process, so a
/// restarted server is a new server to its agents.
fn random_server_id() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-CA PKI on disk, made once: validation reads the CA bundles.
    fn pki() -> &'static std::path::Path {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            bridgehead_certs::Pki::generate(&[])
                .unwrap()
                .write_dir(dir.path(), true)
                .unwrap();
            dir
        })
        .path()
    }

    fn file(name: &str) -> String {
        pki().join(name).display().to_string()
    }

    fn validate(extra: &[&str]) -> anyhow::Result<Config> {
        let cluster_ca = format!("--cluster-ca-cert={}", file("cluster-ca.crt"));
        let mut args = vec![
            "bridgehead-server",
            "--cluster-cert=c.crt",
            "--cluster-key=c.key",
            &cluster_ca,
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)?.validate()
    }

    fn tcp() -> [String; 3] {
        [
            "--server-cert=s.crt".to_owned(),
            "--server-key=s.key".to_owned(),
            format!("--server-ca-cert={}", file("frontend-ca.crt")),
        ]
    }

    #[test]
    fn a_fallback_proxy_is_checked_at_startup() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let with = |extra: &[&str]| validate(&[&tcp[..], extra].concat());
        let config = with(&["--fallback-proxy=unix:///run/konnectivity.sock"]).unwrap();
        assert_eq!(
            config.routing.fallback,
            Some(crate::routing::fallback::FallbackConfig::Unix(
                "/run/konnectivity.sock".into()
            ))
        );
        let ca = format!("--fallback-proxy-ca-cert={}", file("frontend-ca.crt"));
        let cert = format!("--fallback-proxy-client-cert={}", file("client.crt"));
        let key = format!("--fallback-proxy-client-key={}", file("client.key"));
        let config = with(&["--fallback-proxy=https://10.0.0.1:8131", &ca, &cert, &key]).unwrap();
        assert!(matches!(
            config.routing.fallback,
            Some(crate::routing::fallback::FallbackConfig::Https { .. })
        ));
        for (extra, says) in [
            (
                vec!["--fallback-proxy=http://x:1"],
                "expected unix:///path or https://host:port",
            ),
            (
                vec!["--fallback-proxy=https://x:1"],
                "needs --fallback-proxy-ca-cert",
            ),
            (
                vec![
                    "--fallback-proxy=https://x:1",
                    "--fallback-proxy-ca-cert=/nonexistent.crt",
                ],
                "loading --fallback-proxy-ca-cert",
            ),
            (vec![&ca], "need --fallback-proxy"),
            (
                vec!["--fallback-exempt-destinations=169.254.169.254:80"],
                "need --fallback-proxy",
            ),
            (
                vec![
                    "--fallback-proxy=unix:///s",
                    "--fallback-denied-destinations=10.0.0.0/33",
                ],
                "--fallback-denied-destinations: bad destination rule",
            ),
        ] {
            let error = format!("{:#}", with(&extra).unwrap_err());
            assert!(error.contains(says), "{extra:?}: {error}");
            assert!(!error.contains('\n'), "one line: {error}");
        }
    }

    #[test]
    fn the_fallbacks_destination_rules_parse_and_show_in_config() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let config = validate(
            &[
                &tcp[..],
                &[
                    "--fallback-proxy=unix:///run/konnectivity.sock",
                    "--fallback-allowed-destinations=10.0.0.0/8",
                    "--fallback-denied-destinations=127.0.0.0/8,[::1/128]",
                    "--fallback-exempt-destinations=169.254.169.254:80",
                ],
            ]
            .concat(),
        )
        .unwrap();
        let shown = serde_json::to_value(&config.routing.fallback_destinations).unwrap();
        assert_eq!(
            shown,
            serde_json::json!({
                "allowed": ["10.0.0.0/8"],
                "denied": ["127.0.0.0/8", "::1/128"],
                "exempt": ["169.254.169.254/32:80"],
            })
        );
        let defaults = validate(&tcp).unwrap().routing.fallback_destinations;
        assert_eq!(
            defaults,
            crate::routing::fallback::FallbackDestinations::default()
        );
    }

    /// As Go's pflag: a flag given twice takes its last value (chart and kubeadm extraArgs
    /// append overrides).
    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let repeated = [&tcp[..], &["--dial-timeout=1s", "--dial-timeout", "2s"]].concat();
        assert_eq!(
            validate(&repeated).unwrap().routing.dial_timeout,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn one_ca_for_both_ends_needs_allow_shared_ca() {
        let shared = format!("--server-ca-cert={}", file("cluster-ca.crt"));
        let args = ["--server-cert=s.crt", "--server-key=s.key", shared.as_str()];
        let error = format!("{:#}", validate(&args).unwrap_err());
        assert!(
            error.contains("same CA") && error.contains("--allow-shared-ca"),
            "{error}"
        );
        let config = validate(&[&args[..], &["--allow-shared-ca"]].concat()).unwrap();
        assert!(config.frontend.shared_ca);
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        assert!(!validate(&tcp).unwrap().frontend.shared_ca);
    }

    /// Peers are let in by name (`--allowed-peers`, bridgehead-certs' peer.crt by default),
    /// and a name of `--allowed-clients` is never a peer's.
    #[test]
    fn allowed_peers() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let ca = format!("--peer-ca-cert={}", file("frontend-ca.crt"));
        let peering = [
            "--peer-port=0",
            "--peer-host=127.0.0.1",
            &ca,
            "--peer-cert=p.crt",
            "--peer-key=p.key",
        ];
        let with = |extra: &[&str]| validate(&[&tcp[..], &peering[..], extra].concat());
        let config = with(&["--allowed-clients=kube-apiserver"]).unwrap();
        let peering_config = config.peering.unwrap();
        assert_eq!(peering_config.allowed, [DEFAULT_ALLOWED_PEER]);
        assert_eq!(peering_config.clients, ["kube-apiserver"]);
        assert_eq!(
            peering_config.bind,
            SocketAddr::from(([0, 0, 0, 0], 0)),
            "the documented default"
        );
        let config = with(&["--allowed-peers=cp-1, cp-2", "--peer-bind-address=10.0.0.1"]).unwrap();
        let peering_config = config.peering.unwrap();
        assert_eq!(peering_config.allowed, ["cp-1", "cp-2"]);
        assert_eq!(peering_config.bind.ip(), IpAddr::from([10, 0, 0, 1]));
        for (extra, says) in [
            (
                &["--allowed-clients=a,Bridgehead-Peer"][..],
                "a CONNECT client's certificate is never a peer's",
            ),
            (&["--allowed-peers= "], "--allowed-peers is empty"),
        ] {
            let error = format!("{:#}", with(extra).unwrap_err());
            assert!(error.contains(says), "{extra:?}: {error}");
        }
    }

    /// Unset, each process draws its own id (a restarted server is a new server to agents),
    /// in UUID form; an id given is kept.
    #[test]
    fn server_ids() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let (a, b) = (validate(&tcp).unwrap(), validate(&tcp).unwrap());
        assert_ne!(a.routing.server_id, b.routing.server_id);
        let shape: Vec<usize> = a.routing.server_id.split('-').map(str::len).collect();
        assert_eq!(shape, [8, 4, 4, 4, 12], "{}", a.routing.server_id);
        assert_eq!(
            a.routing.server_id.as_bytes()[14],
            b'4',
            "{}",
            a.routing.server_id
        );
        let given = validate(&[&tcp[..], &["--server-id=cp-1"]].concat()).unwrap();
        assert_eq!(given.routing.server_id, "cp-1");
    }

    #[test]
    fn lease_settings() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        assert!(validate(&tcp).unwrap().kubernetes.leases.is_none());
        let with = |extra: &[&str]| validate(&[&tcp[..], &["--server-id=cp-1"], extra].concat());
        // ANP's defaults.
        let leases = with(&["--enable-lease-controller"])
            .unwrap()
            .kubernetes
            .leases
            .unwrap();
        assert_eq!(leases.namespace, "kube-system");
        assert_eq!(
            leases.labels.into_iter().collect::<Vec<_>>(),
            [("k8s-app".to_owned(), "konnectivity-server".to_owned())]
        );
        assert_eq!(leases.duration, Duration::from_secs(30));
        let leases = with(&[
            "--enable-lease-controller=true",
            "--lease-namespace=bh",
            "--lease-label=app=bh,tier=cp",
            "--lease-duration=6s",
        ])
        .unwrap()
        .kubernetes
        .leases
        .unwrap();
        assert_eq!((leases.namespace.as_str(), leases.labels.len()), ("bh", 2));
        assert_eq!(leases.duration, Duration::from_secs(6));
        assert!(with(&["--enable-lease-controller=false"])
            .unwrap()
            .kubernetes
            .leases
            .is_none());
        for (args, want) in [
            (&["--lease-label=no-equals"][..], "--lease-label"),
            (&["--lease-label="], "--lease-label is empty"),
            (&["--lease-duration=1s"], "at least 3s"),
            (&["--lease-namespace= "], "--lease-namespace is empty"),
            (&["--server-id=CP_1"], "--server-id takes lower-case"),
        ] {
            let error = with(&[&["--enable-lease-controller"], args].concat()).unwrap_err();
            assert!(format!("{error:#}").contains(want), "{args:?}: {error:#}");
        }
    }

    #[test]
    fn valid_configurations() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let config = validate(&tcp).unwrap();
        assert_eq!(config.routing.strategies, vec![Strategy::Default]);
        assert_eq!(config.routing.dial_timeout, Duration::from_secs(10));
        assert!(
            matches!(config.frontend.listener, FrontendListen::Tcp { bind, .. } if bind.port() == 8131)
        );
        // ANP's spelling for a Unix-socket frontend: --server-port=0 alongside --uds-name.
        let config = validate(&["--uds-name=/run/b.sock", "--server-port=0"]).unwrap();
        assert_eq!(
            config.frontend.listener,
            FrontendListen::Unix {
                path: "/run/b.sock".into()
            }
        );
        let config = validate(
            &[
                &tcp[..],
                &["--proxy-strategies=destHost,", "--dial-timeout=1m30s"],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(config.routing.strategies, vec![Strategy::DestHost]);
        assert_eq!(config.routing.dial_timeout, Duration::from_secs(90));
    }

    #[test]
    fn invalid_configurations_name_the_problem() {
        let tcp = tcp();
        let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
        let cases: &[(&[&str], &str)] = &[
            (&[], "--server-cert"),
            (
                &["--server-cert=s.crt", "--server-key=s.key"],
                "--server-ca-cert",
            ),
            (
                &["--uds-name=/run/b.sock", "--server-port=9000"],
                "--uds-name",
            ),
            (
                &[&tcp[..], &["--proxy-strategies=destHost,nearest"]].concat(),
                "destHost, destCIDR, defaultRoute, default",
            ),
            (
                &[&tcp[..], &["--dial-timeout=10"]].concat(),
                "--dial-timeout",
            ),
            (&[&tcp[..], &["--mode=grpc"]].concat(), "http-connect"),
            (&[&tcp[..], &["--log-format=xml"]].concat(), "text, json"),
            (
                &[&tcp[..], &["--keepalive-time=0s"]].concat(),
                "--keepalive-time",
            ),
            (
                &[&tcp[..], &["--server-id=cp 1"]].concat(),
                "--server-id: server id \"cp 1\" holds ' '",
            ),
            (
                &[&tcp[..], &["--server-count=0"]].concat(),
                "--server-count",
            ),
        ];
        for (args, expected) in cases {
            let error = format!("{:#}", validate(args).unwrap_err());
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
