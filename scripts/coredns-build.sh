#!/usr/bin/env bash
# Builds CoreDNS (github.com/coredns/coredns) from its Go module at the version pinned in
# e2e/go/coredns/go.mod into target/coredns/bin/coredns: the cluster DNS the real-cluster tests
# and scripts/cluster.sh run as kubeadm deploys it (a `coredns` Deployment behind the `kube-dns`
# Service). Needs only Go and the Go module proxy. Skips the build when the binary exists and
# the stamp matches a hash of the module's go.mod/go.sum, this script and the Go version.
# Prints the binary's path and version. A cold build takes a few minutes.
#
# A sibling of scripts/k8s-build.sh rather than a part of it: that one's stamp covers its own
# script, so a change here would rebuild all of Kubernetes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/go-module.sh
source "$root/scripts/go-module.sh"
go_module_prepare coredns-build e2e/go/coredns target/coredns scripts/coredns-build.sh

if [[ ! -x "$bin/coredns" || ! -f "$stamp" || "$(cat "$stamp")" != "$hash" ]]; then
  rm -f "$stamp"
  echo "coredns-build: building coredns with $(go env GOVERSION) into $bin" >&2
  (
    cd "$module"
    # Statically linked, as CoreDNS's Makefile builds it (CGO_ENABLED=0): the binary goes into
    # an image with nothing else in it.
    CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin/coredns" \
      github.com/coredns/coredns
  )
  echo "$hash" >"$stamp"
fi

# `coredns -version` prints the version, the Go version and the platform.
echo "$bin/coredns $("$bin/coredns" -version | tr '\n' ' ')"
