//! The health port's routes: `/healthz`, `/readyz`, `/metrics`, `/agents`.

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
        "/agents" => {
            let body = serde_json::json!({
                "server_id": ctx.server_id,
                "agents": ctx.registry.views(),
            });
            Reply::with_type(StatusCode::OK, "application/json", format!("{body:#}\n"))
        }
        _ => Reply::text(
            StatusCode::NOT_FOUND,
            "not found (try /healthz, /readyz, /metrics, /agents)",
        ),
    }
}
