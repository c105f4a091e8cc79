//! The command line ([`Cli`]) and the validated [`Config`] the agent runs with.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bridgehead_kubeapi::args::KubeArgs;
use bridgehead_kubeapi::labels::check_selector;
use bridgehead_kubeapi::leases::DEFAULT_LABEL;
use bridgehead_mux::Keepalive;
use bridgehead_proto::host::{strip_brackets, HostPort};
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_runtime::compat::{AnpIgnoredArgs, KlogArgs, LogSettings, Notes};
use bridgehead_runtime::duration;
use bridgehead_runtime::logging::LogFormat;
use bridgehead_runtime::memory::MemoryArgs;
use bridgehead_runtime::process_args::{ProcessArgs, Wording};
use clap::builder::PossibleValuesParser;
use clap::Parser;
use rustls_pki_types::ServerName;
use serde::Serialize;

pub use crate::tls::ClientCert;

use bridgehead_runtime::destinations::{parse_rules, Policy, Rule, RuleFlags};

/// bridgehead-agent: keeps a WebSocket tunnel to bridgehead-server and dials the targets the
/// server asks for.
///
/// Every flag can also be set from the environment variable `BRIDGEHEAD_<FLAG>` (upper snake
/// case, e.g. `BRIDGEHEAD_AGENT_IDENTIFIERS`). Durations are written as `10s`, `500ms`, `1m30s`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bridgehead-agent",
    version = bridgehead_runtime::build::VERSION_AND_COMMIT,
    args_override_self = true,
    mut_args = |arg| ProcessArgs::word(arg, WORDINGS)
)]
pub struct Cli {
    /// Host name or IP address of bridgehead-server's agent endpoint: one address (a load
    /// balancer), a DNS name with an A/AAAA record per server (a headless Service), or several
    /// comma-separated, each at --proxy-server-port unless it says `host:port`; the agent
    /// keeps a session with every server it finds (docs/ha.md).
    #[arg(
        long,
        env = "BRIDGEHEAD_PROXY_SERVER_HOST",
        default_value = "127.0.0.1",
        value_name = "HOST"
    )]
    pub proxy_server_host: String,

    /// Port of bridgehead-server's agent endpoint.
    #[arg(
        long,
        env = "BRIDGEHEAD_PROXY_SERVER_PORT",
        default_value_t = 8132,
        value_name = "PORT"
    )]
    pub proxy_server_port: u16,

    /// PEM file with the CA that signed the server's cluster (agent endpoint) certificate.
    #[arg(long, env = "BRIDGEHEAD_CA_CERT", value_name = "FILE")]
    pub ca_cert: PathBuf,

    /// PEM client certificate presented to the server (give --agent-key too).
    #[arg(long, env = "BRIDGEHEAD_AGENT_CERT", value_name = "FILE")]
    pub agent_cert: Option<PathBuf>,

    /// PEM private key of --agent-cert.
    #[arg(long, env = "BRIDGEHEAD_AGENT_KEY", value_name = "FILE")]
    pub agent_key: Option<PathBuf>,

    /// This agent's unique name (or give `id=` in --agent-identifiers) [default: the host name,
    /// else a random id].
    #[arg(long, env = "BRIDGEHEAD_AGENT_ID", value_name = "ID")]
    pub agent_id: Option<String>,

    /// What this agent can reach, in query syntax, keys repeatable:
    /// `host=node1&ipv4=10.0.0.5&ipv6=fd00::5&cidr=10.244.1.0/24&default-route=true`.
    #[arg(
        long,
        env = "BRIDGEHEAD_AGENT_IDENTIFIERS",
        default_value = "",
        hide_default_value = true,
        value_name = "QUERY"
    )]
    pub agent_identifiers: String,

    /// File holding a bearer token sent as `Authorization: Bearer <token>` when connecting;
    /// re-read on every connect.
    #[arg(
        long,
        env = "BRIDGEHEAD_SERVICE_ACCOUNT_TOKEN_PATH",
        value_name = "FILE"
    )]
    pub service_account_token_path: Option<PathBuf>,

    /// Port of the health server (/healthz, /readyz, /metrics); 0 picks a free port.
    #[arg(
        long,
        env = "BRIDGEHEAD_HEALTH_SERVER_PORT",
        default_value_t = 8093,
        value_name = "PORT"
    )]
    pub health_server_port: u16,

    /// Admin port: what an operator debugs with (`/status`: the session, open tunnels;
    /// `/config`); 0 picks a free port.
    #[arg(
        long,
        env = "BRIDGEHEAD_ADMIN_SERVER_PORT",
        default_value_t = 8094,
        value_name = "PORT"
    )]
    pub admin_server_port: u16,

    /// How often the agent looks for servers it lacks; after a failed attempt the delay grows
    /// ×1.5 up to --sync-interval-cap.
    #[arg(
        long,
        env = "BRIDGEHEAD_SYNC_INTERVAL",
        default_value = "1s",
        value_parser = duration::parse,
        value_name = "DURATION"
    )]
    pub sync_interval: Duration,

    /// Longest delay between attempts to reach a server.
    #[arg(
        long,
        env = "BRIDGEHEAD_SYNC_INTERVAL_CAP",
        default_value = "10s",
        value_parser = duration::parse,
        value_name = "DURATION"
    )]
    pub sync_interval_cap: Duration,

    /// Keep probing the address every --sync-interval after holding a session with as many
    /// servers as the count says (finds servers added without a count change).
    #[arg(
        long,
        env = "BRIDGEHEAD_SYNC_FOREVER",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub sync_forever: Option<bool>,
    /// Hold sessions with at most this many servers (0: every server counted). With servers
    /// that forward to each other (their --peer-port), one or two per agent reach it from
    /// every server at a fraction of the sessions (docs/ha.md).
    #[arg(long, env = "BRIDGEHEAD_MAX_SERVER_SESSIONS", default_value_t = 0)]
    pub max_server_sessions: usize,

    /// On SIGTERM/SIGINT, how long open tunnels may take to finish before they are cut.
    #[arg(
        long,
        env = "BRIDGEHEAD_DRAIN_GRACE_PERIOD",
        default_value = "30s",
        value_parser = duration::parse,
        value_name = "DURATION"
    )]
    pub drain_grace_period: Duration,

    /// Destinations the agent may dial: comma-separated `CIDR`, `CIDR:PORT`, `CIDR:LOW-HIGH`
    /// (`[IPv6/len]:PORT`); empty: any not denied. Checked on the resolved addresses. An exact
    /// address listed here lifts a default denial (a link-local service on purpose).
    #[arg(
        long,
        env = "BRIDGEHEAD_ALLOWED_DESTINATIONS",
        default_value = "",
        hide_default_value = true,
        value_name = "RULES"
    )]
    pub allowed_destinations: String,

    /// Destinations the agent never dials, in the syntax of --allowed-destinations, on top of
    /// the defaults: link-local and cloud metadata addresses, 0.0.0.0/8 and ::, and the
    /// agent's own ports on this host.
    #[arg(
        long,
        env = "BRIDGEHEAD_DENIED_DESTINATIONS",
        default_value = "",
        hide_default_value = true,
        value_name = "RULES"
    )]
    pub denied_destinations: String,

    /// Name to verify in the server's certificate (DNS name or IP address)
    /// [default: --proxy-server-host].
    #[arg(long, env = "BRIDGEHEAD_SERVER_NAME", value_name = "NAME")]
    pub server_name: Option<String>,

    /// More ALPN protocols offered to the server after `http/1.1`, comma-separated (for a
    /// load balancer that tells tunnel connections from others by ALPN).
    #[arg(
        long,
        env = "BRIDGEHEAD_ALPN_PROTO",
        value_delimiter = ',',
        value_name = "PROTOCOLS"
    )]
    pub alpn_proto: Vec<String>,

    /// Most tunnels the agent carries on one server's session; beyond it that server's dial
    /// gets `too_many_streams` (503). Raise it with the server's `--max-tunnels-per-agent`.
    #[arg(long, env = "BRIDGEHEAD_MAX_TUNNELS", default_value_t = bridgehead_proto::session::DEFAULT_MAX_STREAMS, value_name = "N")]
    pub max_tunnels: usize,

    /// ANP: how often the agent polls its connections' readiness. Accepted and ignored:
    /// readiness follows each session as it opens, drains and ends, with nothing to poll.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION", hide = true)]
    pub probe_interval: Option<Duration>,

    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,

    #[command(flatten)]
    pub klog: KlogArgs,

    #[command(flatten)]
    pub anp_ignored: AnpIgnoredArgs,

    /// Count the servers by their Leases (the servers run --enable-lease-controller): the
    /// agent looks for as many servers as there are valid Leases matching
    /// --lease-label-selector in --lease-namespace, keeping the last count while
    /// kube-apiserver cannot be reached. Needs list and watch on Leases there.
    #[arg(
        long,
        env = "BRIDGEHEAD_COUNT_SERVER_LEASES",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub count_server_leases: Option<bool>,

    // `--kubeconfig` and `--lease-namespace`, which the server takes too (worded below).
    #[command(flatten)]
    pub kube: KubeArgs,

    /// Label selector of the Leases counted (`key=value,...`).
    #[arg(long, env = "BRIDGEHEAD_LEASE_LABEL_SELECTOR", default_value = DEFAULT_LABEL)]
    pub lease_label_selector: String,

    /// Old name of --lease-label-selector (ANP deprecated it); given, it wins.
    #[arg(long, hide = true)]
    pub lease_label: Option<String>,

    /// How the counts from Leases and from the servers' answers combine: `default` takes
    /// one (Leases with --count-server-leases, else the servers'), `max` the larger.
    #[arg(
        long,
        env = "BRIDGEHEAD_SERVER_COUNT_SOURCE",
        default_value = "default",
        value_parser = PossibleValuesParser::new(["", "default", "max"]),
    )]
    pub server_count_source: String,
}

/// How the agent words the flags it shares with the server ([`ProcessArgs`], [`KubeArgs`]):
/// the same flags, said of the agent's side, the addresses named as ANP's agent names them.
const WORDINGS: &[Wording] = &[
    Wording::help(
        "kubeconfig",
        "kubeconfig for counting Leases; empty: the pod's in-cluster configuration",
    ),
    Wording::help(
        "session_threads",
        "Threads of their own for the sessions with servers: each session, and every tunnel \
         it carries, runs on one of them (the least loaded when it connects), so a tunnel's \
         chunks never cross between cores on their way to and from its session. `auto` = one \
         per worker thread (none with a single worker); 0 = none (everything on the workers)",
    ),
    Wording {
        id: "health_bind_address",
        help: "Address the health server binds (`--health-server-host`, ANP's name, is the \
               same flag)",
        value_name: Some("IP"),
        alias: Some("health-server-host"),
    },
    Wording {
        id: "admin_bind_address",
        help: "Address the admin port binds",
        value_name: Some("IP"),
        alias: None,
    },
    Wording::help(
        "keepalive_time",
        "Interval between WebSocket pings; the session is dead after three intervals of silence",
    ),
];

/// Where the agent's server count comes from besides the servers' answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseCounting {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--lease-label-selector`, checked.
    pub selector: String,
    /// `--kubeconfig`; `None`: in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// `--server-count-source=max`: the larger of Leases and answers, else Leases alone.
    pub max_with_answers: bool,
}

/// The validated configuration, in the groups an operator thinks in; `/config` shows it whole,
/// as JSON, from this one derived serialisation. It holds file paths, never key material or
/// tokens: the files are read when connecting, so rotated certificates and tokens are picked
/// up on reconnect.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// What the agent announces, `id` included.
    #[serde(serialize_with = "query")]
    pub identifiers: AgentIdentifiers,
    pub servers: ServersConfig,
    pub tls: TlsConfig,
    pub sessions: SessionsConfig,
    pub destinations: DestinationsConfig,
    /// `--tunnel-memory-budget`, `--tunnel-receive-buffer`, `--tunnel-unsent-limit`.
    pub memory: MemoryArgs,
    pub logging: LoggingConfig,
    pub process: ProcessConfig,
    /// Startup lines about flags accepted but ignored or mapped.
    #[serde(skip)]
    pub notes: Notes,
}

/// Where the servers are, and how many the agent looks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServersConfig {
    /// The server's host (the first of `hosts`), without brackets around an IPv6 literal.
    pub host: String,
    /// Every host `--proxy-server-host` names, resolved to find the servers.
    pub hosts: Vec<String>,
    /// The servers' agent port.
    pub port: u16,
    /// How often the agent looks for servers it lacks.
    #[serde(serialize_with = "duration::serialize")]
    pub sync_interval: Duration,
    /// Longest delay between attempts.
    #[serde(serialize_with = "duration::serialize")]
    pub sync_interval_cap: Duration,
    /// `--sync-forever`.
    pub sync_forever: bool,
    /// `--max-server-sessions` (0: no limit).
    pub max_sessions: usize,
    /// `--count-server-leases`.
    pub lease_counting: Option<LeaseCounting>,
}

/// How the agent proves who it is and checks the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsConfig {
    /// The name verified in the server's certificate.
    #[serde(serialize_with = "server_name")]
    pub server_name: ServerName<'static>,
    /// `--server-name` was given: every server is verified against it. Otherwise a server
    /// dialed at an address of one of several `--proxy-server-host` entries is verified
    /// against that entry.
    pub server_name_given: bool,
    /// CA bundle for the server's certificate.
    pub ca_cert: PathBuf,
    /// Client certificate, if any.
    pub client_cert: Option<ClientCert>,
    /// Bearer token file, if any.
    pub token_path: Option<PathBuf>,
    /// `--alpn-proto`.
    pub alpn: Vec<String>,
}

/// How each session with a server is kept and ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionsConfig {
    /// `--keepalive-time`: a ping after this much silence; the session ends after three.
    #[serde(serialize_with = "duration::serialize")]
    pub keepalive_time: Duration,
    /// How long a drain may take on shutdown.
    #[serde(serialize_with = "duration::serialize")]
    pub drain_grace_period: Duration,
    /// `--max-tunnels`: streams per session.
    pub max_tunnels: usize,
}

impl SessionsConfig {
    /// Session keepalive: a ping every `--keepalive-time`, the session given up after
    /// `KEEPALIVE_MISSES` of them without an answer.
    pub fn keepalive(&self) -> Keepalive {
        bridgehead_runtime::timeouts::keepalive(self.keepalive_time)
    }
}

/// Where the server may ask the agent to dial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DestinationsConfig {
    /// `--allowed-destinations`.
    pub allowed: Vec<Rule>,
    /// `--denied-destinations`.
    pub denied: Vec<Rule>,
}

/// Where log lines go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// klog's flags.
    pub settings: LogSettings,
}

/// The process: its listeners and threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessConfig {
    /// Where the health server binds.
    pub health_address: SocketAddr,
    /// Where the admin server binds.
    pub admin_address: SocketAddr,
    /// `--worker-threads`.
    pub worker_threads: usize,
    /// `--session-threads`, resolved: how many session threads to start.
    pub session_threads: usize,
}

fn query<S: serde::Serializer>(identifiers: &AgentIdentifiers, to: S) -> Result<S::Ok, S::Error> {
    to.collect_str(&identifiers.to_query())
}

fn server_name<S: serde::Serializer>(name: &ServerName<'_>, to: S) -> Result<S::Ok, S::Error> {
    to.collect_str(&name.to_str())
}

impl Config {
    /// The certificate files in use, by role, for the expiry metric.
    pub fn certificate_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = vec![("server-ca", self.tls.ca_cert.clone())];
        if let Some(pair) = &self.tls.client_cert {
            files.push(("client", pair.cert.clone()));
        }
        files
    }

    /// The agent's id.
    pub fn agent_id(&self) -> &str {
        self.identifiers.id.as_deref().unwrap_or_default()
    }

    /// The destination policy, with `own_ports` (the ports this agent listens on) denied on
    /// this host: loopback, the unspecified address and the addresses it announces.
    pub fn destination_policy(&self, own_ports: Vec<u16>) -> Policy {
        let own_addresses = self
            .identifiers
            .ipv4
            .iter()
            .map(|ip| IpAddr::V4(*ip))
            .chain(self.identifiers.ipv6.iter().map(|ip| IpAddr::V6(*ip)))
            .collect();
        Policy::new(
            RuleFlags::AGENT,
            self.destinations.allowed.clone(),
            self.destinations.denied.clone(),
            own_ports,
            own_addresses,
        )
    }

    /// `host:port` of the server, with brackets around an IPv6 literal: for URLs and logs.
    pub fn server_authority(&self) -> String {
        HostPort(&self.servers.host, self.servers.port).to_string()
    }

    /// The effective configuration as `/config` shows it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|error| format!("{error}"))
    }
}

impl Cli {
    /// Checks everything that can be checked before binding: identifiers, the certificate
    /// pair, durations, and that the TLS files load.
    pub fn into_config(mut self) -> anyhow::Result<Config> {
        let mut notes = Notes::default();
        let log = self
            .klog
            .settings("bridgehead-agent", &mut notes)
            .map_err(anyhow::Error::msg)?;
        self.anp_ignored.notes(&mut notes);
        notes.given(
            &self.probe_interval,
            "probe-interval",
            "readiness follows each session as it opens, drains and ends; nothing is polled",
        );
        let servers = self.servers()?;
        let tls = self.tls(&servers.host)?;
        let identifiers = self.identifiers()?;
        let sessions = self.sessions()?;
        let config = Config {
            identifiers,
            servers,
            tls,
            sessions,
            destinations: DestinationsConfig {
                allowed: parse_rules(&self.allowed_destinations)
                    .context("--allowed-destinations")?,
                denied: parse_rules(&self.denied_destinations).context("--denied-destinations")?,
            },
            logging: LoggingConfig {
                format: self.process.log_format,
                settings: log,
            },
            process: ProcessConfig {
                health_address: SocketAddr::new(
                    self.process.health_bind_address,
                    self.health_server_port,
                ),
                admin_address: SocketAddr::new(
                    self.process.admin_bind_address,
                    self.admin_server_port,
                ),
                worker_threads: self.process.worker_threads,
                session_threads: self
                    .process
                    .session_threads
                    .count(self.process.worker_threads),
            },
            memory: self.memory,
            notes,
        };
        // Fail now, not on the first connect, if the token file or the CA or the client pair
        // does not load. The token is read again for every connection (kubelet rotates it).
        let tls = &config.tls;
        if let Some(path) = &tls.token_path {
            crate::token::bearer(path).context("--service-account-token-path")?;
        }
        crate::tls::client_config(&tls.ca_cert, tls.client_cert.as_ref(), &tls.alpn)?;
        Ok(config)
    }

    fn servers(&mut self) -> anyhow::Result<ServersConfig> {
        let hosts: Vec<String> = self
            .proxy_server_host
            .split(',')
            .map(|host| strip_brackets(host.trim()).to_owned())
            .collect();
        if hosts.iter().any(String::is_empty) {
            bail!("--proxy-server-host is empty, or has an empty entry");
        }
        if self.proxy_server_port == 0 {
            bail!("--proxy-server-port must not be 0");
        }
        if self.sync_interval.is_zero() {
            bail!("--sync-interval must be above 0");
        }
        if self.sync_interval_cap < self.sync_interval {
            bail!(
                "--sync-interval-cap ({:?}) is below --sync-interval ({:?})",
                self.sync_interval_cap,
                self.sync_interval
            );
        }
        // An entry may name its own port (`host:port`); the first is the one dialed by name.
        let (first_host, first_port) =
            bridgehead_runtime::addresses::split_port(&hosts[0], self.proxy_server_port);
        Ok(ServersConfig {
            host: first_host,
            hosts,
            port: first_port,
            sync_interval: self.sync_interval,
            sync_interval_cap: self.sync_interval_cap,
            sync_forever: self.sync_forever.unwrap_or(false),
            max_sessions: self.max_server_sessions,
            lease_counting: self.lease_counting()?,
        })
    }

    fn lease_counting(&mut self) -> anyhow::Result<Option<LeaseCounting>> {
        if !self.count_server_leases.unwrap_or(false) {
            return Ok(None);
        }
        // `--lease-label` is the old spelling; given, it stands (ANP: the same variable).
        let selector = self
            .lease_label
            .take()
            .unwrap_or_else(|| self.lease_label_selector.clone())
            .trim()
            .to_owned();
        check_selector(&selector).map_err(|e| anyhow::anyhow!("--lease-label-selector: {e}"))?;
        Ok(Some(LeaseCounting {
            namespace: self.kube.lease_namespace().map_err(anyhow::Error::msg)?,
            selector,
            kubeconfig: self.kube.kubeconfig(),
            max_with_answers: self.server_count_source == "max",
        }))
    }

    fn tls(&mut self, server_host: &str) -> anyhow::Result<TlsConfig> {
        let alpn: Vec<String> = self
            .alpn_proto
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        if let Some(bad) = alpn.iter().find(|p| p.len() > 255) {
            bail!("--alpn-proto: {bad:?} is longer than 255 bytes");
        }
        let server_name_given = self.server_name.is_some();
        let server_name = self.server_name.as_deref().unwrap_or(server_host);
        let server_name =
            ServerName::try_from(strip_brackets(server_name).to_owned()).map_err(|_| {
                anyhow::anyhow!(
                    "invalid --server-name {server_name:?}: not a DNS name or IP address"
                )
            })?;
        let client_cert = match (self.agent_cert.take(), self.agent_key.take()) {
            (Some(cert), Some(key)) => Some(ClientCert { cert, key }),
            (None, None) => None,
            (Some(_), None) => bail!("--agent-cert needs --agent-key"),
            (None, Some(_)) => bail!("--agent-key needs --agent-cert"),
        };
        Ok(TlsConfig {
            server_name,
            server_name_given,
            ca_cert: self.ca_cert.clone(),
            client_cert,
            token_path: self.service_account_token_path.take(),
            alpn,
        })
    }

    fn identifiers(&mut self) -> anyhow::Result<AgentIdentifiers> {
        let mut identifiers = AgentIdentifiers::parse(&self.agent_identifiers)
            .context("invalid --agent-identifiers")?;
        identifiers
            .reject_unknown()
            .context("invalid --agent-identifiers")?;
        let agent_id = match (self.agent_id.take(), identifiers.id.take()) {
            (Some(_), Some(_)) => {
                bail!("--agent-identifiers sets id= and --agent-id is given too; keep one")
            }
            (Some(id), None) | (None, Some(id)) => id,
            (None, None) => default_agent_id(),
        };
        identifiers.id = Some(agent_id);
        // Round trip through the parser so the id is validated by the same rules the server
        // applies.
        AgentIdentifiers::parse(&identifiers.to_query()).context("invalid --agent-id")?;
        Ok(identifiers)
    }

    fn sessions(&self) -> anyhow::Result<SessionsConfig> {
        if self.process.keepalive_time.is_zero() {
            bail!("--keepalive-time must be above 0");
        }
        if self.max_tunnels == 0 {
            bail!("--max-tunnels must be above 0");
        }
        Ok(SessionsConfig {
            keepalive_time: self.process.keepalive_time,
            drain_grace_period: self.drain_grace_period,
            max_tunnels: self.max_tunnels,
        })
    }
}

/// The host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`), else a random id.
fn default_agent_id() -> String {
    bridgehead_runtime::host::hostname()
        .unwrap_or_else(|| format!("agent-{:016x}", rand::random::<u64>()))
}
