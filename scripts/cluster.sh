#!/usr/bin/env bash
# A real Kubernetes cluster on this machine with Bridgehead installed from deploy/, in a few
# minutes: etcd, kube-apiserver, kube-scheduler and kube-controller-manager in a network
# namespace; a control-plane node whose kubelet runs bridgehead-server from
# deploy/server-static-pod; worker nodes (containerd and kubelet in namespaces of their own,
# which the control plane has no route to) running the agents from deploy/agent; the image
# built by scripts/image.sh from this tree, pushed (scripts/push-image.sh) to a registry on the
# control plane's host (CNCF Distribution over TLS, scripts/registry-build.sh) that every
# node's containerd pulls it from; a demo pod (a shell serving port 8080) on worker-1.
# Prints an `export KUBECONFIG=...` line once ready and runs until Ctrl-C, which removes every
# process, mount, cgroup, namespace and file it made. Needs root; the first run installs the
# system packages (scripts/install-test-deps.sh) and builds the Kubernetes binaries from their
# Go modules (scripts/k8s-build.sh, several minutes once, cached after).
# With --control-planes N (2 to 6): N control-plane nodes, each in a namespace of its own with
# its kube-apiserver and a kubelet running the server's static pod on that node's Unix socket,
# the servers forwarding to each other (peers found by their Leases), one etcd shared from the
# first node, haproxy on the first node in front of every kube-apiserver (the printed
# KUBECONFIG names it) and every server's agent port (where the agents' DaemonSet points);
# the control-plane nodes labelled and tainted as kubeadm does (docs/ha.md, "A real HA cluster").
#   scripts/cluster.sh [--workers N] [--control-planes N]      (defaults 2 and 1)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "cluster.sh needs root (namespaces, mounts, cgroups)" >&2; exit 1; }
scripts/install-test-deps.sh
scripts/k8s-build.sh >/dev/null
scripts/registry-build.sh >/dev/null
cargo build -q --workspace --bins
exec target/debug/real-cluster "$@"
