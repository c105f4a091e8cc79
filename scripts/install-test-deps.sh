#!/usr/bin/env bash
# Installs the system packages the tests use (Debian or Ubuntu, as root), each only when what
# it provides is missing, so a second run changes nothing. `.ci/run` calls it, and so does
# `scripts/test.sh` where it runs as root on a machine with apt-get. Elsewhere it lists what is
# missing and exits 0: the tests that need those skip loudly (and fail where skips are
# forbidden). The Go-built components (kube-apiserver, kubelet, ...) come from
# scripts/k8s-build.sh, and the image registry from scripts/registry-build.sh, not from here.
set -euo pipefail

# What a test needs, as "probe package": the probe is a command on PATH or an absolute path.
wants=(
  "curl curl"                   # e2e: curl as a CONNECT client
  "pgrep procps"                # scripts: ps/pgrep
  "ip iproute2"                 # e2e/src/netns.rs: test hosts in network namespaces
  "python3 python3"             # e2e: targets, the node stand-in
  "openssl openssl"             # kubeapi's unit tests: RSA keys for signed test tokens (ring makes none)
  "go golang-go"                # scripts/k8s-build.sh (Go >= 1.21 fetches the pinned newer toolchain)
  "haproxy haproxy"             # e2e/tests/ha.rs, leases.rs: a real load balancer
  "taskset util-linux"          # e2e/tests/runtime.rs: an agent pinned to one CPU
  "unshare util-linux"          # e2e/src/kubernetes/node_host.rs: a node host's namespaces
  "script bsdutils"             # e2e/tests/cluster.rs: kubectl exec -it from a pseudo-terminal
  "nft nftables"                # e2e/tests/faults.rs: packet loss on a test host's link
  "dnsmasq dnsmasq-base"        # e2e/tests/discovery.rs, scale_and_restart.rs: a real resolver in a test host
  "runc runc"                   # real nodes: the OCI runtime containerd starts containers with
  "containerd containerd"       # real nodes: the CRI runtime kubelet talks to (and ctr, to import images)
  "/usr/lib/cni/bridge containernetworking-plugins"   # real nodes: pod networks (bridge, host-local, portmap, loopback)
  "iptables iptables"           # real nodes: the portmap CNI plugin and kubelet's own rules
  "/bin/busybox busybox-static" # real nodes: the test pods' root file system (scripts/image.sh)
  "skopeo skopeo"               # scripts/push-image.sh: Bridgehead's image into the test registry
  "buildah buildah"             # scripts/release.sh: the image from the Containerfile (e2e/tests/release.rs, the nodes' image)
  "aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu"       # scripts/build-static.sh: the linux/arm64 binaries' C parts and link
  "/usr/aarch64-linux-gnu/lib/libc.a libc6-dev-arm64-cross"   # ... and glibc's static libraries for arm64
  "qemu-aarch64-static qemu-user-static"              # e2e/tests/arm64.rs: the arm64 binaries run under emulation
)

missing=()
for want in "${wants[@]}"; do
  read -r probe package <<<"$want"
  if [[ "$probe" == /* ]]; then
    [[ -e "$probe" ]] && continue
  else
    command -v "$probe" >/dev/null && continue
  fi
  [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
done

if ((${#missing[@]})); then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "install-test-deps: not root or no apt-get; missing packages (tests needing them skip): ${missing[*]}" >&2
    exit 0
  fi
  echo "install-test-deps: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# scripts/build-static.sh: Rust's standard library for linux/arm64, for the toolchain
# rust-toolchain.toml names (rustup's, where rustup is).
if command -v rustup >/dev/null; then
  (
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    rustup target list --installed | grep -qx aarch64-unknown-linux-gnu ||
      rustup target add aarch64-unknown-linux-gnu >&2
  )
fi

# e2e/tests/faults.rs: where the kernel has no netem, the lossy link's delay line is a TUN
# device; a container may lack the device node even where the kernel has the driver.
if [[ ! -e /dev/net/tun && "$(id -u)" == 0 ]]; then
  mkdir -p /dev/net && mknod /dev/net/tun c 10 200 && chmod 0666 /dev/net/tun
fi

# Each real cluster's kubelets, containerds and kube-apiservers take about 60 inotify instances
# of root's; Debian's default of 128 leaves room for two clusters at once, and a test binary
# runs its cluster tests side by side (a run here failed with "too many open files" at 128).
if [[ "$(id -u)" == 0 ]] && (($(cat /proc/sys/fs/inotify/max_user_instances) < 512)); then
  sysctl -qw fs.inotify.max_user_instances=512 || echo "install-test-deps: could not raise fs.inotify.max_user_instances" >&2
fi
