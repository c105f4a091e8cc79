//! What the health port shows: `/healthz`, `/readyz` (a session with a server?) and
//! `/metrics`; and the admin port's `/status` (every session) and `/config`, all read from
//! the shared [`Context`].

use bridgehead_runtime::health::{metrics_reply, Reply};
use http::StatusCode;

use crate::context::{Context, Status};

impl Context {
    /// One line per session, for `/status`.
    fn sessions_text(status: &Status) -> String {
        let mut text = String::new();
        for session in status.sessions.values() {
            text.push_str(&format!(
                "server {} at {}, up {}s{}\n",
                session.server_id,
                session.peer,
                session.since.elapsed().as_secs(),
                if session.draining { ", draining" } else { "" }
            ));
        }
        text
    }

    /// Answers one GET on the admin port; `config` is the configuration as text (paths, never
    /// keys or tokens).
    pub(crate) fn admin(&self, path: &str, config: &str) -> Reply {
        match path {
            "/status" => {
                let status = self.lock();
                let active = status.active().count();
                let summary = if status.shutting_down {
                    "shutting down".to_owned()
                } else if active == 0 {
                    format!("not connected: {}", status.last_problem)
                } else {
                    format!("connected to {active} of {} servers", status.known)
                };
                Reply::text(
                    StatusCode::OK,
                    format!(
                        "{summary}\n{}open tunnels: {}",
                        Self::sessions_text(&status),
                        self.metrics().streams_open()
                    ),
                )
            }
            "/config" => Reply::text(StatusCode::OK, config),
            _ => Reply::text(StatusCode::NOT_FOUND, "not found (try /status, /config)"),
        }
    }

    /// Answers one GET on the health port. Ready while at least one session is up and not
    /// draining: a server can route to this agent.
    pub(crate) fn reply(&self, path: &str) -> Reply {
        match path {
            "/healthz" | "/livez" => Reply::text(StatusCode::OK, "ok"),
            "/readyz" => {
                let status = self.lock();
                let active: Vec<&str> = status.active().map(|s| s.server_id.as_str()).collect();
                if status.shutting_down {
                    Reply::text(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                } else if active.is_empty() {
                    Reply::text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not connected to server: {}", status.last_problem),
                    )
                } else {
                    Reply::text(
                        StatusCode::OK,
                        format!(
                            "ok: connected to {} of {} servers ({})",
                            active.len(),
                            status.known,
                            active.join(", ")
                        ),
                    )
                }
            }
            "/metrics" => metrics_reply(self.registry()),
            _ => Reply::text(StatusCode::NOT_FOUND, "not found"),
        }
    }
}
