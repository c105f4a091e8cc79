//! A worker's kubelet and containerd restarted under the loop (see the test's doc).

use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::drill::Kind;
use bridgehead_e2e::kubernetes::node_host::NodeHost;
use bridgehead_e2e::kubernetes::real_cluster::RealCluster;

use super::{assert_every_kind_ran, start_loop, KEEPALIVE_BOUND};

/// How long a restarted kubelet may take to answer on its port.
const KUBELET_BACK: Duration = Duration::from_secs(60);
/// The first worker's kubelet and containerd restarted under the loop: both killed (kubelet
/// first, so that it sees no container go), containerd started again, then kubelet. Pods run
/// on (containerd's shims hold them); the agent on that worker may restart or not (counted).
pub(super) fn kubelet_and_containerd_restarted(cluster: &mut RealCluster, pods: &[String]) {
    let (pod, other_pod) = (&pods[0], &pods[1]);
    let name = cluster.workers[0].name.clone();
    let agent_before = agent_on(cluster, &name);
    let run = start_loop(cluster, pods);
    std::thread::sleep(Duration::from_secs(5)); // the loop's lead, not a wait for anything
    let down_at = run.now();
    let worker = &mut cluster.workers[0];
    worker.kill_kubelet();
    worker.restart_containerd().unwrap();
    worker.start_kubelet().unwrap();
    let serving = wait_kubelet_serving(worker, KUBELET_BACK);
    let up_at = run.now();
    // Long enough after it is back for the bound to pass and a few rounds to run.
    std::thread::sleep(KEEPALIVE_BOUND + Duration::from_secs(10)); // the drill's length after
    let report = run.stop();
    let agent_after = agent_on(cluster, &name);
    let last_failure = report
        .failures
        .iter()
        .filter(|failure| &failure.pod == pod && failure.kind != Kind::Follow)
        .map(|failure| failure.at)
        .max();
    eprintln!(
        "drill: {name}'s kubelet and containerd restarted from {:.1} s, its kubelet answering {serving:?} after its start ({:.1} s); its pod's last failed request ended {:?} s; its agent pod (name, restarts) before {agent_before:?}, after {agent_after:?}: {report}",
        down_at.as_secs_f64(),
        up_at.as_secs_f64(),
        last_failure.map(|at| at.as_secs_f64()),
    );
    assert_every_kind_ran(&report);
    let other: Vec<_> = report
        .failures
        .iter()
        .filter(|failure| &failure.pod == other_pod)
        .collect();
    assert!(
        other.is_empty(),
        "the other worker's pod failed: {other:#?}\n{report}"
    );
    // Into its pod: only what ran while it was down, nothing before, nothing started once the
    // bound after its return had passed.
    let outside: Vec<_> = report
        .failures
        .iter()
        .filter(|failure| {
            failure.at < down_at
                || (failure.kind != Kind::Follow && failure.started > up_at + KEEPALIVE_BOUND)
        })
        .collect();
    assert!(
        outside.is_empty(),
        "failures outside the restart (down from {down_at:?}, back at {up_at:?}): {outside:#?}\n{report}"
    );
    assert_eq!(report.of(Kind::Follow).failed, 0, "{report}");
}

/// The agent pod on node `node`: its name and its container's restart count.
fn agent_on(cluster: &RealCluster, node: &str) -> String {
    cluster
        .control_plane
        .kubectl_ok(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=bridgehead-agent",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].restartCount}{end}",
        ])
        .unwrap_or_else(|e| format!("{e:#}"))
}

/// Waits (bounded poll: kubelet logs no line that says it serves) until `worker`'s kubelet
/// answers HTTPS on its port, at most `within`; how long that took.
fn wait_kubelet_serving(worker: &NodeHost, within: Duration) -> Duration {
    let started = Instant::now();
    let url = format!("https://{}:10250/healthz", worker.node_ip);
    loop {
        let code = worker
            .run(&[
                "curl",
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "2",
                &url,
            ])
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        // Any status (401 without credentials) is kubelet serving; 000 is no answer.
        if code.len() == 3 && code != "000" {
            return started.elapsed();
        }
        if started.elapsed() > within {
            let log = worker.kubelet_log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "{}'s kubelet does not answer after {within:?}; its last lines, newest first:\n{}",
                worker.name,
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
