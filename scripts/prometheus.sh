#!/usr/bin/env bash
# Puts Prometheus and promtool from Debian's package into target/prometheus/bin, for the
# monitoring tests (e2e/tests/monitoring.rs): the package is downloaded and unpacked, not
# installed, so no service starts and nothing outside target/ changes. Skips the work when the
# binaries of the pinned version are there. Prints the two binaries' versions.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/target/prometheus"
# Debian 12's Prometheus (what `apt-get download` fetches needs apt's package lists).
version="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"

if [[ "$(cat "$out/version" 2>/dev/null)" != "$version" || ! -x "$out/bin/promtool" ]]; then
  rm -rf "$out"
  mkdir -p "$out/deb"
  cd "$out/deb"
  if ! apt-get download "prometheus=$version" 2>/dev/null; then
    apt-get update -qq
    apt-get download "prometheus=$version"
  fi
  dpkg-deb -x prometheus_*.deb unpacked
  mkdir -p "$out/bin"
  mv unpacked/usr/bin/prometheus unpacked/usr/bin/promtool "$out/bin/"
  cd "$out"
  rm -rf deb
  echo "$version" >"$out/version"
fi
"$out/bin/prometheus" --version 2>&1 | sed -n 1p
"$out/bin/promtool" --version 2>&1 | sed -n 1p
