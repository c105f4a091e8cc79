#!/usr/bin/env bash
# Puts Prometheus and promtool from Debian's package into target/prometheus/bin, for the
# monitoring tests (e2e/tests/monitoring.rs): the package is downloaded and unpacked, not
# installed, so no service starts and nothing outside target/ changes. Skips the work when the
# binaries of the pinned version are there (or of Debian's current one, said in a line, once the
# pinned build is no longer served). Prints the two binaries' versions.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/target/prometheus"
# Debian 12's Prometheus (what `apt-get download` fetches needs apt's package lists).
version="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"

pinned="$version"
if [[ "$(cat "$out/pinned" 2>/dev/null)" != "$pinned" || ! -x "$out/bin/promtool" || ! -x "$out/bin/prometheus" ]]; then
  rm -rf "$out"
  mkdir -p "$out/deb"
  cd "$out/deb"
  if ! apt-get download "prometheus=$version" 2>/dev/null; then
    apt-get update -qq
    if ! apt-get download "prometheus=$version" 2>/dev/null; then
      # Debian replaced the pinned build with a stable update: take the one it serves now,
      # and say so (the rules and the tests target Prometheus 2.42's rule language).
      echo "prometheus.sh: prometheus=$version is no longer served; taking the candidate" >&2
      apt-get download prometheus
      version="$(dpkg-deb -f prometheus_*.deb Version)"
    fi
  fi
  dpkg-deb -x prometheus_*.deb unpacked
  mkdir -p "$out/bin"
  mv unpacked/usr/bin/prometheus unpacked/usr/bin/promtool "$out/bin/"
  cd "$out"
  rm -rf deb
  echo "$version" >"$out/version"
  echo "$pinned" >"$out/pinned"
fi
"$out/bin/prometheus" --version 2>&1 | sed -n 1p
"$out/bin/promtool" --version 2>&1 | sed -n 1p
