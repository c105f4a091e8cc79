//! `control-plane`: the e2e tests' Kubernetes cluster, by hand — a real etcd and
//! kube-apiserver whose egress selector goes through a bridgehead-server, and node test hosts
//! with stand-ins and agents — until Ctrl-C. Run it with `scripts/control-plane.sh` (root:
//! it makes network namespaces).

use bridgehead_e2e::kubernetes::cluster::{Auth, Cluster};
use bridgehead_e2e::kubernetes::node::NAMESPACE;
use bridgehead_e2e::kubernetes::Binaries;

fn main() -> anyhow::Result<()> {
    let mut nodes = 2;
    let mut auth = Auth::Tokens { bind: true };
    let mut tcp = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nodes" => nodes = args.next().unwrap_or_default().parse()?,
            "--certificates" => auth = Auth::Certificates,
            "--mtls" => {
                tcp = true;
                auth = Auth::Certificates;
            }
            other => anyhow::bail!(
                "unknown argument {other}; usage: control-plane [--nodes N] [--certificates] [--mtls]"
            ),
        }
    }
    if !bridgehead_e2e::netns::is_root() {
        anyhow::bail!("needs root: it creates network namespaces for the control plane and nodes");
    }
    let Some(binaries) = Binaries::find() else {
        anyhow::bail!("kube-apiserver, etcd, kubectl not built: run scripts/k8s-build.sh");
    };
    let cluster = Cluster::start_over(&binaries, nodes, auth, &[], tcp);
    let kubeconfig = cluster.control_plane.kubeconfig.display().to_string();
    println!(
        "kube-apiserver {} (etcd beside it), its egress through bridgehead-server",
        cluster.control_plane.url
    );
    println!(
        "bridgehead-server frontend {}, agent endpoint {}, health {}",
        cluster.server.frontend, cluster.server.agent_addr, cluster.server.health
    );
    for node in &cluster.nodes {
        println!(
            "node {}: InternalIP {}, pod {} at {}",
            node.name,
            node.node_ip,
            node.pod(),
            node.pod_ip
        );
    }
    println!("\nTry:");
    println!("  export KUBECONFIG={kubeconfig}");
    println!("  kubectl=$PWD/target/k8s/bin/kubectl");
    if let Some(node) = cluster.nodes.first() {
        println!(
            "  $kubectl get --raw /api/v1/nodes/{}/proxy/healthz",
            node.name
        );
        println!("  $kubectl logs -f -n {NAMESPACE} {}", node.pod());
    }
    println!("  curl -s http://{}/agents", cluster.server.admin);
    println!("\nserver log: {}", cluster.server.process.log.display());
    println!("Ctrl-C stops everything and removes it.");
    bridgehead_e2e::process::until_interrupted()?;
    drop(cluster);
    Ok(())
}
