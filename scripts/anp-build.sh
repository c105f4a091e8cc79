#!/usr/bin/env bash
# Builds konnectivity's proxy-server and proxy-agent (kubernetes-sigs/apiserver-network-proxy)
# from its Go module at the version pinned in bench/go/anp/go.mod, into target/anp/bin/, for
# side-by-side benchmarks. Needs only Go and the Go module proxy. Skips the build when the
# binaries exist and the stamp matches a hash of the module files, this script and the Go
# version. Prints one line per binary: its path and the module version.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$root/bench/go/anp"
out="$root/target/anp"
bin="$out/bin"
stamp="$out/stamp"

export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
# go.mod says `go 1.26.0`; an older Go fetches the approved newer toolchain.
need_go=go1.26.0
have_go="$(GOTOOLCHAIN=local go env GOVERSION)"
if [[ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" == "$need_go" ]]; then
  export GOTOOLCHAIN=local
else
  export GOTOOLCHAIN=go1.27.3
fi

mkdir -p "$bin"
hash="$(
  {
    go env GOVERSION GOOS GOARCH
    sha256sum "$module/go.mod" "$module/go.sum" "$module/tools.go" "$root/scripts/anp-build.sh"
  } | sha256sum | cut -d' ' -f1
)"
if [[ ! -x "$bin/proxy-server" || ! -x "$bin/proxy-agent" || ! -f "$stamp" || "$(cat "$stamp")" != "$hash" ]]; then
  rm -f "$stamp"
  echo "anp-build: building proxy-server and proxy-agent with $(go env GOVERSION) into $bin" >&2
  (
    cd "$module"
    go build -trimpath -o "$bin/proxy-server" sigs.k8s.io/apiserver-network-proxy/cmd/server
    go build -trimpath -o "$bin/proxy-agent" sigs.k8s.io/apiserver-network-proxy/cmd/agent
  )
  echo "$hash" > "$stamp"
fi
version="$(cd "$module" && go list -m -f '{{.Version}}' sigs.k8s.io/apiserver-network-proxy)"
for b in proxy-server proxy-agent; do
  echo "$bin/$b apiserver-network-proxy $version"
done
