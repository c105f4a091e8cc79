#!/usr/bin/env bash
# Builds the release binaries (bridgehead-server, bridgehead-agent, bridgehead-certs) for one
# platform as scripts/release.sh ships them, and prints the directory they are in:
#
#   scripts/build-static.sh linux/amd64|linux/arm64     ->  target/<triple>/release
#
# Static: glibc's static libraries, so no loader and no shared library at run time (the same
# jemalloc as every other build; names resolve through /etc/hosts and DNS, which glibc >= 2.34
# has built in). Debug information stripped, symbols kept for backtraces. Reproducible: no path
# of this machine inside (the checkout and cargo's registry are remapped, for the Rust and for
# the C parts: ring, jemalloc). The tests run the same builds (the nodes' image, the arm64 test
# under qemu-user, the release test), so they and a release share cargo's cache. --version
# names the commit as `git rev-parse HEAD` (12 digits), with `-dirty` when tracked files differ
# from it; BRIDGEHEAD_COMMIT set by the caller wins.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case "${1:-}" in
  linux/amd64) triple=x86_64-unknown-linux-gnu ;;
  linux/arm64) triple=aarch64-unknown-linux-gnu ;;
  *) echo "usage: build-static.sh linux/amd64|linux/arm64" >&2; exit 64 ;;
esac
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
  echo "build-static: the Rust target $triple is missing: rustup target add $triple" >&2
  exit 1
fi
if [[ "$triple" == aarch64-* ]] && ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  echo "build-static: needs aarch64-linux-gnu-gcc (Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)" >&2
  exit 1
fi
# Always set, by the release and the tests alike: build-info's build script reruns (and the
# crates above it rebuild) when the variable changes, so every caller passes the same one.
if [[ -z "${BRIDGEHEAD_COMMIT:-}" ]]; then
  BRIDGEHEAD_COMMIT="$(git rev-parse HEAD | cut -c1-12)"
  [[ -z "$(git status --porcelain --untracked-files=no)" ]] || BRIDGEHEAD_COMMIT+="-dirty"
fi
export BRIDGEHEAD_COMMIT
# One value for every build, whoever calls: cc's build scripts (ring's, jemalloc's, psm's) rerun
# when SOURCE_DATE_EPOCH changes, and everything above them rebuilds (about ten minutes of CPU).
# scripts/release.sh sets it to the commit's time for its archives and layers; given to the
# compiler it would change nothing (no C file of these crates reads __DATE__ or __TIME__), so
# the compilers get a constant rather than a new time at every commit.
export SOURCE_DATE_EPOCH=0
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
var="$(echo "$triple" | tr 'a-z-' 'A-Z_')"
# The target named even for this machine's own: RUSTFLAGS then reach only the binaries, not
# build scripts and proc-macros (which cannot be static).
env "CARGO_TARGET_${var}_RUSTFLAGS=-C target-feature=+crt-static --remap-path-prefix=$root=/bridgehead --remap-path-prefix=$cargo_home=/cargo" \
  "CFLAGS_${triple//-/_}=-ffile-prefix-map=$root=/bridgehead -ffile-prefix-map=$cargo_home=/cargo" \
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=debuginfo \
  cargo build --quiet --release --locked --target "$triple" \
  -p bridgehead-server -p bridgehead-agent -p bridgehead-certs >&2
echo "$root/target/$triple/release"
