//! bridgehead-server: HTTP CONNECT tunnels into a private network, through connected agents.
//!
//! This file is the composition root: [`Listeners`] binds, [`run`] wires the parts and shuts
//! them down. The parts are folders, each using only those listed after it (checked by
//! `e2e/tests/layout.rs` against docs/architecture.md):
//! - [`frontend`]: the CONNECT listener, mTLS TCP or Unix socket, its pre-TLS handshake
//!   bound, and the per-connection pipeline.
//! - [`peering`]: forwarding to and from peer servers (`--peer-port`).
//! - [`agents`]: agents' WebSocket sessions, the handshake admission in front of them (the
//!   peer port's too), their authentication, the upgrade, revocation.
//! - [`routing`]: the one tunnel opener (admission, route, dial, fallback, refusal), the
//!   registry of own and peers' agents over the pure router.
//! - [`process`]: what every part uses: metrics, TLS configuration, certificate names, the
//!   Kubernetes client, HTTP heads, and the health and admin ports' answers.
//!
//! Beside them, the composition the parts read: [`config`] (flags into a validated
//! [`Config`]) and [`context`] (what connection tasks share). Neither is built from anything
//! that uses it back.
//!
//! [`run`] takes listeners that are already bound, so tests bind port 0 and hand them in.
//! Several servers share one address for agents, or agents find each by DNS: each tells an
//! agent its `--server-id` and `--server-count` in the upgrade answer and routes what its own
//! frontend receives over its own agent sessions, or, with `--peer-port`, over a peer's
//! (docs/ha.md).

pub mod agents;
pub mod config;
pub mod context;
pub mod frontend;
pub mod peering;
pub mod process;
pub mod routing;
#[cfg(test)]
mod test_util;

use std::io::Write;
use std::sync::Arc;

use anyhow::Context as _;
use bridgehead_kubeapi::serviceaccount::{TokenVerifier, VerifierSettings};
use bridgehead_runtime::shutdown::Lifecycle;
use bridgehead_runtime::timeouts::CLOSE;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use config::{Cli, Config, FrontendConfig, FrontendListen};

use context::Context;

/// The frontend's bound listener.
#[derive(Debug)]
pub enum FrontendListener {
    Tcp(TcpListener),
    Unix(UnixListener, std::path::PathBuf),
}

/// Every listener the server serves, bound before [`run`].
#[derive(Debug)]
pub struct Listeners {
    pub frontend: FrontendListener,
    pub agent: TcpListener,
    pub health: TcpListener,
    pub admin: TcpListener,
    /// `--peer-port`, when set.
    pub peer: Option<TcpListener>,
}

impl Listeners {
    /// Binds what `config` asks for (port 0 binds an ephemeral port).
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let frontend = match &config.frontend.listener {
            FrontendListen::Tcp { bind, .. } => FrontendListener::Tcp(
                TcpListener::bind(bind)
                    .await
                    .with_context(|| format!("binding the frontend on {bind}"))?,
            ),
            FrontendListen::Unix { path } => {
                FrontendListener::Unix(frontend::bind_unix(path)?, path.clone())
            }
        };
        let agent_bind = config.agent_endpoint.bind;
        let agent = bridgehead_runtime::limits::listen_with_backlog(agent_bind, AGENT_BACKLOG)
            .with_context(|| format!("binding the agent endpoint on {agent_bind}"))?;
        let process = &config.process;
        let health = TcpListener::bind(process.health_bind)
            .await
            .with_context(|| format!("binding the health port on {}", process.health_bind))?;
        let admin = TcpListener::bind(process.admin_bind)
            .await
            .with_context(|| format!("binding the admin port on {}", process.admin_bind))?;
        let peer = match &config.peering {
            Some(peering) => Some(
                TcpListener::bind(peering.bind)
                    .await
                    .with_context(|| format!("binding the peer port on {}", peering.bind))?,
            ),
            None => None,
        };
        Ok(Listeners {
            frontend,
            agent,
            health,
            admin,
            peer,
        })
    }
}

/// The agent endpoint's accept queue: after a restart the fleet comes back at once, and
/// whoever finds every handshake place taken waits here (the kernel caps it at
/// `net.core.somaxconn`).
const AGENT_BACKLOG: u32 = 65_535;

/// Serves until `shutdown`, then stops accepting, lets open tunnels finish within the grace
/// period, and closes every agent session.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    bridgehead_runtime::tls::install_crypto_provider();
    let lifecycle = Lifecycle::new();
    let (settle, settled) = match &config.peering {
        Some(_) => {
            let (sender, settled) = routing::settled::Settled::new();
            (Some(sender), settled)
        }
        None => (None, routing::settled::Settled::already()),
    };
    let (ctx, kube, verifier) = start(config, settled, lifecycle.stop()).await?;
    let config = &ctx.config;
    let strategies: Vec<String> = config
        .routing
        .strategies
        .iter()
        .map(ToString::to_string)
        .collect();
    info!(
        server_id = %config.routing.server_id,
        server_count = config.routing.server_count,
        strategies = %strategies.join(","),
        "starting"
    );
    let agent_addr = listeners.agent.local_addr()?;
    serve_frontend(listeners.frontend, &ctx, &lifecycle)?;
    let cluster_tls = process::tls_config::ReloadingConfig::load(
        "agent endpoint",
        &config.agent_endpoint.cert,
        &config.agent_endpoint.key,
        config.agent_endpoint.auth.cluster_ca.as_deref(),
        &config.tls,
    )
    .context("agent endpoint TLS")?;
    announce("agent endpoint", &agent_addr.to_string());
    lifecycle.spawn(cluster_tls.clone().watch(lifecycle.stop().clone()));
    lifecycle.spawn(agents::endpoint::serve(
        listeners.agent,
        cluster_tls,
        ctx.clone(),
        lifecycle.stop().clone(),
        lifecycle.end().clone(),
        lifecycle.tasks().clone(),
    ));
    serve_health_and_admin(listeners.health, listeners.admin, &ctx, &lifecycle)?;
    let peer_port = listeners
        .peer
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?
        .map(|address| address.port());
    if let (Some(listener), Some(settle)) = (listeners.peer, settle) {
        serve_peers(listener, settle, kube.as_ref(), &ctx, &lifecycle)?;
    }
    if let Some(verifier) = verifier {
        lifecycle.spawn(
            ctx.revocation
                .clone()
                .run(verifier, lifecycle.stop().clone()),
        );
    }
    if let Some(api) = &kube {
        hold_lease(api, peer_port, &ctx, &lifecycle)?;
    }

    shutdown.cancelled().await;
    let grace = config.process.grace_period;
    info!(
        ?grace,
        tunnels = ctx.tunnels.len(),
        "shutting down: no new connections, waiting for open tunnels"
    );
    lifecycle.stop().cancel();
    for session in ctx.registry.sessions() {
        session.drain();
    }
    let drained = lifecycle.drain(grace, &ctx.tunnels).await;
    // Counted now: the end below cuts what is left.
    let cut = ctx.tunnels.len();
    let closed = lifecycle.close(&ctx.tunnels).await;
    match (drained, closed.in_time) {
        (true, true) => info!("shutdown complete: every tunnel finished"),
        (false, _) => warn!(
            tunnels = cut,
            "shutdown complete: tunnels still open at the end of the grace period were cut"
        ),
        (true, false) => warn!(
            tasks = closed.left,
            "shutdown complete: agent sessions did not close within {CLOSE:?}"
        ),
    }
    Ok(())
}

/// With `--enable-lease-controller`: holds this server's Lease until the stop (a draining
/// server is no longer counted), with where peers reach it when it forwards
/// (`--peer-advertise-address`; the port bound, `peer_port`, when the address names none).
fn hold_lease(
    api: &Arc<process::kubernetes::KubeApi>,
    peer_port: Option<u16>,
    ctx: &Arc<Context>,
    lifecycle: &Lifecycle,
) -> anyhow::Result<()> {
    let config = &ctx.config;
    let Some(settings) = &config.kubernetes.leases else {
        return Ok(());
    };
    let mut settings = settings.clone();
    let advertise = config.peering.as_ref().and_then(|p| p.advertise.as_ref());
    if let (Some(advertise), Some(port)) = (advertise, peer_port) {
        let (host, port) = bridgehead_runtime::addresses::split_port(advertise, port);
        settings.annotations.insert(
            bridgehead_kubeapi::leases::PEER_ADDRESS_ANNOTATION.to_owned(),
            bridgehead_proto::host::HostPort(&host, port).to_string(),
        );
    }
    let name = bridgehead_kubeapi::leases::lease_name(&config.routing.server_id)
        .map_err(anyhow::Error::msg)?;
    let lease_ctx = ctx.clone();
    lifecycle.spawn(bridgehead_kubeapi::leases::hold(
        api.clone(),
        settings,
        config.routing.server_id.clone(),
        name,
        lifecycle.stop().clone(),
        move |event| lease_ctx.metrics.process.lease(event),
    ));
    Ok(())
}

/// The peer port, and the dialing of the peers: both stop with the listeners, and their
/// sessions end with the rest (a draining server's peers hear DRAIN and forward nothing new).
fn serve_peers(
    listener: TcpListener,
    settle: tokio::sync::watch::Sender<bool>,
    kube: Option<&Arc<process::kubernetes::KubeApi>>,
    ctx: &Arc<Context>,
    lifecycle: &Lifecycle,
) -> anyhow::Result<()> {
    let Some(mut peering) = ctx.config.peering.clone() else {
        anyhow::bail!("a peer listener needs a peering configuration");
    };
    // Entries without a port are at the port this server listens on (with `--peer-port 0`,
    // the one it was given).
    peering.port = listener.local_addr()?.port();
    let source = match (peering.from_leases, &ctx.config.kubernetes.leases, kube) {
        (false, _, _) => peering::dialed::Source::names(&peering),
        (true, Some(settings), Some(api)) => {
            let selector = bridgehead_kubeapi::labels::selector(&settings.labels);
            let leases = bridgehead_kubeapi::leases::LeaseCount::watch(
                api,
                &settings.namespace,
                &selector,
                lifecycle.stop().clone(),
            );
            let own = bridgehead_kubeapi::leases::lease_name(&ctx.config.routing.server_id)
                .map_err(anyhow::Error::msg)?;
            info!("peers found by their Leases");
            peering::dialed::Source::leases(leases, own, &peering)
        }
        (true, ..) => anyhow::bail!("peers from Leases need --enable-lease-controller"),
    };
    let tls = process::tls_config::ReloadingConfig::load(
        "peer port",
        &peering.cert,
        &peering.key,
        Some(&peering.ca),
        &ctx.config.tls,
    )
    .context("peer port TLS")?;
    announce("peer port", &listener.local_addr()?.to_string());
    lifecycle.spawn(tls.clone().watch(lifecycle.stop().clone()));
    lifecycle.spawn(peering::accepted::serve(
        listener,
        tls,
        peering::identity::PeerPolicy::new(&peering),
        ctx.clone(),
        lifecycle.stop().clone(),
        lifecycle.end().clone(),
        lifecycle.tasks().clone(),
    ));
    lifecycle.spawn(peering::dialed::dial_peers(
        ctx.clone(),
        peering,
        source,
        settle,
        lifecycle.stop().clone(),
        lifecycle.end().clone(),
        lifecycle.tasks().clone(),
    ));
    Ok(())
}

/// The shared context and what it needs started first: the Kubernetes client (for tokens
/// and Leases) and the token verifier, whose watches stop with `stop`.
async fn start(
    config: Config,
    settled: routing::settled::Settled,
    stop: &CancellationToken,
) -> anyhow::Result<(
    Arc<Context>,
    Option<Arc<process::kubernetes::KubeApi>>,
    Option<TokenVerifier>,
)> {
    if config.frontend.shared_ca {
        warn!("--server-ca-cert and --cluster-ca-cert hold the same CA (--allow-shared-ca): every agent certificate is also a valid CONNECT client certificate; make a two-CA PKI with bridgehead-certs init");
    }
    let kube = if config.agent_endpoint.auth.token.is_some() || config.kubernetes.leases.is_some() {
        let client = &config.kubernetes.client;
        Some(Arc::new(
            process::kubernetes::KubeApi::connect(
                client.kubeconfig.as_deref(),
                client.qps,
                client.burst,
            )
            .await
            .context("the Kubernetes client (--kubeconfig)")?,
        ))
    } else {
        None
    };
    let (agent_auth, verifier) = agent_auth(&config.agent_endpoint.auth, kube.clone(), stop)?;
    let threads = config.process.session_threads;
    let shards = bridgehead_runtime::threads::Shards::start("session", threads)
        .context("starting the session threads")?;
    if threads > 0 {
        info!(threads, "agent sessions run on threads of their own");
    }
    let fallback = match &config.routing.fallback {
        Some(fallback) => {
            let fallback = routing::fallback::Fallback::new(
                fallback.clone(),
                &config.routing.fallback_destinations,
            )
            .context("--fallback-proxy")?;
            info!(fallback = %fallback.url(), "CONNECTs that no agent matches go to the fallback proxy");
            Some(fallback)
        }
        None => None,
    };
    let mut ctx = Context::new(config, agent_auth, shards, fallback);
    ctx.peers_settled = settled;
    if let Some(verifier) = &verifier {
        ctx.metrics.watch_token_verifier(verifier.clone());
    }
    if let Some(kube) = &kube {
        ctx.metrics.watch_kube_requests(kube.requests());
    }
    ctx.metrics
        .routing
        .set_ready_backends(&ctx.registry.ready_backends());
    Ok((Arc::new(ctx), kube, verifier))
}

/// Serves CONNECT clients on the frontend listener until the stop; each connection's task
/// is work the grace period waits for (and its tunnel, wherever it runs, is `ctx.tunnels`').
fn serve_frontend(
    listener: FrontendListener,
    ctx: &Arc<Context>,
    lifecycle: &Lifecycle,
) -> anyhow::Result<()> {
    let stop = lifecycle.stop().clone();
    match listener {
        FrontendListener::Tcp(listener) => {
            let FrontendListen::Tcp {
                cert,
                key,
                client_ca,
                allowed_clients,
                ..
            } = &ctx.config.frontend.listener
            else {
                anyhow::bail!("a TCP frontend listener needs a TCP frontend configuration");
            };
            let tls = process::tls_config::ReloadingConfig::load(
                "frontend",
                cert,
                key,
                Some(client_ca),
                &ctx.config.tls,
            )
            .context("frontend TLS")?;
            lifecycle.spawn(tls.clone().watch(stop.clone()));
            announce("frontend", &listener.local_addr()?.to_string());
            lifecycle.spawn(frontend::serve_tcp(
                listener,
                tls,
                allowed_clients.as_slice().into(),
                ctx.clone(),
                stop,
                lifecycle.work().clone(),
            ));
        }
        FrontendListener::Unix(listener, path) => {
            announce("frontend", &format!("unix:{}", path.display()));
            lifecycle.spawn(frontend::serve_unix(
                listener,
                ctx.clone(),
                stop,
                lifecycle.work().clone(),
            ));
        }
    }
    Ok(())
}

/// `/healthz`, `/readyz`, `/metrics` on the health port; `/agents`, `/config` on the admin
/// port. Both stop with the listeners.
fn serve_health_and_admin(
    health: TcpListener,
    admin: TcpListener,
    ctx: &Arc<Context>,
    lifecycle: &Lifecycle,
) -> anyhow::Result<()> {
    announce("health", &health.local_addr()?.to_string());
    announce("admin", &admin.local_addr()?.to_string());
    let health_ctx = ctx.clone();
    lifecycle.spawn(bridgehead_runtime::health::serve(
        health,
        move |path| process::health::route(&health_ctx, path),
        lifecycle.stop().clone(),
        lifecycle.tasks().clone(),
    ));
    let admin_ctx = ctx.clone();
    let shown = ctx.config.to_json();
    lifecycle.spawn(bridgehead_runtime::health::serve_admin(
        admin,
        move |path| process::health::admin(&admin_ctx, &shown, path),
        lifecycle.stop().clone(),
        lifecycle.tasks().clone(),
    ));
    Ok(())
}

/// The agent endpoint's authentication; tokens are verified locally (its watches stop with
/// `shutdown`) or reviewed through `kube`. Returns the local verifier too, for its metric.
fn agent_auth(
    config: &config::AgentAuthConfig,
    kube: Option<Arc<process::kubernetes::KubeApi>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<(agents::auth::AgentAuth, Option<TokenVerifier>)> {
    let mut local = None;
    let tokens = match &config.token {
        Some(token) => {
            let api = kube.context("token authentication needs a Kubernetes client")?;
            if token.local {
                let mut settings = VerifierSettings::new(
                    &token.namespace,
                    &token.service_account,
                    &token.audience,
                );
                settings.watch_nodes = config.bind_identifiers;
                local = Some(TokenVerifier::start(
                    api.clone(),
                    settings,
                    shutdown.child_token(),
                ));
            }
            info!(
                namespace = %token.namespace,
                service_account = %token.service_account,
                audience = %token.audience,
                verification = if token.local { "local, TokenReview for what it cannot decide" } else { "TokenReview" },
                "agents authenticate with ServiceAccount tokens"
            );
            Some(agents::auth::TokenPolicy {
                api,
                namespace: token.namespace.clone(),
                service_account: token.service_account.clone(),
                audience: token.audience.clone(),
                cache_ttl: token.cache_ttl,
                verifier: local.clone(),
            })
        }
        None => None,
    };
    if config.bind_identifiers {
        info!("agents may announce only the host and address identifiers that belong to them");
    }
    let auth =
        agents::auth::AgentAuth::new(config.cluster_ca.is_some(), tokens, config.bind_identifiers);
    Ok((auth, local))
}

/// Logs a bound address and prints it on stdout in a line scripts can read:
/// `bridgehead-server <what> listening on <address>`.
fn announce(what: &str, address: &str) {
    info!(%address, "{what} listening");
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "bridgehead-server {what} listening on {address}");
    let _ = stdout.flush();
}
