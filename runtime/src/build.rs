//! The build this process runs: its version and commit (`bridgehead_build_info`'s constants),
//! logged on the first line and exported as `bridgehead_build_info{version, commit} 1`, so a
//! fleet's dashboards show which build each pod runs and a log names the build it came from.
//!
//! konnectivity exports no build-information series, so there is no ANP twin.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

pub use bridgehead_build_info::{COMMIT, VERSION, VERSION_AND_COMMIT};

/// Logs `program`'s version and commit: the first line a binary writes once logging is set up.
pub fn log_start(program: &'static str) {
    tracing::info!(program, version = VERSION, commit = COMMIT, "starting");
}

/// `bridgehead_build_info{version, commit} 1`. Registers with
/// [`prometheus_client::registry::Registry::register_collector`] on a registry without a
/// prefix: the name is the same for the server and the agent (a `job` label tells them apart),
/// as Kubernetes' own `kubernetes_build_info`.
#[derive(Debug, Default)]
pub struct BuildInfoCollector;

impl Collector for BuildInfoCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let gauge = ConstGauge::new(1);
        let mut family = encoder.encode_descriptor(
            "bridgehead_build_info",
            "Always 1: the version and the commit this process was built from, as labels",
            None,
            gauge.metric_type(),
        )?;
        let labels = [("version", VERSION), ("commit", COMMIT)];
        gauge.encode(family.encode_family(&labels)?)
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn the_metric_names_version_and_commit() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(BuildInfoCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = format!("bridgehead_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1");
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        assert!(
            text.contains("# TYPE bridgehead_build_info gauge"),
            "{text}"
        );
    }
}
