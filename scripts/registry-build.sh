#!/usr/bin/env bash
# Builds CNCF Distribution's registry (github.com/distribution/distribution/v3/cmd/registry)
# from its Go module at the version pinned in e2e/go/registry/go.mod, into
# target/registry/bin/registry: the registry the real-cluster tests and scripts/cluster.sh
# push Bridgehead's image to and the nodes pull it from. Needs only Go and the Go module proxy.
# Skips the build when the binary exists and the stamp matches a hash of the module's
# go.mod/go.sum, this script and the Go version. Prints the binary's path and version.
#
# A sibling of scripts/k8s-build.sh rather than a part of it: that one's stamp covers its own
# script, so a change here would rebuild all of Kubernetes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/go-module.sh
source "$root/scripts/go-module.sh"
go_module_prepare registry-build e2e/go/registry target/registry scripts/registry-build.sh

if [[ ! -x "$bin/registry" || ! -f "$stamp" || "$(cat "$stamp")" != "$hash" ]]; then
  rm -f "$stamp"
  echo "registry-build: building the registry with $(go env GOVERSION) into $bin" >&2
  (
    cd "$module"
    # The version `registry --version` reports: the pinned module's, as its Makefile stamps it.
    version="$(go list -m -f '{{.Version}}' github.com/distribution/distribution/v3)"
    nice -n 10 go build -trimpath \
      -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$version" \
      -o "$bin/registry" github.com/distribution/distribution/v3/cmd/registry
  )
  echo "$hash" >"$stamp"
fi

# `registry --version` prints its own path, the module and the version.
"$bin/registry" --version
