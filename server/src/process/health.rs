//! The routes of the server's two HTTP ports, by audience. The health port (for kubelet
//! probes and Prometheus, often reachable from the cluster): `/healthz`, `/readyz`,
//! `/metrics`. The admin port (loopback by default, for the operator): `/agents` (every agent,
//! its peer address, hosts, IPs and pod CIDRs) and `/config`.

use std::sync::Arc;

use bridgehead_runtime::health::{metrics_reply, Reply};
use http::StatusCode;

use crate::context::Context;

/// Answers one GET on the health port.
pub fn route(ctx: &Arc<Context>, path: &str) -> Reply {
    match path {
        "/healthz" | "/livez" => Reply::text(StatusCode::OK, "ok"),
        "/readyz" => match ctx.registry.ready() {
            Ok(()) => Reply::text(StatusCode::OK, "ok"),
            Err(reason) => Reply::text(StatusCode::SERVICE_UNAVAILABLE, reason),
        },
        "/metrics" => metrics_reply(ctx.metrics.registry()),
        _ => Reply::text(
            StatusCode::NOT_FOUND,
            "not found (try /healthz, /readyz, /metrics; /agents is on the admin port)",
        ),
    }
}

/// Answers one GET on the admin port; `config` is the validated configuration as text (it
/// holds paths, never keys or tokens).
pub fn admin(ctx: &Arc<Context>, config: &str, path: &str) -> Reply {
    match path {
        "/agents" => {
            let body = serde_json::json!({
                "server_id": ctx.config.routing.server_id,
                "agents": ctx.registry.views(),
            });
            Reply::with_type(StatusCode::OK, "application/json", format!("{body:#}\n"))
        }
        "/config" => Reply::text(StatusCode::OK, config),
        _ => Reply::text(StatusCode::NOT_FOUND, "not found (try /agents, /config)"),
    }
}
