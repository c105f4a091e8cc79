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
module="$root/e2e/go/registry"
out="$root/target/registry"
bin="$out/bin"
stamp="$out/stamp"

# The module says `go 1.26.0`: as k8s-build.sh, the installed Go when it is new enough,
# otherwise the approved newer toolchain through the module proxy.
export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
need_go=go1.26.0
fallback_toolchain=go1.27.3
have_go="$(GOTOOLCHAIN=local go env GOVERSION)"
if [[ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" == "$need_go" ]]; then
  export GOTOOLCHAIN=local
else
  echo "registry-build: $have_go is older than $need_go; using GOTOOLCHAIN=$fallback_toolchain" >&2
  export GOTOOLCHAIN="$fallback_toolchain"
fi

mkdir -p "$bin"
# One build at a time (tests may call this concurrently).
if command -v flock >/dev/null; then
  exec 9>"$out/lock"
  flock 9
fi

hash="$(
  {
    go env GOVERSION GOOS GOARCH
    cd "$root"
    sha256sum e2e/go/registry/go.mod e2e/go/registry/go.sum scripts/registry-build.sh
  } | sha256sum | cut -d' ' -f1
)"

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
