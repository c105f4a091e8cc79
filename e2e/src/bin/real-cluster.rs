//! `real-cluster`: a real Kubernetes cluster on this machine with Bridgehead installed from deploy/
//! (the cluster `e2e/tests/cluster.rs` runs: a control plane, a control-plane node running the
//! server's static pod, workers running the agents' DaemonSet, every node pulling Bridgehead's
//! image from a registry on the control plane's host), plus a demo pod, until Ctrl-C. With
//! `--control-planes N` (2 to 6), N control-plane nodes behind haproxy, as `e2e/tests/ha_cluster.rs`
//! runs it ([`RealCluster::start_ha`]).
//! Run it with `scripts/cluster.sh` (root: it makes namespaces, mounts and cgroups, and removes
//! them at the end).

use bridgehead_e2e::kubernetes::real_cluster::{
    control_plane_name, RealCluster, AGENT_ENDPOINT_PORT, PEER_PORT, POD_READY,
};
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
    let mut control_planes = 1;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--workers" => workers = args.next().unwrap_or_default().parse()?,
            "--control-planes" => control_planes = args.next().unwrap_or_default().parse()?,
            other => anyhow::bail!(
                "unknown argument {other}; usage: real-cluster [--workers N] [--control-planes N]"
            ),
        }
    }
    if control_planes == 0 {
        anyhow::bail!("--control-planes: at least 1");
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
    let cluster = if control_planes == 1 {
        RealCluster::start(&binaries, workers)?
    } else {
        RealCluster::start_ha(&binaries, control_planes, workers)?
    };
    cluster.control_plane.apply(DEMO)?;
    cluster.control_plane.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/demo",
        &format!("--timeout={}s", POD_READY.as_secs()),
    ])?;
    match &cluster.endpoint {
        None => println!(
            "kube-apiserver {}; its cluster egress through bridgehead-server (a static pod on node control-plane)",
            cluster.control_plane.url
        ),
        Some(endpoint) => {
            println!(
                "load balancer {} (haproxy on {}): every kubeconfig names it",
                endpoint.url,
                control_plane_name(0)
            );
            for (host, kubeconfig) in cluster.apiservers() {
                println!(
                    "node {}: kube-apiserver https://{}:6443 (kubeconfig {}), its cluster egress through its own bridgehead-server (a static pod, peering with the others on {PEER_PORT})",
                    control_plane_name(host),
                    cluster.net.host(host).v4(),
                    kubeconfig.display()
                );
            }
            println!(
                "agents reach every server through the load balancer's port {AGENT_ENDPOINT_PORT}"
            );
        }
    }
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
