#!/usr/bin/env bash
# Runs every test: unit, component and end-to-end (the e2e tests run the real binaries, so
# they are built first, and kube-apiserver with them where Go is installed). Tests that need
# root (network namespaces), Go or the control plane skip loudly without them; the skips are listed and counted at the end. BRIDGEHEAD_FORBID_SKIPS=1 (CI) turns any
# skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# The system packages the tests use, where this user can install them (root with apt-get);
# elsewhere the tests that need what is missing skip loudly.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  scripts/install-test-deps.sh
fi
cargo build --workspace --bins
# The release's static linux/amd64 binaries (cargo's cache under target/x86_64-unknown-linux-gnu):
# the real-cluster tests' nodes run the release's image of them (scripts/image.sh) and
# e2e/tests/release.rs releases them. Built here, before any test's clock starts; each test
# then finds cargo with nothing to do. Needs rustup (the target named explicitly); without it
# those tests say what they lack.
if command -v rustup >/dev/null; then
  scripts/build-static.sh linux/amd64 >/dev/null
fi
# The real Kubernetes components (kube-apiserver, etcd, kubectl, kube-apiserver's egress
# dialer) from their Go modules, cached under target/k8s: minutes the first time, nothing after.
if command -v go >/dev/null; then
  scripts/k8s-build.sh
  # The image registry the real cluster's nodes pull Bridgehead's image from (CNCF
  # Distribution, from its Go module), cached under target/registry.
  scripts/registry-build.sh
  # konnectivity itself, for the --fallback-proxy tests, the migration test on the real
  # cluster (an image of it) and the bench's side by side.
  scripts/anp-build.sh
  # helm, for the chart's tests (lint, template, install on the real cluster).
  scripts/helm-build.sh
  # CoreDNS, the HA cluster's DNS add-on (e2e/tests/ha_cluster.rs), cached under
  # target/coredns: built here rather than inside that test's time limit.
  scripts/coredns-build.sh
  # The upstream Kubernetes e2e suite's egress-path tests and the programs of their images
  # (e2e/tests/upstream_suite.rs), cached under target/e2e-suite: likewise.
  scripts/e2e-suite-build.sh
fi
# Prometheus and promtool from Debian's package, unpacked under target/prometheus (not
# installed: no service starts), for the monitoring tests.
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  scripts/prometheus.sh || echo "scripts/prometheus.sh failed: the monitoring tests will skip" >&2
fi
skips=$(mktemp)
trap 'rm -f "$skips"' EXIT
export BRIDGEHEAD_SKIP_LOG="$skips"
status=0
cargo test --workspace --no-fail-fast "$@" || status=$?
count=$(wc -l < "$skips")
if [ "$count" -gt 0 ]; then
  echo
  echo "==> $count test(s) SKIPPED:"
  sort "$skips" | sed 's/^/    /'
else
  echo "==> 0 tests skipped"
fi
exit "$status"
