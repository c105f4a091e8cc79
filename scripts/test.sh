#!/usr/bin/env bash
# Runs every test: unit, component and end-to-end (the e2e tests run the real binaries, so
# they are built first). Tests that need root (network namespaces) or Go skip loudly without
# them; the skips are listed and counted at the end. BRIDGEHEAD_FORBID_SKIPS=1 (CI) turns any
# skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
skips=$(mktemp)
trap 'rm -f "$skips"' EXIT
export BRIDGEHEAD_SKIP_LOG="$skips"
status=0
cargo test --workspace "$@" || status=$?
count=$(wc -l < "$skips")
if [ "$count" -gt 0 ]; then
  echo
  echo "==> $count test(s) SKIPPED:"
  sort "$skips" | sed 's/^/    /'
else
  echo "==> 0 tests skipped"
fi
exit "$status"
