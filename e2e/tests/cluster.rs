//! A real cluster on one machine ([`RealCluster`]): kubelet, containerd and runc on node
//! hosts, bridgehead-server run by the control-plane node's kubelet from deploy/'s static pod
//! manifest, the agents from deploy/'s DaemonSet, both from the image `scripts/image.sh` builds.
//! kube-apiserver's namespace has no route to a worker node; everything kubectl does with a
//! pod there goes through Bridgehead, and each test checks what kubectl hands back byte for
//! byte. Needs root, `scripts/k8s-build.sh` and `scripts/install-test-deps.sh`; skipped loudly
//! otherwise.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use bridgehead_e2e::kubernetes::real_cluster::{RealCluster, CONTROL_PLANE_HOST, POD_READY};
use bridgehead_e2e::kubernetes::{self};
use bridgehead_e2e::netns;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(600);

/// The workload pod on worker-1: prints five lines, then waits.
const SHELL_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: shell
  namespace: default
spec:
  nodeName: worker-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: shell
    image: bridgehead.invalid/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, 'for i in 1 2 3 4 5; do echo log line $i; done; exec sleep 3600']
";

#[test]
fn kubectl_logs_and_exec_reach_a_real_pod_through_bridgehead_installed_from_deploy() {
    const TEST: &str =
        "kubectl_logs_and_exec_reach_a_real_pod_through_bridgehead_installed_from_deploy";
    let Some(binaries) = kubernetes::require_nodes(TEST) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let cluster = RealCluster::start(&binaries, 1).unwrap_or_else(|e| panic!("{e:#}"));
        let worker = &cluster.workers[0];

        // kube-apiserver's namespace cannot reach the worker's kubelet by itself.
        let direct = cluster.net.run_in(
            CONTROL_PLANE_HOST,
            &[
                "curl",
                "-sk",
                "--max-time",
                "5",
                &format!("https://{}:10250/healthz", worker.node_ip),
            ],
        );
        assert!(
            direct.is_err(),
            "the control plane reached the worker's kubelet directly: {direct:?}"
        );

        cluster.control_plane.apply(SHELL_POD).unwrap();
        let ready = cluster
            .control_plane
            .kubectl(&[
                "wait",
                "--for=condition=Ready",
                "pod/shell",
                &format!("--timeout={}s", POD_READY.as_secs()),
            ])
            .unwrap();
        assert!(
            ready.status.success(),
            "pod not Ready: {}\n{}\nkubelet:\n{}",
            String::from_utf8_lossy(&ready.stderr),
            cluster.describe_pods("default"),
            worker.kubelet_log()
        );

        let tunnels_before = tunnels(&cluster);
        // kubectl logs: the kubelet's containerLogs, through the agent on worker-1.
        let logs = cluster
            .control_plane
            .kubectl_ok(&["logs", "shell"])
            .unwrap();
        assert_eq!(
            logs,
            "log line 1\nlog line 2\nlog line 3\nlog line 4\nlog line 5\n"
        );

        // kubectl exec -i: 1 MiB of every byte value through cat and back, and the command's
        // exit status carried back as kubectl's.
        let input: Vec<u8> = (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut exec = Command::new(&cluster.control_plane.binaries.kubectl)
            .arg(format!(
                "--kubeconfig={}",
                cluster.control_plane.kubeconfig.display()
            ))
            .args(["exec", "-i", "shell", "--", "sh", "-c", "cat; exit 3"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = exec.stdin.take().unwrap();
        let feed = {
            let input = input.clone();
            std::thread::spawn(move || {
                stdin.write_all(&input).unwrap();
            })
        };
        let output = exec.wait_with_output().unwrap();
        feed.join().unwrap();
        assert_eq!(
            output.status.code(),
            Some(3),
            "kubectl exec: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.stdout == input,
            "exec's output differs from its input ({} bytes back of {})",
            output.stdout.len(),
            input.len()
        );

        // Both went through the server: it counted tunnels for them.
        let tunnels_after = tunnels(&cluster);
        assert!(
            tunnels_after >= tunnels_before + 2.0,
            "tunnels before {tunnels_before}, after {tunnels_after}"
        );
    });
}

/// The tunnels the server has opened so far (`bridgehead_server_dials_total{result="ok"}`).
fn tunnels(cluster: &RealCluster) -> f64 {
    let metrics = cluster.server_health("/metrics").unwrap();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("bridgehead_server_dials_total{") && line.contains("result=\"ok\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
