//! `certificate_expiry_timestamp_seconds{role}` (under the registry's prefix): when each
//! certificate file a binary uses stops being valid, read from the files at every scrape so
//! that a rotated file shows its new date without a restart and a broken one shows none.
//!
//! A file holding several certificates (a chain, or a CA bundle during a rotation) reports
//! the earliest `notAfter` among them: the moment something in it expires, which is what an
//! expiry alert must see first.

use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// The metric's name under the registry's prefix.
pub const EXPIRY_METRIC: &str = "certificate_expiry_timestamp_seconds";

/// The certificate files of a binary, each with its role (`frontend`, `agent-endpoint`,
/// `frontend-client-ca`, ...).
#[derive(Debug, Clone)]
pub struct ExpiryCollector {
    files: Vec<(&'static str, PathBuf)>,
}

impl ExpiryCollector {
    pub fn new(files: Vec<(&'static str, PathBuf)>) -> ExpiryCollector {
        ExpiryCollector { files }
    }
}

/// The earliest `notAfter` of the PEM certificates in `path`, in seconds since the epoch.
pub fn earliest_not_after(path: &Path) -> anyhow::Result<i64> {
    let certs = crate::tls::load_certs(path)?;
    certs
        .iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der.as_ref())
                .map(|(_, cert)| cert.validity().not_after.timestamp())
                .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))
        })
        .try_fold(i64::MAX, |earliest, at| Ok(earliest.min(at?)))
}

impl Collector for ExpiryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dates: Vec<_> = self
            .files
            .iter()
            .filter_map(|(role, path)| Some((*role, earliest_not_after(path).ok()?)))
            .collect();
        if dates.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            EXPIRY_METRIC,
            "When the earliest certificate in each file this process uses expires (notAfter, seconds since the epoch), by role",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (role, at) in dates {
            let gauge = ConstGauge::new(at);
            gauge.encode(family.encode_family(&[("role", role)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem_with_not_after(year: i32) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, 1, 2);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn each_file_reports_its_earliest_expiry_and_a_broken_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let leaf = dir.path().join("leaf.crt");
        std::fs::write(&leaf, pem_with_not_after(2031)).unwrap();
        let bundle = dir.path().join("bundle.crt");
        std::fs::write(
            &bundle,
            pem_with_not_after(2040) + &pem_with_not_after(2030),
        )
        .unwrap();
        let broken = dir.path().join("broken.crt");
        std::fs::write(&broken, "not a certificate").unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        registry
            .sub_registry_with_prefix("bridgehead_test")
            .register_collector(Box::new(ExpiryCollector::new(vec![
                ("leaf", leaf),
                ("bundle", bundle),
                ("broken", broken),
                ("missing", dir.path().join("missing.crt")),
            ])));
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
        // 2031-01-02 and 2030-01-02, 00:00:00 UTC.
        for line in [
            "bridgehead_test_certificate_expiry_timestamp_seconds{role=\"leaf\"} 1925078400",
            "bridgehead_test_certificate_expiry_timestamp_seconds{role=\"bundle\"} 1893542400",
        ] {
            assert!(page.lines().any(|l| l == line), "{line:?} not in:\n{page}");
        }
        assert!(
            !page.contains("broken") && !page.contains("missing"),
            "{page}"
        );
    }
}
