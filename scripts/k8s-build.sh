#!/usr/bin/env bash
# Builds the real Kubernetes components the e2e tests run, from their Go modules at the
# versions pinned in e2e/go/*/go.mod, into target/k8s/bin/:
#   kube-apiserver, kubectl,       k8s.io/kubernetes/cmd/...   (e2e/go/k8s)
#   kubelet, kube-scheduler,
#   kube-controller-manager,
#   kube-proxy
#   kubeclient                     e2e/go/k8s/kubeclient: kube-apiserver's own egress dialer
#   etcd                           go.etcd.io/etcd/server/v3    (e2e/go/etcd)
# Needs only Go and the Go module proxy. Skips the build when the binaries exist and the stamp
# matches a hash of the modules' go.mod/go.sum/Go sources, this script and the Go version.
# Prints one line per binary: its path and version. A cold build takes several minutes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
modules="$root/e2e/go"
out="$root/target/k8s"
bin="$out/bin"
stamp="$out/stamp"
binaries=(kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager kube-proxy kubeclient etcd)

# The modules say `go 1.26.0`. Use the installed Go when it is new enough; otherwise let the go
# command fetch the approved newer toolchain through the module proxy.
export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
need_go=go1.26.0
fallback_toolchain=go1.27.3
have_go="$(GOTOOLCHAIN=local go env GOVERSION)"
if [[ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" == "$need_go" ]]; then
  export GOTOOLCHAIN=local
else
  echo "k8s-build: $have_go is older than $need_go; using GOTOOLCHAIN=$fallback_toolchain" >&2
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
    find e2e/go/k8s e2e/go/etcd -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | LC_ALL=C sort |
      xargs sha256sum
    sha256sum scripts/k8s-build.sh
  } | sha256sum | cut -d' ' -f1
)"

fresh=1
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || fresh=0; done
[[ -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] || fresh=0

if ((!fresh)); then
  rm -f "$stamp"
  echo "k8s-build: building ${binaries[*]} with $(go env GOVERSION) into $bin" >&2
  (
    cd "$modules/k8s"
    # As Kubernetes' hack/lib/version.sh: the version the binaries report (kubectl version,
    # /version), from the pinned module; gitCommit stays unset as in a build without git.
    read -r kube_version kube_date < <(go list -m -f '{{.Version}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
    IFS=. read -r major minor _ <<<"${kube_version#v}"
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$kube_date"
    done
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-proxy ./kubeclient
  )
  (
    cd "$modules/etcd"
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
  )
  echo "$hash" >"$stamp"
fi

echo "$bin/kube-apiserver $("$bin/kube-apiserver" --version)"
echo "$bin/kubectl $("$bin/kubectl" version --client | sed -n 1p)"
for b in kubelet kube-scheduler kube-controller-manager kube-proxy; do echo "$bin/$b $("$bin/$b" --version)"; done
echo "$bin/kubeclient $("$bin/kubeclient" -version)"
echo "$bin/etcd $("$bin/etcd" --version | sed -n 1p)"
