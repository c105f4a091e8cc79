//! `real-cluster`: a real Kubernetes cluster on this machine with Bridgehead installed from deploy/
//! (the cluster `e2e/tests/cluster.rs` runs: a control plane, a control-plane node running the
//! server's static pod, workers running the agents' DaemonSet, every node pulling Bridgehead's
//! image from a registry on the control plane's host), plus a demo pod, until Ctrl-C.
//! Run it with `scripts/cluster.sh` (root: it makes namespaces, mounts and cgroups, and removes
//! them at the end).

use bridgehead_e2e::kubernetes::real_cluster::{RealCluster, POD_READY};
use bridgehead_e2e::kubernetes::Binaries;

/// The demo workload: a shell that serves a declared port (busybox httpd on 8080).
const DEMO: &str = "apiVersion: v1
kind: Pod
metadata:
  name: demo
  namespace: default
spec:
  nodeName: worker-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: demo
    image: bridgehead.invalid/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && echo hello from $(hostname) > /www/index.html && echo serving on 8080 && exec httpd -f -p 8080 -h /www']
    ports:
    - name: http
      containerPort: 8080
";

fn main() -> anyhow::Result<()> {
    let mut workers = 2;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--workers" => workers = args.next().unwrap_or_default().parse()?,
            other => anyhow::bail!("unknown argument {other}; usage: real-cluster [--workers N]"),
        }
    }
    if workers == 0 {
        anyhow::bail!("--workers: at least 1 (the demo pod runs on worker-1)");
    }
    if !bridgehead_e2e::netns::is_root() {
        anyhow::bail!("needs root: it makes namespaces, mounts and cgroups for its nodes");
    }
    let Some(binaries) = Binaries::find() else {
        anyhow::bail!("the Kubernetes binaries are not built: run scripts/k8s-build.sh");
    };
    let cluster = RealCluster::start(&binaries, workers)?;
    cluster.control_plane.apply(DEMO)?;
    cluster.control_plane.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/demo",
        &format!("--timeout={}s", POD_READY.as_secs()),
    ])?;
    println!(
        "kube-apiserver {}; its cluster egress through bridgehead-server (a static pod on node control-plane)",
        cluster.control_plane.url
    );
    println!(
        "registry https://{host} (CNCF Distribution, its CA in {ca}): every node pulled {image} from it",
        host = cluster.registry.host,
        ca = cluster.registry.cert_dir.join("ca.crt").display(),
        image = cluster.registry.image(&format!(
            "{}:{}",
            bridgehead_e2e::kubernetes::real_cluster::REPOSITORY,
            cluster.version
        )),
    );
    for worker in &cluster.workers {
        println!(
            "node {}: kubelet at {} (no route from the control plane: only through Bridgehead), pods on {}",
            worker.name, worker.node_ip, worker.pod_cidr
        );
    }
    println!("\nTry:");
    println!("  kubectl=$PWD/target/k8s/bin/kubectl");
    println!("  $kubectl get pods -A -o wide");
    println!("  $kubectl exec -it demo -- sh");
    println!("  $kubectl logs demo");
    println!("  $kubectl port-forward pod/demo 8080:http   # then: curl localhost:8080");
    println!(
        "  scripts/push-image.sh ARCHIVE {}/REPOSITORY:TAG --cert-dir {}   # another image for the nodes",
        cluster.registry.host,
        cluster.registry.cert_dir.display()
    );
    println!("Ctrl-C stops everything and removes it.");
    println!(
        "export KUBECONFIG={}",
        cluster.control_plane.kubeconfig.display()
    );
    bridgehead_e2e::process::until_interrupted()?;
    drop(cluster);
    Ok(())
}
