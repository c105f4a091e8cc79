#!/usr/bin/env bash
# Runs every test: unit, component and end-to-end (the e2e tests run the real binaries, so
# they are built first). The routing tests create network namespaces and need root; without
# root they say loudly that they were skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo test --workspace "$@"
