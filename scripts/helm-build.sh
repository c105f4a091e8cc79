#!/usr/bin/env bash
# Builds helm from its Go module at the version pinned in e2e/go/helm/go.mod into
# target/helm/bin/helm (the e2e tests lint, template and install charts/bridgehead with it; a
# release packages the chart with it). Needs only Go and the Go module proxy. Skips the build
# when the binary exists and the stamp matches a hash of go.mod/go.sum, this script and the Go
# version. Prints the binary's path and version. A cold build takes a few minutes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$root/e2e/go/helm"
out="$root/target/helm"
bin="$out/bin"
stamp="$out/stamp"

# As scripts/k8s-build.sh: the installed Go when new enough for the module's `go` line.
export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
need_go=go1.26.0
fallback_toolchain=go1.27.3
have_go="$(GOTOOLCHAIN=local go env GOVERSION)"
if [[ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" == "$need_go" ]]; then
  export GOTOOLCHAIN=local
else
  echo "helm-build: $have_go is older than $need_go; using GOTOOLCHAIN=$fallback_toolchain" >&2
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
    sha256sum "$module/go.mod" "$module/go.sum" "$root/scripts/helm-build.sh"
  } | sha256sum | cut -d' ' -f1
)"

if [[ ! -x "$bin/helm" || ! -f "$stamp" || "$(cat "$stamp")" != "$hash" ]]; then
  rm -f "$stamp"
  echo "helm-build: building helm with $(go env GOVERSION) into $bin" >&2
  (
    cd "$module"
    # As helm's Makefile: the version `helm version` reports, from the pinned module.
    version="$(go list -m -f '{{.Version}}' helm.sh/helm/v3)"
    nice -n 10 go build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
      -o "$bin/helm" helm.sh/helm/v3/cmd/helm
  )
  echo "$hash" >"$stamp"
fi

echo "$bin/helm $("$bin/helm" version --short)"
