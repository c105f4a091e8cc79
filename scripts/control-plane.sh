#!/usr/bin/env bash
# A real Kubernetes control plane whose egress goes through Bridgehead, by hand: builds
# kube-apiserver, etcd and kubectl from their Go modules (scripts/k8s-build.sh, cached), then
# starts etcd and kube-apiserver in a network namespace, a bridgehead-server beside them, and
# node test hosts (kubelet, pod, webhook and aggregated-API stand-ins) with agents, and prints
# a KUBECONFIG and kubectl commands to try. Needs root (network namespaces). Ctrl-C removes
# everything.
#   scripts/control-plane.sh [--nodes N] [--certificates] [--mtls]
#     default: 2 nodes, agents with pod-bound ServiceAccount tokens and identity binding,
#     kube-apiserver on the server's Unix socket; --certificates: agents with certificates;
#     --mtls: kube-apiserver through the mTLS frontend (certificates).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/k8s-build.sh >/dev/null
cargo build -q --workspace --bins
exec target/debug/control-plane "$@"
