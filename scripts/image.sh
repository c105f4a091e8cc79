#!/usr/bin/env bash
# Builds the Bridgehead image without a registry or a container engine: a one-layer OCI
# archive that `ctr -n k8s.io images import` loads into a node's containerd, where pods naming
# `bridgehead:0.1.0` (deploy/) find it. The same contents as the Containerfile's image: the
# two binaries at /bridgehead-server and /bridgehead-agent, the user 65532 (nonroot) it
# declares, and, in place of distroless' base, the C libraries the binaries link against,
# copied from this machine. Also writes the two images only the test nodes use: pause (the pod
# sandbox, a static Go program from e2e/go/pause), busybox (the test pods' shell, from
# Debian's busybox-static) and testserver (e2e/go/testserver: what the test pods serve behind a
# Service for the proxy subresources, an admission webhook and an aggregated API).
#
#   scripts/image.sh [--bin-dir DIR] [--konnectivity] [OUT_DIR]
#
# --konnectivity also writes konnectivity.oci.tar: konnectivity's proxy-server and proxy-agent
# (scripts/anp-build.sh, from their Go module) at /proxy-server and /proxy-agent, as ANP's own
# images hold them, for the migration test (the cluster starts on konnectivity).
#
# --bin-dir holds the built bridgehead-server and bridgehead-agent (default target/release,
# built here with `cargo build --release` first; the tests pass target/debug, built already). Writes
# OUT_DIR/{bridgehead,pause,busybox,testserver}.oci.tar (default target/images) and prints each path with
# its image name. Needs python3, Go (for pause), ldd, and /bin/busybox for the busybox image.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir=""
konnectivity=""
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --konnectivity) konnectivity=1; shift ;;
    *) echo "image: unknown option $1" >&2; exit 64 ;;
  esac
done
out="${1:-$root/target/images}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)"
if [[ -z "$bin_dir" ]]; then
  bin_dir="$root/target/release"
  # Always through cargo: it does nothing when they are fresh, and never packs stale ones.
  (cd "$root" && cargo build --release -p bridgehead-server -p bridgehead-agent)
fi
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Copies each shared library `ldd` names for the given programs into the image root at the
# same path (the dynamic loader included), so the binaries run as they do here.
copy_libraries() {
  local image="$1"
  shift
  local program
  for program in "$@"; do ldd "$program"; done | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    mkdir -p "$image$(dirname "$lib")"
    cp -L "$lib" "$image$lib"
  done
}

# bridgehead: the product image.
image="$work/bridgehead"
mkdir -p "$image/etc" "$image/tmp"
chmod 1777 "$image/tmp"
for b in bridgehead-server bridgehead-agent; do
  [[ -x "$bin_dir/$b" ]] || { echo "image: $bin_dir/$b is not built" >&2; exit 1; }
  cp "$bin_dir/$b" "$image/$b"
done
copy_libraries "$image" "$image/bridgehead-server" "$image/bridgehead-agent"
# As distroless' nonroot: the user the Containerfile and deploy/ name (65532).
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$image/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$image/etc/group"
mkdir -p "$image/home/nonroot"
python3 "$root/scripts/oci-archive.py" "$image" "docker.io/library/bridgehead:$version" \
  "$out/bridgehead.oci.tar" --user 65532:65532 --entrypoint /bridgehead-server
echo "$out/bridgehead.oci.tar docker.io/library/bridgehead:$version"

# pause: the sandbox every pod of a test node starts with (containerd's sandbox_image).
image="$work/pause"
mkdir -p "$image"
(cd "$root/e2e/go/pause" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$image/pause" .)
python3 "$root/scripts/oci-archive.py" "$image" bridgehead.invalid/pause:1 "$out/pause.oci.tar" \
  --user 65535:65535 --entrypoint /pause
echo "$out/pause.oci.tar bridgehead.invalid/pause:1"

# konnectivity: the proxy Bridgehead replaces, for the migration test.
if [[ -n "$konnectivity" ]]; then
  anp_version="$("$root/scripts/anp-build.sh" | awk 'NR == 1 {print $3}')"
  image="$work/konnectivity"
  mkdir -p "$image/tmp"
  chmod 1777 "$image/tmp"
  for b in proxy-server proxy-agent; do
    cp "$root/target/anp/bin/$b" "$image/$b"
    # Built with debug information for the benchmark's profiles; the image needs none.
    strip "$image/$b"
  done
  copy_libraries "$image" "$image/proxy-server" "$image/proxy-agent"
  python3 "$root/scripts/oci-archive.py" "$image" "bridgehead.invalid/konnectivity:$anp_version" \
    "$out/konnectivity.oci.tar" --entrypoint /proxy-server
  echo "$out/konnectivity.oci.tar bridgehead.invalid/konnectivity:$anp_version"
fi

# testserver: the test pods' HTTP and HTTPS server, as static as pause.
image="$work/testserver"
mkdir -p "$image"
(cd "$root/e2e/go/testserver" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$image/testserver" .)
python3 "$root/scripts/oci-archive.py" "$image" bridgehead.invalid/testserver:1 \
  "$out/testserver.oci.tar" --user 65532:65532 --entrypoint /testserver
echo "$out/testserver.oci.tar bridgehead.invalid/testserver:1"

# busybox: a shell and the tools the tests' pods run (sh, cat, tar for kubectl cp, nc, ...).
if [[ -x /bin/busybox ]]; then
  image="$work/busybox"
  mkdir -p "$image/bin" "$image/tmp" "$image/etc"
  chmod 1777 "$image/tmp"
  cp /bin/busybox "$image/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ -e "$image/bin/$applet" ]] || ln -s busybox "$image/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$image/etc/passwd"
  python3 "$root/scripts/oci-archive.py" "$image" bridgehead.invalid/busybox:1 \
    "$out/busybox.oci.tar" --env PATH=/bin
  echo "$out/busybox.oci.tar bridgehead.invalid/busybox:1"
else
  echo "image: no /bin/busybox (Debian's busybox-static); busybox image not written" >&2
fi
