#!/usr/bin/env bash
# Writes the image archives of a test cluster: Bridgehead's own, which the tests push to the
# cluster's registry (scripts/push-image.sh) for every node to pull, and the images only the
# test nodes use, which a node imports with `ctr -n k8s.io images import`.
#
#   bridgehead.oci.tar   THE Bridgehead image: scripts/release.sh's, built by buildah from the
#                        repository's Containerfile (static release binaries of this tree on a
#                        base of pinned Debian packages, user 65532), linux/amd64 only here,
#                        tagged `bridgehead:<version>` as deploy/image names it
#   pause.oci.tar        the pod sandbox, a static Go program from e2e/go/pause
#   busybox.oci.tar      the test pods' shell, from Debian's busybox-static
#   testserver.oci.tar   e2e/go/testserver: what the test pods serve behind a Service for the
#                        proxy subresources, an admission webhook and an aggregated API
#
#   scripts/image.sh [--konnectivity] [OUT_DIR]
#
# --konnectivity also writes konnectivity.oci.tar: konnectivity's proxy-server and proxy-agent
# (scripts/anp-build.sh, from their Go module) at /proxy-server and /proxy-agent, as ANP's own
# images hold them, for the migration test (the cluster starts on konnectivity).
#
# Writes OUT_DIR/*.oci.tar (default target/images) and prints each path with its image name.
# The three test images are one-layer archives from scripts/oci-archive.py. Needs what
# scripts/release.sh needs, python3, Go (for pause), and /bin/busybox for the busybox image.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
konnectivity=""
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --konnectivity) konnectivity=1; shift ;;
    *) echo "image: unknown option $1" >&2; exit 64 ;;
  esac
done
out="${1:-$root/target/images}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Copies each shared library `ldd` names for the given programs into the image root at the
# same path (the dynamic loader included), so the binaries run as they do here. Only for
# konnectivity's test image: Bridgehead's holds no library of this machine.
copy_libraries() {
  local image="$1"
  shift
  local program
  for program in "$@"; do ldd "$program"; done | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    mkdir -p "$image$(dirname "$lib")"
    cp -L "$lib" "$image$lib"
  done
}

# bridgehead: the product image, as the release builds it (cargo and buildah do nothing
# where nothing changed). Into a directory of this run's own, then renamed into place: test
# processes may build at once.
"$root/scripts/release.sh" --image-only --platform linux/amd64 --out "$work/release" >/dev/null
cp "$work/release/bridgehead.oci.tar" "$out/bridgehead.oci.tar.$$"
mv "$out/bridgehead.oci.tar.$$" "$out/bridgehead.oci.tar"
reference="$(tar -xOf "$out/bridgehead.oci.tar" ./index.json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')"
echo "$out/bridgehead.oci.tar $reference"

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
