//! bridgehead-server: HTTP CONNECT tunnels into a private network, through connected agents.
//!
//! This file is the composition root: [`Listeners`] binds, [`run`] wires the components and
//! shuts them down. Components, one module each, in the order a CONNECT meets them:
//! [`frontend`] (the CONNECT listener, mTLS TCP or Unix socket, and the per-connection
//! pipeline), [`admission`] (the bound on dials in flight), [`registry`] (connected agents and
//! the route table over them) over [`router`] (the strategy list and the parsed [`Target`],
//! pure), [`dial`] (asking the routed agents), [`fallback`] (the proxy that CONNECTs no agent
//! matches go to), [`refusal`] (every way a CONNECT is turned down, with its status and metric
//! label). Beside them: [`agent_endpoint`] (agents' WebSocket sessions, admitted by
//! [`agent_admission`], authenticated by [`agent_auth`], closed by [`revocation`] when the
//! token they were let in by turns invalid), [`context`] (what connection tasks share),
//! [`config`] (flags into a validated [`Config`]), [`tls_config`], [`health`] and [`metrics`].
//!
//! [`run`] takes listeners that are already bound, so tests bind port 0 and hand them in.
//! Several servers share one address for agents: each tells an agent its `--server-id` and
//! `--server-count` in the upgrade answer and routes only what its own frontend receives
//! over its own agent sessions (docs/ha.md).
//!
//! [`Target`]: router::Target

pub mod admission;
pub mod agent_admission;
pub mod agent_auth;
pub mod agent_endpoint;
pub mod certificate;
pub mod config;
pub mod context;
pub mod dial;
pub mod fallback;
pub mod frontend;
pub mod handshakes;
pub mod health;
pub mod http_head;
pub mod kubernetes;
pub mod metrics;
pub mod refusal;
pub mod registry;
pub mod revocation;
pub mod router;
#[cfg(test)]
mod test_util;
pub mod tls_config;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bridgehead_kubeapi::serviceaccount::{TokenVerifier, VerifierSettings};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use config::{Cli, Config, FrontendConfig};

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
}

impl Listeners {
    /// Binds what `config` asks for (port 0 binds an ephemeral port).
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let frontend = match &config.frontend {
            FrontendConfig::Tcp { bind, .. } => FrontendListener::Tcp(
                TcpListener::bind(bind)
                    .await
                    .with_context(|| format!("binding the frontend on {bind}"))?,
            ),
            FrontendConfig::Unix { path } => {
                FrontendListener::Unix(frontend::bind_unix(path)?, path.clone())
            }
        };
        let agent =
            bridgehead_runtime::limits::listen_with_backlog(config.agent_bind, AGENT_BACKLOG)
                .with_context(|| format!("binding the agent endpoint on {}", config.agent_bind))?;
        let health = TcpListener::bind(config.health_bind)
            .await
            .with_context(|| format!("binding the health port on {}", config.health_bind))?;
        let admin = TcpListener::bind(config.admin_bind)
            .await
            .with_context(|| format!("binding the admin port on {}", config.admin_bind))?;
        Ok(Listeners {
            frontend,
            agent,
            health,
            admin,
        })
    }
}

/// The agent endpoint's accept queue: after a restart the fleet comes back at once, and
/// whoever finds every handshake place taken waits here (the kernel caps it at
/// `net.core.somaxconn`).
const AGENT_BACKLOG: u32 = 65_535;

/// After the grace period, how long the agent sessions get to close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves until `shutdown`, then stops accepting, lets open tunnels finish within the grace
/// period, and closes every agent session.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    bridgehead_runtime::tls::install_crypto_provider();
    let cluster_tls = tls_config::ReloadingConfig::load(
        "agent endpoint",
        &config.cluster_cert,
        &config.cluster_key,
        config.agent_auth.cluster_ca.as_deref(),
        &config.tls,
    )
    .context("agent endpoint TLS")?;
    if config.shared_ca {
        warn!("--server-ca-cert and --cluster-ca-cert hold the same CA (--allow-shared-ca): every agent certificate is also a valid CONNECT client certificate; make a two-CA PKI with bridgehead-certs init");
    }
    let kube = if config.agent_auth.token.is_some() || config.leases.is_some() {
        let client = &config.kube_client;
        Some(Arc::new(
            kubernetes::KubeApi::connect(client.kubeconfig.as_deref(), client.qps, client.burst)
                .await
                .context("the Kubernetes client (--kubeconfig)")?,
        ))
    } else {
        None
    };
    let (agent_auth, verifier) = agent_auth(&config.agent_auth, kube.clone(), &shutdown)?;
    let shards = bridgehead_runtime::threads::Shards::start("session", config.session_threads)
        .context("starting the session threads")?;
    if config.session_threads > 0 {
        info!(
            threads = config.session_threads,
            "agent sessions run on threads of their own"
        );
    }
    let fallback = match &config.fallback {
        Some(fallback) => {
            let fallback = fallback::Fallback::new(fallback.clone()).context("--fallback-proxy")?;
            info!(fallback = %fallback.url(), "CONNECTs that no agent matches go to the fallback proxy");
            Some(fallback)
        }
        None => None,
    };
    let mut ctx = Context::new(&config, agent_auth, shards, fallback);
    if let Some(verifier) = &verifier {
        ctx.metrics.watch_token_verifier(verifier.clone());
    }
    if let Some(kube) = &kube {
        ctx.metrics.watch_kube_requests(kube.requests());
    }
    let ctx = Arc::new(ctx);
    ctx.metrics
        .set_ready_backends(&ctx.registry.ready_backends());
    let connections = TaskTracker::new();
    let sessions = TaskTracker::new();
    let session_token = CancellationToken::new();
    let background = TaskTracker::new();

    let strategies: Vec<String> = config.strategies.iter().map(ToString::to_string).collect();
    info!(
        server_id = %config.server_id,
        server_count = config.server_count,
        strategies = %strategies.join(","),
        "starting"
    );
    let agent_addr = listeners.agent.local_addr()?;
    let health_addr = listeners.health.local_addr()?;
    let admin_addr = listeners.admin.local_addr()?;
    match listeners.frontend {
        FrontendListener::Tcp(listener) => {
            let FrontendConfig::Tcp {
                cert,
                key,
                client_ca,
                allowed_clients,
                ..
            } = &config.frontend
            else {
                anyhow::bail!("a TCP frontend listener needs a TCP frontend configuration");
            };
            let tls = tls_config::ReloadingConfig::load(
                "frontend",
                cert,
                key,
                Some(client_ca),
                &config.tls,
            )
            .context("frontend TLS")?;
            background.spawn(tls.clone().watch(shutdown.clone()));
            announce("frontend", &listener.local_addr()?.to_string());
            background.spawn(frontend::serve_tcp(
                listener,
                tls,
                allowed_clients.as_slice().into(),
                ctx.clone(),
                shutdown.clone(),
                connections.clone(),
            ));
        }
        FrontendListener::Unix(listener, path) => {
            announce("frontend", &format!("unix:{}", path.display()));
            background.spawn(frontend::serve_unix(
                listener,
                ctx.clone(),
                shutdown.clone(),
                connections.clone(),
            ));
        }
    }
    announce("agent endpoint", &agent_addr.to_string());
    announce("health", &health_addr.to_string());
    announce("admin", &admin_addr.to_string());
    background.spawn(cluster_tls.clone().watch(shutdown.clone()));
    if let Some(verifier) = verifier {
        background.spawn(ctx.revocation.clone().run(verifier, shutdown.clone()));
    }
    background.spawn(agent_endpoint::serve(
        listeners.agent,
        cluster_tls,
        ctx.clone(),
        shutdown.clone(),
        session_token.clone(),
        sessions.clone(),
    ));
    let health_ctx = ctx.clone();
    background.spawn(bridgehead_runtime::health::serve(
        listeners.health,
        move |path| health::route(&health_ctx, path),
        shutdown.clone(),
        TaskTracker::new(),
    ));
    let admin_ctx = ctx.clone();
    let admin_config = format!("{config:#?}");
    background.spawn(bridgehead_runtime::health::serve_admin(
        listeners.admin,
        move |path| health::admin(&admin_ctx, &admin_config, path),
        shutdown.clone(),
        TaskTracker::new(),
    ));

    if let (Some(settings), Some(api)) = (&config.leases, &kube) {
        let name = bridgehead_kubeapi::leases::lease_name(&config.server_id)
            .map_err(anyhow::Error::msg)?;
        let lease_ctx = ctx.clone();
        // Stopped with the listeners: a draining server is no longer counted.
        background.spawn(bridgehead_kubeapi::leases::hold(
            api.clone(),
            settings.clone(),
            config.server_id.clone(),
            name,
            shutdown.clone(),
            move |event| lease_ctx.metrics.lease(event),
        ));
    }

    shutdown.cancelled().await;
    info!(grace = ?config.grace_period, tunnels = ctx.tunnels.len(), "shutting down: no new connections, waiting for open tunnels");
    for session in ctx.registry.sessions() {
        session.drain();
    }
    connections.close();
    ctx.tunnels.close();
    let drained = tokio::time::timeout(config.grace_period, async {
        connections.wait().await;
        ctx.tunnels.wait().await;
    })
    .await
    .is_ok();
    // Counted now: closing the sessions below ends what is left.
    let cut = ctx.tunnels.len();
    session_token.cancel();
    sessions.close();
    background.close();
    let closed = tokio::time::timeout(CLOSE_TIMEOUT, async {
        sessions.wait().await;
        ctx.tunnels.wait().await;
        background.wait().await;
    })
    .await
    .is_ok();
    match (drained, closed) {
        (true, true) => info!("shutdown complete: every tunnel finished"),
        (false, _) => warn!(
            tunnels = cut,
            "shutdown complete: tunnels still open at the end of the grace period were cut"
        ),
        (true, false) => warn!(
            sessions = sessions.len(),
            "shutdown complete: agent sessions did not close within {CLOSE_TIMEOUT:?}"
        ),
    }
    Ok(())
}

/// The agent endpoint's authentication; tokens are verified locally (its watches stop with
/// `shutdown`) or reviewed through `kube`. Returns the local verifier too, for its metric.
fn agent_auth(
    config: &config::AgentAuthConfig,
    kube: Option<Arc<kubernetes::KubeApi>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<(agent_auth::AgentAuth, Option<TokenVerifier>)> {
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
            Some(agent_auth::TokenPolicy {
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
        agent_auth::AgentAuth::new(config.cluster_ca.is_some(), tokens, config.bind_identifiers);
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
