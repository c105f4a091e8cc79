//! konnectivity's series (`konnectivity_network_proxy_server_*`), for dashboards and alerts
//! built on ANP: registered here in one place and in ANP's order, from the parts that count
//! them (their own series where Bridgehead has a twin of the same meaning).

use prometheus_client::registry::Registry;

use super::{Agents, Frontend, Process, Routing};

/// konnectivity's series under its names in `r`.
pub(super) fn register(
    r: &mut Registry,
    frontend: &Frontend,
    agents: &Agents,
    routing: &Routing,
    process: &Process,
) {
    r.register(
        "dial_duration_seconds",
        "Latency of dial to the remote endpoint in seconds",
        routing.anp_dial_duration.clone(),
    );
    r.register("dial_failure_count", "Number of dial failures observed (reason: no_agent, error_response, backend_dial_timeout, backend_close, frontend_close)", routing.anp_dial_failures.clone());
    r.register("connection_duration_seconds", "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed", frontend.anp_connection_duration.clone());
    r.register(
        "http_connections",
        "Number of current HTTP CONNECT connections",
        frontend.anp_http_connections.clone(),
    );
    r.register(
        "ready_backend_connections",
        "Number of agents connected to the proxy server (deprecated in ANP for ready_backends)",
        agents.agents_connected.clone(),
    );
    r.register(
        "ready_backends",
        "Number of usable agents connected to the proxy server, per proxy strategy",
        routing.anp_ready_backends.clone(),
    );
    r.register(
        "pending_backend_dials",
        "Current number of pending backend dial requests",
        routing.dials_pending.clone(),
    );
    r.register(
        "established_connections",
        "Current number of established end-to-end connections (post-dial)",
        frontend.tunnels_open.clone(),
    );
    r.register(
        "culled_leases_count",
        "Count of expired leases that the lease garbage collection controller has culled",
        process.anp_culled_leases.clone(),
    );
}
