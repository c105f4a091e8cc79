//! `<prefix>_build_info{version="..."} 1`: which release a process runs, the metric a fleet's
//! dashboards and alerts join on during a rolling upgrade (as Prometheus' own
//! `prometheus_build_info`). The version is the workspace's (Cargo.toml), compiled in.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// Registers under a binary's prefix (`bridgehead_server`, `bridgehead_agent`).
#[derive(Debug, Default)]
pub struct BuildInfoCollector;

/// The version the metric reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

impl Collector for BuildInfoCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let gauge = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "build_info",
            "Always 1; the version of Bridgehead this process runs, as a label",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(family.encode_family(&[("version", VERSION)])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn one_series_with_the_workspace_version() {
        let mut root = Registry::default();
        root.sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(BuildInfoCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &root).unwrap();
        assert!(
            text.contains(&format!(
                "\nbridgehead_server_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(
            text.contains("# TYPE bridgehead_server_build_info gauge"),
            "{text}"
        );
    }
}
