//! A counter under a name without `_total`, for konnectivity's `*_count` counters
//! (`dial_failure_count`, `server_connection_failure_count`, `culled_leases_count`): Go's
//! client library exports them under exactly those names, and dashboards query them so.
//! OpenMetrics gives a counter's samples the `_total` suffix, so these are typed `unknown`;
//! Prometheus queries them the same way (`rate()` works on any series).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A monotonic count per value of one label (or one count, with no label). Clones share it.
#[derive(Debug, Clone)]
pub struct LegacyCounter {
    label: Option<&'static str>,
    counts: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl LegacyCounter {
    /// Counts by `label`'s values.
    pub fn with_label(label: &'static str) -> LegacyCounter {
        LegacyCounter {
            label: Some(label),
            counts: Arc::default(),
        }
    }

    /// One count, no label.
    pub fn single() -> LegacyCounter {
        LegacyCounter {
            label: None,
            counts: Arc::default(),
        }
    }

    /// Adds `n` for label value `value` (ignored without a label).
    pub fn inc_by(&self, value: &'static str, n: u64) {
        let key = if self.label.is_some() { value } else { "" };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(key).or_default() += n;
    }

    /// The count for `value` (the single count: any value).
    pub fn get(&self, value: &'static str) -> u64 {
        let key = if self.label.is_some() { value } else { "" };
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(key).copied().unwrap_or(0)
    }
}

impl TypedMetric for LegacyCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for LegacyCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<(&'static str, u64)> = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        match self.label {
            None => encoder.encode_gauge(&counts.first().map_or(0, |(_, n)| *n)),
            Some(label) => {
                for (value, n) in counts {
                    encoder.encode_family(&[(label, value)])?.encode_gauge(&n)?;
                }
                Ok(())
            }
        }
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_typed_unknown() {
        let mut registry = prometheus_client::registry::Registry::default();
        let failures = LegacyCounter::with_label("reason");
        let culled = LegacyCounter::single();
        registry.register("x_dial_failure_count", "Dial failures", failures.clone());
        registry.register("x_culled_leases_count", "Culled", culled.clone());
        failures.inc_by("no_agent", 1);
        failures.inc_by("no_agent", 2);
        failures.inc_by("backend_close", 1);
        culled.inc_by("", 4);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE x_dial_failure_count unknown"),
            "{text}"
        );
        assert!(
            text.contains("x_dial_failure_count{reason=\"no_agent\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_dial_failure_count{reason=\"backend_close\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("x_culled_leases_count 4\n"), "{text}");
        assert!(!text.contains("_total"), "{text}");
        assert_eq!(failures.get("no_agent"), 3);
    }
}
