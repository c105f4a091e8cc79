//! The server's Prometheus metrics: Bridgehead's own (`bridgehead_server_*`), konnectivity's
//! names and meanings beside them (`konnectivity_network_proxy_server_*`, for dashboards and
//! alerts built on ANP), and the standard `process_*` series.
//!
//! Each part of the server has its series in a struct of its own, registered by its own
//! function, in the file of its name: [`Frontend`], [`Peering`], [`Agents`], [`Routing`] and
//! [`Process`] (what is no one part's), read as `ctx.metrics.routing.dial(...)`.
//! konnectivity's names are registered in one place (`konnectivity.rs`), in ANP's order, from
//! the parts' series that count them.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

mod agents;
mod frontend;
mod konnectivity;
mod peering;
mod process;
mod routing;

pub use agents::{AgentHandshake, Agents, TokenReviews};
pub use frontend::{Direction, Frontend};
pub use peering::{Peering, MAX_SERVER_LABELS, OTHER_SERVERS};
pub use process::Process;
pub use routing::{DialResult, Routing};

/// Every metric the server exports, registered once, by part.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub frontend: Frontend,
    pub peering: Peering,
    pub agents: Agents,
    pub routing: Routing,
    pub process: Process,
}

impl Metrics {
    /// The server's metrics, `budget`'s and `earned`'s among them.
    pub fn new(
        budget: &bridgehead_proto::budget::Budget,
        earned: &Arc<bridgehead_mux::memory::EarnedTotal>,
    ) -> Metrics {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(
            bridgehead_runtime::process_metrics::ProcessCollector,
        ));
        registry.register_collector(Box::new(bridgehead_runtime::build::BuildInfoCollector));
        let own = registry.sub_registry_with_prefix("bridgehead_server");
        own.register_collector(Box::new(bridgehead_runtime::logging::DroppedCollector));
        let budget = budget.clone();
        own.register_collector(Box::new(bridgehead_runtime::memory::BudgetCollector(
            move || (budget.buffered(), budget.limit(), budget.refused()),
        )));
        own.register_collector(Box::new(bridgehead_runtime::memory::EarnedCollector(
            earned.clone(),
        )));
        let frontend = Frontend::register(own);
        let peering = Peering::register(own);
        let agents = Agents::register(own);
        let routing = Routing::register(own);
        let process = Process::register(own);
        konnectivity::register(
            registry.sub_registry_with_prefix("konnectivity_network_proxy_server"),
            &frontend,
            &agents,
            &routing,
            &process,
        );
        Metrics {
            registry,
            frontend,
            peering,
            agents,
            routing,
            process,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Exports when each of `files` (role, path) expires, read at every scrape.
    pub fn watch_certificates(&mut self, files: Vec<(&'static str, std::path::PathBuf)>) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(
                bridgehead_runtime::certificates::ExpiryCollector::new(files),
            ));
    }

    /// Exports how old the local token verifier's watched state is, read at every scrape.
    pub fn watch_token_verifier(
        &mut self,
        verifier: bridgehead_kubeapi::serviceaccount::TokenVerifier,
    ) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(agents::VerifierCollector(verifier)));
    }

    /// Exports the requests of the server's Kubernetes client, read at every scrape.
    pub fn watch_kube_requests(&mut self, requests: bridgehead_kubeapi::RequestCounts) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(process::KubeRequestsCollector(requests)));
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(
            &bridgehead_proto::budget::Budget::unlimited(),
            &Arc::new(bridgehead_mux::memory::EarnedTotal::new(0)),
        )
    }
}

/// The label of the families counted by result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Registers `metric` under `name` and hands it back.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// Creates the series of every label value up front, so that rates and ratios over them
/// have data (zero) on a fleet where nothing went wrong yet.
fn preset<L, M>(family: &Family<L, M>, labels: impl IntoIterator<Item = L>)
where
    L: Clone + std::hash::Hash + Eq,
    M: Default,
{
    for label in labels {
        let _ = family.get_or_create(&label);
    }
}

fn results(values: impl IntoIterator<Item = &'static str>) -> impl Iterator<Item = ResultLabel> {
    values.into_iter().map(|result| ResultLabel { result })
}

/// One holder's share of a gauge that several add to: set to what the holder holds now, taken
/// back out when it is dropped.
#[derive(Debug)]
pub struct GaugeShare<'a> {
    gauge: &'a Gauge,
    held: i64,
}

impl<'a> GaugeShare<'a> {
    pub fn new(gauge: &'a Gauge) -> GaugeShare<'a> {
        GaugeShare { gauge, held: 0 }
    }

    /// This holder now holds `held`.
    pub fn set(&mut self, held: usize) {
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        self.gauge.inc_by(held - self.held);
        self.held = held;
    }
}

impl Drop for GaugeShare<'_> {
    fn drop(&mut self) {
        self.gauge.dec_by(self.held);
    }
}

/// Decrements its gauge when dropped.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Raises `gauge` by one until the guard is dropped.
    pub fn inc(gauge: &Gauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::router::Strategy;
    use bridgehead_kubeapi::leases::LeaseEvent;

    fn page(metrics: &Metrics) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        text
    }

    #[test]
    fn each_share_of_a_gauge_is_taken_back_when_dropped() {
        let gauge = Gauge::default();
        let mut a = GaugeShare::new(&gauge);
        let mut b = GaugeShare::new(&gauge);
        a.set(100);
        b.set(30);
        a.set(60);
        assert_eq!(gauge.get(), 90);
        drop(a);
        assert_eq!(gauge.get(), 30);
        drop(b);
        assert_eq!(gauge.get(), 0);
    }

    /// A peer names itself: the ids past the bound share one series instead of growing the
    /// page (and the server) without end.
    #[test]
    fn peer_server_ids_make_a_bounded_number_of_series() {
        let metrics = Metrics::default();
        for i in 0..MAX_SERVER_LABELS + 100 {
            metrics.peering.peer_tunnel(&format!("peer-{i}"));
            metrics.peering.forwarded(&format!("peer-{i}"));
        }
        // One already known keeps its own series.
        metrics.peering.peer_tunnel("peer-0");
        let text = page(&metrics);
        let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        let peer_tunnels = "bridgehead_server_peer_tunnels_total{";
        assert_eq!(series(peer_tunnels), MAX_SERVER_LABELS + 1);
        assert_eq!(
            series("bridgehead_server_tunnels_forwarded_total{"),
            MAX_SERVER_LABELS + 1
        );
        assert!(
            text.contains(&format!("{peer_tunnels}server=\"other\"}} 100\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{peer_tunnels}server=\"peer-0\"}} 2\n")),
            "{text}"
        );
    }

    #[test]
    fn konnectivity_series_mean_what_anps_do() {
        let metrics = Metrics::new(
            &bridgehead_proto::budget::Budget::unlimited(),
            &Arc::new(bridgehead_mux::memory::EarnedTotal::new(0)),
        );
        for result in [
            DialResult::Ok,
            DialResult::BadRequest,
            DialResult::Overloaded,
            DialResult::NoAgent,
            DialResult::Refused,
            DialResult::Unreachable,
            DialResult::NameNotResolved,
            DialResult::NotPermitted,
            DialResult::Other,
            DialResult::TimedOut,
            DialResult::AgentLost,
        ] {
            metrics.routing.dial(result);
        }
        metrics.routing.anp_dial_failure("frontend_close");
        metrics.routing.dialed(0.002);
        metrics.frontend.tunnel_ended(3.0);
        metrics.process.lease(LeaseEvent::Renewed);
        metrics.process.lease(LeaseEvent::RenewFailed);
        metrics.process.lease(LeaseEvent::Removed);
        metrics
            .routing
            .set_ready_backends(&[(Strategy::DestHost, 2), (Strategy::Default, 5)]);
        let open = metrics.frontend.http_connection();
        let second = metrics.frontend.http_connection();
        drop(second);
        let text = page(&metrics);
        let anp = "konnectivity_network_proxy_server_";
        for line in [
            // Malformed and overloaded requests never reached a dial: not dial failures.
            format!("{anp}dial_failure_count{{reason=\"no_agent\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"error_response\"}} 5\n"),
            format!("{anp}dial_failure_count{{reason=\"backend_dial_timeout\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"backend_close\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"frontend_close\"}} 1\n"),
            format!("{anp}dial_duration_seconds_count 1\n"),
            format!("{anp}dial_duration_seconds_bucket{{le=\"0.005\"}} 1\n"),
            format!("{anp}dial_duration_seconds_bucket{{le=\"0.0001\"}} 0\n"),
            format!("{anp}connection_duration_seconds_bucket{{le=\"5.0\"}} 1\n"),
            format!("{anp}connection_duration_seconds_bucket{{le=\"1.0\"}} 0\n"),
            format!("{anp}http_connections 1\n"),
            format!("{anp}culled_leases_count 1\n"),
            format!("{anp}ready_backends{{proxy_strategy=\"destHost\"}} 2\n"),
            format!("{anp}ready_backends{{proxy_strategy=\"default\"}} 5\n"),
            "bridgehead_server_dial_duration_seconds_count 1\n".to_owned(),
            "bridgehead_server_leases_removed_total 1\n".to_owned(),
            "bridgehead_server_lease_renewals_total{result=\"ok\"} 1\n".to_owned(),
            "bridgehead_server_lease_renewals_total{result=\"error\"} 1\n".to_owned(),
        ] {
            assert!(text.contains(&line), "{line}{text}");
        }
        assert_eq!(text.matches("dial_failure_count{").count(), 5, "{text}");
        drop(open);
        assert!(page(&metrics).contains(&format!("{anp}http_connections 0\n")));
    }
}
