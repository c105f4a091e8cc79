//! The upstream Kubernetes e2e suite's tests on the egress path (`e2e.test` of the release the
//! cluster runs, [`bridgehead_e2e::kubernetes::upstream`]) against the HA cluster
//! ([`RealCluster::start_ha`]: three control-plane nodes behind haproxy, two workers, no path
//! from any kube-apiserver to a kubelet or pod but Bridgehead): the specs `e2e/upstream/focus.txt`
//! selects and `skip.txt` leaves out must all pass, and the servers must have opened at least
//! one tunnel per spec. Its own test binary: it takes many minutes (docs/testing.md says how
//! many). Needs root, haproxy, Go and the module proxy (for the suite's first build),
//! `scripts/k8s-build.sh` and `scripts/install-test-deps.sh`; skipped loudly otherwise.

use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::images::Images;
use bridgehead_e2e::kubernetes::real_cluster::{metric_sum, RealCluster};
use bridgehead_e2e::kubernetes::upstream::Suite;
use bridgehead_e2e::kubernetes::{self};
use bridgehead_e2e::netns;

/// The whole test: the suite's build on a warm machine, the cluster's start and the run.
const TIMEOUT: Duration = Duration::from_secs(3600);
/// The suite's own bound (ginkgo's `--ginkgo.timeout`), inside the test's.
const SUITE_TIMEOUT: Duration = Duration::from_secs(3000);
const CONTROL_PLANES: usize = 3;
const WORKERS: u8 = 2;
/// The server's health port on each control-plane node (deploy/server-static-pod).
const HEALTH_PORT: u16 = 8134;

#[test]
fn upstream_e2e_suite_egress_specs_pass_through_bridgehead() {
    const TEST: &str = "upstream_e2e_suite_egress_specs_pass_through_bridgehead";
    let Some(binaries) = kubernetes::require_ha(TEST) else {
        return;
    };
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let started = Instant::now();
        // Go is there (require_ha): a suite that does not build is a failure, not a skip.
        let suite = Suite::get().unwrap_or_else(|e| panic!("building the suite: {e:#}"));
        eprintln!("suite built after {:?}", started.elapsed());
        let cluster = RealCluster::start_ha(&binaries, CONTROL_PLANES, WORKERS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("HA cluster up after {:?}", started.elapsed());
        // Only the workers run the suite's pods: the control-plane nodes are tainted.
        let sandbox = Images::get().unwrap().pause;
        for worker in &cluster.workers {
            suite
                .import(worker, &sandbox)
                .unwrap_or_else(|e| panic!("{e:#}"));
        }

        let before = tunnels(&cluster);
        let dir = tempfile::tempdir().unwrap();
        let ran = Instant::now();
        let report = suite
            .run(
                &cluster.control_plane.kubeconfig,
                &binaries.kubectl,
                dir.path(),
                SUITE_TIMEOUT,
            )
            .unwrap_or_else(|e| panic!("{e:#}"));
        let after = tunnels(&cluster);
        let passed = report.passed();
        eprintln!(
            "suite: {} of {} specs passed in {:?}; tunnels opened {before} -> {after}",
            passed.len(),
            report.will_run,
            ran.elapsed()
        );

        let failed = report.failed();
        if !failed.is_empty() {
            // Kept for whoever investigates: the suite's log and report.
            let kept = dir.keep();
            panic!(
                "{} of {} specs failed (log and report in {}):\n{}",
                failed.len(),
                report.will_run,
                kept.display(),
                failed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        // The focus selects specs, and each that was selected ran: a focus that matches
        // nothing, or a run cut short, passes nothing.
        assert!(report.will_run > 0, "the focus selected no spec");
        assert_eq!(
            passed.len() as u64,
            report.will_run,
            "specs selected and specs passed differ: {:#?}",
            report.specs
        );
        // Every spec reaches a pod or a kubelet from kube-apiserver at least once, and only
        // Bridgehead leads there.
        assert!(
            after - before >= passed.len() as f64,
            "the servers opened {} tunnels for {} specs",
            after - before,
            passed.len()
        );
    });
}

/// Tunnels the servers opened for their kube-apiservers, all control-plane nodes together
/// (a tunnel forwarded to a peer counts once, where its CONNECT came in).
fn tunnels(cluster: &RealCluster) -> f64 {
    cluster
        .apiservers()
        .iter()
        .map(|(host, _)| {
            let metrics = cluster.host_get(*host, HEALTH_PORT, "/metrics").unwrap();
            metric_sum(
                &metrics,
                "bridgehead_server_dials_total",
                &["result=\"ok\""],
            )
        })
        .sum()
}
