//! The series of what is no one part's: this server's Lease, the handshakes every listener
//! cut, and the requests of the Kubernetes client.

use bridgehead_runtime::legacy_counter::LegacyCounter;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{preset, registered, results, ResultLabel};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

/// The process's series.
#[derive(Debug)]
pub struct Process {
    lease_renewals: Family<ResultLabel, Counter>,
    leases_removed: Counter,
    /// `handshakes_refused{listener}`: the frontend's, the agent port's and the peer port's.
    handshakes_refused: Family<ListenerLabel, Counter>,
    /// konnectivity's `culled_leases_count` (registered in `konnectivity.rs`).
    pub(super) anp_culled_leases: LegacyCounter,
}

impl Process {
    /// The process's series, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Process {
        let lease_renewals = registered(r, "lease_renewals", "This server's Lease created or renewed (result: ok, error), with --enable-lease-controller", Family::default());
        let leases_removed = registered(
            r,
            "leases_removed",
            "Expired Leases of other servers deleted, with --enable-lease-controller",
            Counter::default(),
        );
        let handshakes_refused = registered(r, "handshakes_refused", "Handshakes cut because their listener had its limit in progress and a newer connection came (listener: frontend, agent, peer)", Family::default());
        preset(&lease_renewals, results(["ok", "error"]));
        preset(
            &handshakes_refused,
            ["frontend", "agent", "peer"].map(|listener| ListenerLabel { listener }),
        );
        Process {
            lease_renewals,
            leases_removed,
            handshakes_refused,
            anp_culled_leases: LegacyCounter::single(),
        }
    }

    /// What the Lease holder did.
    pub fn lease(&self, event: bridgehead_kubeapi::leases::LeaseEvent) {
        use bridgehead_kubeapi::leases::LeaseEvent;
        let result = match event {
            LeaseEvent::Renewed => "ok",
            LeaseEvent::RenewFailed => "error",
            LeaseEvent::Removed => {
                self.leases_removed.inc();
                self.anp_culled_leases.inc_by("", 1);
                return;
            }
        };
        self.lease_renewals
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// A handshake cut: `listener` had its limit in progress and a newer connection came.
    pub fn handshake_refused(&self, listener: &'static str) {
        self.handshakes_refused
            .get_or_create(&ListenerLabel { listener })
            .inc();
    }
}

/// `bridgehead_server_kube_apiserver_requests_total{verb, resource}`: every request the
/// server's Kubernetes client made, named as kube-apiserver's `apiserver_request_total` names
/// them, read at every scrape.
#[derive(Debug)]
pub(super) struct KubeRequestsCollector(pub(super) bridgehead_kubeapi::RequestCounts);

impl prometheus_client::collector::Collector for KubeRequestsCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut family = encoder.encode_descriptor(
            "kube_apiserver_requests",
            "Requests this server made to kube-apiserver (token reviews, Node reads, watches and their lists, issuer discovery, Leases), by verb and resource as kube-apiserver's apiserver_request_total names them",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (verb, resource, n) in self.0.snapshot() {
            let counter = ConstCounter::new(n);
            counter.encode(
                family.encode_family(&[("verb", verb), ("resource", resource.as_str())])?,
            )?;
        }
        Ok(())
    }
}
