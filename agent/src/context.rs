//! The agent's shared context: where it stands with its servers (the sessions the
//! supervisor holds, why the last attempt failed), its metrics and its tunnels' memory. The
//! supervisor (`servers.rs`) and the sessions change it; the health ports (`health.rs`) show
//! it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bridgehead_mux::memory::TunnelMemory;
use prometheus_client::registry::Registry;

use crate::metrics::Metrics;

/// One session with a server, as `/readyz` and `/status` show it.
#[derive(Debug, Clone)]
pub(crate) struct SessionView {
    pub(crate) server_id: String,
    pub(crate) peer: SocketAddr,
    pub(crate) since: Instant,
    pub(crate) draining: bool,
}

/// Where the agent stands with its servers.
#[derive(Debug)]
pub(crate) struct Status {
    /// Live sessions by the supervisor's key.
    pub(crate) sessions: BTreeMap<u64, SessionView>,
    /// Why the last attempt failed or the last session ended.
    pub(crate) last_problem: String,
    /// How many servers the agent looks for.
    pub(crate) known: u32,
    pub(crate) shutting_down: bool,
}

impl Status {
    pub(crate) fn active(&self) -> impl Iterator<Item = &SessionView> {
        self.sessions.values().filter(|s| !s.draining)
    }
}

/// What the agent's sessions, tunnels and health ports share: where it stands with its
/// servers, its metrics, and its tunnels' memory. Clones share them.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) status: Mutex<Status>,
    pub(crate) registry: Registry,
    metrics: Metrics,
    /// The tunnels' memory: the budget every session's buffered data counts against, the
    /// kernel buffers of every target socket, the largest window.
    memory: TunnelMemory,
}

impl Context {
    /// The shared context of an agent of `server`, its metrics showing `memory`'s budget and
    /// what target sockets earned, and when each of `certificates` (role, file) expires.
    pub(crate) fn new(
        server: &str,
        memory: TunnelMemory,
        certificates: Vec<(&'static str, std::path::PathBuf)>,
    ) -> Context {
        let metrics = Metrics::new();
        let mut root = Registry::default();
        root.register_collector(Box::new(
            bridgehead_runtime::process_metrics::ProcessCollector,
        ));
        root.register_collector(Box::new(bridgehead_runtime::build::BuildInfoCollector));
        let registry = root.sub_registry_with_prefix("bridgehead_agent");
        registry.register_collector(Box::new(bridgehead_runtime::logging::DroppedCollector));
        registry.register_collector(Box::new(
            bridgehead_runtime::certificates::ExpiryCollector::new(certificates),
        ));
        let shown = memory.budget.clone();
        registry.register_collector(Box::new(bridgehead_runtime::memory::BudgetCollector(
            move || (shown.buffered(), shown.limit(), shown.refused()),
        )));
        registry.register_collector(Box::new(bridgehead_runtime::memory::EarnedCollector(
            memory.earned.clone(),
        )));
        metrics.register(registry);
        // konnectivity's names, for dashboards built on them.
        metrics.register_anp(root.sub_registry_with_prefix("konnectivity_network_proxy_agent"));
        Context {
            inner: Arc::new(Inner {
                status: Mutex::new(Status {
                    sessions: BTreeMap::new(),
                    last_problem: format!("connecting to {server}"),
                    known: 1,
                    shutting_down: false,
                }),
                registry: root,
                metrics,
                memory,
            }),
        }
    }

    /// Where every series is registered, for `/metrics`.
    pub(crate) fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The tunnels' memory: budget, target sockets' buffers, largest window.
    pub(crate) fn memory(&self) -> &TunnelMemory {
        &self.inner.memory
    }

    /// Session `key` with `server_id` at `peer` is up.
    pub(crate) fn session_opened(&self, key: u64, server_id: &str, peer: SocketAddr) {
        self.update(|status| {
            status.sessions.insert(
                key,
                SessionView {
                    server_id: server_id.to_owned(),
                    peer,
                    since: Instant::now(),
                    draining: false,
                },
            );
        });
    }

    /// Session `key`'s server drains.
    pub(crate) fn session_draining(&self, key: u64) {
        self.update(|status| {
            if let Some(session) = status.sessions.get_mut(&key) {
                session.draining = true;
            }
        });
    }

    /// Session `key` ended, for `reason`.
    pub(crate) fn session_closed(&self, key: u64, reason: String) {
        self.update(|status| {
            if let Some(session) = status.sessions.remove(&key) {
                status.last_problem = format!(
                    "session with server {} at {} ended: {reason}",
                    session.server_id, session.peer
                );
            }
        });
    }

    /// An attempt to reach a server failed.
    pub(crate) fn attempt_failed(&self, reason: String) {
        self.update(|status| status.last_problem = reason);
    }

    /// The agent looks for `count` servers.
    pub(crate) fn set_known(&self, count: u32) {
        self.update(|status| status.known = count);
    }

    pub(crate) fn set_shutting_down(&self) {
        self.update(|status| status.shutting_down = true);
    }

    /// Changes the status and sets the gauges that follow it.
    fn update(&self, change: impl FnOnce(&mut Status)) {
        let mut status = self.lock();
        change(&mut status);
        let active = status.active().count() as i64;
        let all = status.sessions.len() as i64;
        self.inner
            .metrics
            .show_sessions(active, all, i64::from(status.known));
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Status> {
        self.inner
            .status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
