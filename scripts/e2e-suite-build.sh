#!/usr/bin/env bash
# Builds the upstream Kubernetes e2e suite's tests on the egress path and the programs its test
# images run, from the Go modules pinned in e2e/go/suite (k8s.io/kubernetes at the release the
# test clusters run, e2e/go/k8s), into target/e2e-suite/bin/:
#   e2e.test          e2e/go/suite: a test main of our own linking only the test packages
#                     whose traffic goes from kube-apiserver to nodes and pods (kubectl,
#                     node, network, apimachinery, common/node) and upstream's suite setup
#   agnhost           k8s.io/kubernetes/test/images/agnhost: most tests' pod (netexec,
#                     webhook, port-forward-tester, ...)
#   sample-apiserver  k8s.io/sample-apiserver: the Aggregator test's aggregated API server
# scripts/e2e-suite-images.sh packs the last two into images. Needs only Go and the Go module
# proxy. Skips the build when the binaries exist and the stamp matches a hash of the module's
# go.mod/go.sum/Go sources, this script and the Go version. Prints one line per binary: its
# path and version. A cold build takes a while (docs/testing.md says how long).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/go-module.sh
source "$root/scripts/go-module.sh"
go_module_prepare e2e-suite-build e2e/go/suite target/e2e-suite scripts/e2e-suite-build.sh
# The test main is Go source of ours: it belongs in the stamp too.
hash="$( { echo "$hash"; cd "$module" && sha256sum ./*.go; } | sha256sum | cut -d' ' -f1)"

binaries=(e2e.test agnhost sample-apiserver)
fresh=1
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || fresh=0; done
[[ -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] || fresh=0

if ((!fresh)); then
  rm -f "$stamp"
  echo "e2e-suite-build: building ${binaries[*]} with $(go env GOVERSION) into $bin" >&2
  (
    cd "$module"
    # The version the suite reports and the tests compare with the server's, as
    # scripts/k8s-build.sh stamps kube-apiserver and kubectl (hack/lib/version.sh).
    read -r kube_version kube_date < <(go list -m -f '{{.Version}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
    IFS=. read -r major minor _ <<<"${kube_version#v}"
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$kube_date"
    done
    # No vet: the suite is upstream's code, vetted upstream (it would double the build).
    # With cgo as scripts/k8s-build.sh builds (its build cache serves every package both
    # share); the images carry the few libraries the two programs link.
    nice -n 10 go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$bin/e2e.test" .
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$bin/" \
      k8s.io/kubernetes/test/images/agnhost k8s.io/sample-apiserver
  )
  echo "$hash" >"$stamp"
fi

echo "$bin/e2e.test $("$bin/e2e.test" --version)"
echo "$bin/agnhost $(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
# Required at v0.0.0 as k8s.io/kubernetes requires it, replaced by the release's.
echo "$bin/sample-apiserver $(cd "$module" && go list -m -f '{{.Replace.Version}}' k8s.io/sample-apiserver)"
