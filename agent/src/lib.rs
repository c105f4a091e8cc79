//! `bridgehead-agent`: sits inside the private network, keeps one WebSocket session open to
//! `bridgehead-server`, and dials the targets the server asks for, splicing each TCP
//! connection onto its stream of the session.
//!
//! [`run`] is the whole agent: the health server, and a reconnect loop that connects to the
//! server (`server_connection`: TCP, TLS with the `--ca-cert` roots and an optional client
//! certificate from `tls`, the WebSocket upgrade to `/connect?id=…&host=…` with subprotocol
//! `bridgehead.v1` and an optional bearer token), runs the session (`session`: each dial the
//! server asks for goes to the target through [`dial`], one task per tunnel), and waits with
//! [`backoff::Backoff`] between attempts. [`config`] turns the command line into a validated
//! [`Config`]. On shutdown the agent announces DRAIN and lets open tunnels finish within the
//! grace period.
//!
//! Not here: the wire protocol and flow control (`bridgehead-proto`, `bridgehead-mux`), and
//! any policy on which targets may be dialed — the server routes, the agent dials what it is
//! asked.

pub mod backoff;
pub mod config;
pub mod dial;
mod health;
pub mod policy;
mod server_connection;
mod session;
pub mod tls;
mod token;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_runtime::health::serve;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, info_span, warn, Instrument};

pub use config::{Cli, Config};

use backoff::Backoff;
use health::Health;
use policy::Policy;
use server_connection::ConnectError;

/// A session that lasted this long was healthy: the next reconnect starts from the first delay.
const HEALTHY_SESSION: Duration = Duration::from_secs(10);

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
            health: bind(config.health_address, "health server").await?,
            admin: bind(config.admin_address, "admin server").await?,
        })
    }
}

/// Runs the agent until `shutdown` is cancelled and the live session (if any) drained. Serves
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

    let health = Health::new(&config.server_authority());
    let health_stop = CancellationToken::new();
    let health_tasks = TaskTracker::new();
    let routes = {
        let health = health.clone();
        move |path: &str| health.reply(path)
    };
    let health_server = tokio::spawn(serve(
        health_listener,
        routes,
        health_stop.clone(),
        health_tasks.clone(),
    ));
    let admin_routes = {
        let health = health.clone();
        let shown = format!("{config:#?}");
        move |path: &str| health.admin(path, &shown)
    };
    let admin_server = tokio::spawn(serve(
        admin_listener,
        admin_routes,
        health_stop.clone(),
        health_tasks.clone(),
    ));

    let policy =
        Arc::new(config.destination_policy(vec![health_address.port(), admin_address.port()]));
    reconnect_loop(&config, &health, &policy, &shutdown).await;

    health_stop.cancel();
    let _ = health_server.await;
    let _ = admin_server.await;
    health_tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), health_tasks.wait()).await;
    info!("stopped");
    Ok(())
}

/// Connects, runs the session, and starts over with backoff, until shutdown.
async fn reconnect_loop(
    config: &Config,
    health: &Health,
    policy: &Arc<Policy>,
    shutdown: &CancellationToken,
) {
    let mut backoff = Backoff::new(config.sync_interval, config.sync_interval_cap);
    let mut rng = StdRng::from_os_rng();
    let mut first = true;
    while !shutdown.is_cancelled() {
        if !first {
            health.metrics().reconnecting();
        }
        first = false;
        let attempt = tokio::select! {
            attempt = server_connection::connect_to_server(config) => attempt,
            () = shutdown.cancelled() => break,
        };
        match attempt {
            Ok(connected) => {
                let started = Instant::now();
                let peer = connected.peer;
                info!(
                    server = %peer,
                    identifiers = %config.identifiers,
                    "connected to server"
                );
                health.set_connected(peer);
                let span = info_span!("session", server = %peer);
                let reason = session::run(connected, config, health, policy, shutdown)
                    .instrument(span)
                    .await;
                health.set_not_connected(format!("session with {peer} ended: {reason}"));
                if shutdown.is_cancelled() {
                    info!(server = %peer, %reason, "session closed");
                    break;
                }
                if started.elapsed() > HEALTHY_SESSION {
                    backoff.reset();
                }
                let delay = backoff.next_delay(&mut rng);
                warn!(server = %peer, %reason, retry_in = ?delay, "session with server ended");
                if !sleep_or_shutdown(delay, shutdown).await {
                    break;
                }
            }
            Err(error) => {
                health.set_not_connected(error.to_string());
                let delay = backoff.next_delay(&mut rng);
                match &error {
                    // The server looked at us and said no (bad identifiers, auth): that needs
                    // an operator, whatever the retries do.
                    ConnectError::Refused { status, body } => error!(
                        status = status.as_u16(),
                        reason = %body,
                        retry_in = ?delay,
                        "server refused the connection"
                    ),
                    _ => warn!(%error, retry_in = ?delay, "connecting to server failed"),
                }
                if !sleep_or_shutdown(delay, shutdown).await {
                    break;
                }
            }
        }
    }
}

/// Sleeps `delay`; false if shutdown came first.
async fn sleep_or_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = shutdown.cancelled() => false,
    }
}
