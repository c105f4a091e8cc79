#!/usr/bin/env bash
# Writes the images of the cluster add-ons kubeadm installs, for the real-cluster tests' nodes
# (which import them; no registry serves them): kube-proxy (target/k8s/bin/kube-proxy from
# scripts/k8s-build.sh, with this machine's iptables, nf_tables flavour, as the node hosts use
# it, and its extensions: kube-proxy runs iptables-restore) and CoreDNS
# (target/coredns/bin/coredns from scripts/coredns-build.sh, static).
#   scripts/addon-images.sh [OUT_DIR]
# OUT_DIR/{kube-proxy,coredns}.oci.tar (default target/images); prints each path with its image
# name. Builds neither binary: run the two build scripts first (e2e/src/kubernetes/addons.rs
# does). Needs python3, ldd and iptables.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/target/images}"
kube_proxy="$root/target/k8s/bin/kube-proxy"
coredns="$root/target/coredns/bin/coredns"
for program in "$kube_proxy" "$coredns"; do
  [[ -x "$program" ]] || { echo "addon-images: $program is not built" >&2; exit 1; }
done
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# kube-proxy: its binary where kubeadm's image has it, iptables where it looks (PATH).
image="$work/kube-proxy"
mkdir -p "$image/usr/local/bin" "$image/usr/sbin" "$image/run" "$image/tmp"
chmod 1777 "$image/tmp"
cp "$kube_proxy" "$image/usr/local/bin/kube-proxy"
multi="$(readlink -f /usr/sbin/xtables-nft-multi)"
cp "$multi" "$image/usr/sbin/xtables-nft-multi"
for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -s xtables-nft-multi "$image/usr/sbin/$tool"
done
# The extensions iptables loads by name at run time (kube-proxy's rules use `statistic`,
# `comment`, `mark`, ...), and the shared libraries ldd names for it and for each of them (the
# loader included; `statistic` needs libm, which iptables itself does not), at the same paths
# as here.
extensions="$(dirname "$(readlink -f "$(ldd "$multi" | grep -o '/[^ ]*libxtables[^ ]*')")")/xtables"
mkdir -p "$image$extensions"
cp -L "$extensions"/*.so "$image$extensions/"
for program in "$multi" "$extensions"/*.so; do ldd "$program"; done | grep -o '/[^ ]*' | sort -u |
  while read -r lib; do
    mkdir -p "$image$(dirname "$lib")"
    cp -L "$lib" "$image$lib"
  done
version="$("$kube_proxy" --version | awk '{print $2}')"
python3 "$root/scripts/oci-archive.py" "$image" "bridgehead.invalid/kube-proxy:$version" \
  "$out/kube-proxy.oci.tar" --entrypoint /usr/local/bin/kube-proxy \
  --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "$out/kube-proxy.oci.tar bridgehead.invalid/kube-proxy:$version"

# coredns: the one static binary, as CoreDNS's own image has it, run as root (the Deployment
# drops every capability but NET_BIND_SERVICE: the binary has no file capability for port 53).
image="$work/coredns"
mkdir -p "$image"
cp "$coredns" "$image/coredns"
version="$("$coredns" -version | sed -n 's/^CoreDNS-\([^ ]*\).*/\1/p' | head -n 1)"
python3 "$root/scripts/oci-archive.py" "$image" "bridgehead.invalid/coredns:$version" \
  "$out/coredns.oci.tar" --user 0:0 --entrypoint /coredns
echo "$out/coredns.oci.tar bridgehead.invalid/coredns:$version"
