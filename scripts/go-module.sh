# Sourced by the scripts that build one Go program from a module pinned under e2e/go
# (scripts/helm-build.sh, scripts/registry-build.sh): the toolchain choice, one build at a time,
# and the stamp that lets a build be skipped. scripts/k8s-build.sh keeps its own copy: its stamp
# covers its own text, so sourcing this there would rebuild all of Kubernetes once.

# go_module_prepare NAME MODULE OUT SCRIPT (paths relative to the repository root `$root`):
# chooses the Go toolchain, takes OUT's lock for the rest of the calling script, and sets
# `module`, `bin`, `stamp` and `hash` (of the Go version, MODULE's go.mod and go.sum, SCRIPT and
# this file). The modules say `go 1.26.0`: the installed Go when it is new enough, otherwise the
# approved newer toolchain through the module proxy.
go_module_prepare() {
  local name="$1" relative_module="$2" out="$root/$3" script="$4"
  local need_go=go1.26.0 fallback_toolchain=go1.27.3 have_go
  export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
  have_go="$(GOTOOLCHAIN=local go env GOVERSION)"
  if [[ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" == "$need_go" ]]; then
    export GOTOOLCHAIN=local
  else
    echo "$name: $have_go is older than $need_go; using GOTOOLCHAIN=$fallback_toolchain" >&2
    export GOTOOLCHAIN="$fallback_toolchain"
  fi
  module="$root/$relative_module"
  bin="$out/bin"
  stamp="$out/stamp"
  mkdir -p "$bin"
  # One build at a time (tests may call these concurrently).
  if command -v flock >/dev/null; then
    exec 9>"$out/lock"
    flock 9
  fi
  hash="$(
    {
      go env GOVERSION GOOS GOARCH
      cd "$root"
      sha256sum "$relative_module/go.mod" "$relative_module/go.sum" "$script" scripts/go-module.sh
    } | sha256sum | cut -d' ' -f1
  )"
}
