#!/usr/bin/env bash
# Builds helm from its Go module at the version pinned in e2e/go/helm/go.mod into
# target/helm/bin/helm (the e2e tests lint, template and install charts/bridgehead with it; a
# release packages the chart with it). Needs only Go and the Go module proxy. Skips the build
# when the binary exists and the stamp matches a hash of go.mod/go.sum, this script and the Go
# version. Prints the binary's path and version. A cold build takes a few minutes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/go-module.sh
source "$root/scripts/go-module.sh"
go_module_prepare helm-build e2e/go/helm target/helm scripts/helm-build.sh

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
