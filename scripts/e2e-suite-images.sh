#!/usr/bin/env bash
# Writes the images the upstream e2e suite's tests on the egress path run, for the test nodes
# (which import them; no registry serves them), named as e2e.test asks for them with
# e2e/upstream/repo-list.yaml as its --kube-test-repo-list, at the versions k8s.io/kubernetes'
# test/utils/image/manifest.go gives them:
#   agnhost.oci.tar           agnhost (scripts/e2e-suite-build.sh) on busybox, as upstream's
#                             image has it on alpine: /agnhost, /agnhost-2, /uploads, its
#                             image-defined user and group, `pause` by default
#   busybox.oci.tar           Debian's busybox-static, as scripts/image.sh's
#   sample-apiserver.oci.tar  k8s.io/sample-apiserver (scripts/e2e-suite-build.sh)
#   etcd.oci.tar              target/k8s/bin/etcd (scripts/k8s-build.sh) at /usr/local/bin/etcd
#   scripts/e2e-suite-images.sh [OUT_DIR]
# OUT_DIR/*.oci.tar (default target/images/e2e-suite); prints each path with the image names
# it carries, the first its own and the rest names to tag it with too (agnhost serves as the
# suite's previous agnhost, the pause archive of scripts/image.sh as its pause). Builds nothing:
# run the two build scripts first (e2e/src/kubernetes/upstream.rs does). Needs python3, ldd,
# go (to find the module) and /bin/busybox.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/target/images/e2e-suite}"
bin="$root/target/e2e-suite/bin"
etcd="$root/target/k8s/bin/etcd"
for program in "$bin/agnhost" "$bin/sample-apiserver" "$etcd" /bin/busybox; do
  [[ -x "$program" ]] || { echo "e2e-suite-images: $program is not built" >&2; exit 1; }
done

# The registries of e2e/upstream/repo-list.yaml and the versions of the module's manifest.go.
registry() { sed -n "s/^$1: *//p" "$root/e2e/upstream/repo-list.yaml"; }
kubernetes="$(cd "$root/e2e/go/suite" && GOWORK=off GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
manifest="$kubernetes/test/utils/image/manifest.go"
# `configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}` -> 2.66.1
version() { sed -n "s/^\s*configs\[$1\] = Config{list\.[A-Za-z0-9]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$manifest"; }
promoter="$(registry promoterE2eRegistry)"
for id in Agnhost AgnhostPrev BusyBox APIServer Etcd Pause; do
  [[ -n "$(version "$id")" ]] || { echo "e2e-suite-images: no $id version in $manifest" >&2; exit 1; }
done

mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Each shared library `ldd` names for the given programs (the loader included), at the same
# path in the image: the programs are built with cgo, as the Kubernetes binaries are.
copy_libraries() {
  local image="$1"
  shift
  local program
  for program in "$@"; do ldd "$program"; done | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    mkdir -p "$image$(dirname "$lib")"
    cp -L "$lib" "$image$lib"
  done
}

# A shell and its tools under /bin, as the tests exec them in their pods.
add_busybox() {
  local image="$1" applet
  mkdir -p "$image/bin" "$image/tmp" "$image/etc"
  chmod 1777 "$image/tmp"
  cp /bin/busybox "$image/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ -e "$image/bin/$applet" ]] || ln -s busybox "$image/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$image/etc/passwd"
  printf 'root:x:0:\n' >"$image/etc/group"
  # Debian's busybox has no printenv applet; alpine's, under upstream's images, has, and the
  # tests run it ("kubectl exec ... printenv KUBERNETES_SERVICE_HOST").
  cat >"$image/bin/printenv" <<'SCRIPT'
#!/bin/sh
# printenv [NAME]...: every variable, or each NAME's value; status 1 when one is unset.
[ $# -eq 0 ] && exec env
status=0
for name in "$@"; do
  awk -v name="$name" 'BEGIN { if (name in ENVIRON) print ENVIRON[name]; else exit 1 }' || status=1
done
exit $status
SCRIPT
  chmod 755 "$image/bin/printenv"
}

# agnhost: the tests that check an image's own user and group (run as "the user defined in
# the image") find upstream's.
image="$work/agnhost"
add_busybox "$image"
cp "$bin/agnhost" "$image/agnhost"
ln -s agnhost "$image/agnhost-2"
mkdir -p "$image/uploads"
# porter's TLS ports (the Proxy tests' https: paths) serve the certificate upstream's image adds
# from the module's test/images/agnhost/porter (a test certificate for 127.0.0.1 and ::1).
cp "$kubernetes/test/images/agnhost/porter/localhost.crt" "$kubernetes/test/images/agnhost/porter/localhost.key" "$image/"
copy_libraries "$image" "$bin/agnhost"
printf 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >>"$image/etc/passwd"
printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$image/etc/group"
name="$promoter/agnhost:$(version Agnhost)"
python3 "$root/scripts/oci-archive.py" "$image" "$name" "$out/agnhost.oci.tar" \
  --entrypoint /agnhost --cmd pause --env PATH=/bin:/usr/local/bin:/usr/bin
echo "$out/agnhost.oci.tar $name $promoter/agnhost:$(version AgnhostPrev)"

# busybox: the shell most tests exec into.
image="$work/busybox"
add_busybox "$image"
name="$promoter/busybox:$(version BusyBox)"
python3 "$root/scripts/oci-archive.py" "$image" "$name" "$out/busybox.oci.tar" --cmd sh --env PATH=/bin
echo "$out/busybox.oci.tar $name"

# sample-apiserver: as its Dockerfile, the program at the root and its entrypoint.
image="$work/sample-apiserver"
mkdir -p "$image/tmp"
chmod 1777 "$image/tmp"
cp "$bin/sample-apiserver" "$image/kube-sample-apiserver"
copy_libraries "$image" "$bin/sample-apiserver"
name="$promoter/sample-apiserver:$(version APIServer)"
python3 "$root/scripts/oci-archive.py" "$image" "$name" "$out/sample-apiserver.oci.tar" \
  --entrypoint /kube-sample-apiserver
echo "$out/sample-apiserver.oci.tar $name"

# etcd: the sample-apiserver's store, where the test's pod runs it from.
image="$work/etcd"
mkdir -p "$image/usr/local/bin" "$image/tmp" "$image/var/lib/etcd"
chmod 1777 "$image/tmp"
cp "$etcd" "$image/usr/local/bin/etcd"
copy_libraries "$image" "$etcd"
name="$(registry gcEtcdRegistry)/etcd:$(version Etcd)"
python3 "$root/scripts/oci-archive.py" "$image" "$name" "$out/etcd.oci.tar" \
  --entrypoint /usr/local/bin/etcd
echo "$out/etcd.oci.tar $name"

# pause: no archive of its own; the nodes' sandbox image (scripts/image.sh) under the name.
echo "pause $(registry gcRegistry)/pause:$(version Pause)"
