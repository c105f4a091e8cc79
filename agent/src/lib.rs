//! `bridgehead-agent`: sits inside the private network, keeps a WebSocket session open to
//! every `bridgehead-server` behind the address it is given, and dials the targets the servers
//! ask for, splicing each TCP connection onto its stream of the session it came on.
//!
//! [`run`] is the whole agent: the health and admin servers, and the search (`servers`) that
//! connects to the address (`server_connection`: TCP, TLS with the `--ca-cert` roots and an
//! optional client certificate from `tls`, its TLS bound counted from the server's first answer
//! ([`first_answer`]: not the wait in a busy server's listen backlog), the WebSocket upgrade to `/connect?id=…&host=…`
//! with subprotocol `bridgehead.v1`, an optional bearer token and the ids of the servers held
//! already) until it holds a session with as many distinct servers as the count says
//! (`server_count`), waiting by [`schedule::Schedule`] between attempts. Each session
//! (`session`) takes its server's dials, each to the target through [`dial`], one task per
//! tunnel, checked against the destination policy (`bridgehead_runtime::destinations`, the one
//! the server applies to what it relays to its fallback proxy). [`config`] turns the command line into a validated [`Config`]. On shutdown the
//! agent announces DRAIN on every session and lets open tunnels finish within the grace
//! period.
//!
//! Not here: the wire protocol and flow control (`bridgehead-proto`, `bridgehead-mux`), and
//! routing — the server routes, the agent dials what it is asked if its policy allows it.

pub mod config;
mod context;
pub mod dial;
pub mod first_answer;
mod health;
mod metrics;
pub mod schedule;
mod server_connection;
mod server_count;
mod servers;
mod session;
pub mod tls;
mod token;

use std::sync::Arc;

use anyhow::Context as _;
use bridgehead_runtime::health::{serve, serve_admin};
use bridgehead_runtime::shutdown::Lifecycle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use config::{Cli, Config};

use context::Context;
use server_count::ServerCount;

/// The agent's two HTTP listeners, bound before [`run`].
#[derive(Debug)]
pub struct Listeners {
    /// `/healthz`, `/readyz`, `/metrics`.
    pub health: TcpListener,
    /// `/status`, `/config` (loopback by default).
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds what `config` asks for (port 0 binds an ephemeral port).
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let bind = |address: std::net::SocketAddr, what: &'static str| async move {
            TcpListener::bind(address)
                .await
                .map_err(|e| anyhow::anyhow!("binding the {what} to {address}: {e}"))
        };
        Ok(Listeners {
            health: bind(config.process.health_address, "health server").await?,
            admin: bind(config.process.admin_address, "admin server").await?,
        })
    }
}

/// Runs the agent until `shutdown` is cancelled and every session drained. Serves
/// `/healthz`, `/readyz` and `/metrics` on the health listener, `/status` and `/config` on the
/// admin listener.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Listeners {
        health: health_listener,
        admin: admin_listener,
    } = listeners;
    let health_address = health_listener.local_addr()?;
    let admin_address = admin_listener.local_addr()?;
    info!(address = %health_address, "health server listening");
    info!(address = %admin_address, "admin server listening");
    info!(
        server = %config.server_authority(),
        agent = %config.agent_id(),
        identifiers = %config.identifiers,
        "starting"
    );

    let ctx = Context::new(
        &config.server_authority(),
        config.memory.tunnel_memory(),
        config.certificate_files(),
    );
    // The health and admin servers answer until the sessions drained: readiness says so
    // meanwhile.
    let lifecycle = Lifecycle::new();
    let routes = {
        let ctx = ctx.clone();
        move |path: &str| ctx.reply(path)
    };
    lifecycle.spawn(serve(
        health_listener,
        routes,
        lifecycle.end().clone(),
        lifecycle.tasks().clone(),
    ));
    let admin_routes = {
        let ctx = ctx.clone();
        let shown = config.to_json();
        move |path: &str| ctx.admin(path, &shown)
    };
    lifecycle.spawn(serve_admin(
        admin_listener,
        admin_routes,
        lifecycle.end().clone(),
        lifecycle.tasks().clone(),
    ));

    let policy =
        Arc::new(config.destination_policy(vec![health_address.port(), admin_address.port()]));
    let count = match &config.servers.lease_counting {
        Some(leases) => {
            let api = bridgehead_kubeapi::KubeApi::connect(leases.kubeconfig.as_deref(), 0.0, 0)
                .await
                .context("--count-server-leases: the Kubernetes client (--kubeconfig)")?;
            info!(
                namespace = %leases.namespace,
                selector = %leases.selector,
                max_with_answers = leases.max_with_answers,
                "counting servers by their Leases"
            );
            let watch = bridgehead_kubeapi::leases::LeaseCount::watch(
                &api,
                &leases.namespace,
                &leases.selector,
                shutdown.clone(),
            );
            ServerCount::from_leases(watch, leases.max_with_answers)
        }
        None => ServerCount::new(),
    };
    let shards =
        bridgehead_runtime::threads::Shards::start("session", config.process.session_threads)
            .context("starting the session threads")?;
    if config.process.session_threads > 0 {
        info!(
            threads = config.process.session_threads,
            "sessions run on threads of their own"
        );
    }
    servers::run(
        Arc::new(config),
        ctx.clone(),
        policy,
        count,
        shards,
        shutdown,
    )
    .await;

    lifecycle.close(&Default::default()).await;
    info!("stopped");
    Ok(())
}
