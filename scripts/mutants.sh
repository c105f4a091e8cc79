#!/usr/bin/env bash
# Mutation testing (cargo-mutants) of one scope: proto, mux, router or frontend. What each
# scope covers, how long it takes on a 2-core machine and every surviving mutant with its
# reason: docs/testing.md. One job at a time (cargo-mutants' default): a mutant's build
# already uses both cores. Each mutant is tested with its crate's unit and component tests
# (the frontend's with the server's unit tests only: building the component tests too would
# double the time per mutant); a mutant that makes them hang is cut after 20 s (they take
# about a second). Results go to
# mutants.out/<scope>/mutants.out; further arguments go to cargo mutants (--list, --re REGEX,
# --iterate, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scope="${1:?usage: scripts/mutants.sh proto|mux|router|frontend [cargo-mutants arguments]}"
shift
extra=()
case "$scope" in
  proto) files=() package=bridgehead-proto ;;
  mux) files=() package=bridgehead-mux ;;
  router)
    package=bridgehead-server
    files=(server/src/routing/registry.rs server/src/routing/router.rs 'server/src/routing/router/*.rs')
    ;;
  frontend)
    # The CONNECT pipeline: accept loops, head, admission, route to dial, answer, the hold of
    # a speak-first target's bytes, refusals, the pre-TLS handshake bound. Not the TLS stream
    # (frontend/tls_stream.rs), which is a scope of its own for time (docs/testing.md).
    package=bridgehead-server
    extra=(--cargo-arg=--lib)
    files=(server/src/frontend.rs server/src/frontend/connection.rs server/src/frontend/head.rs
      server/src/frontend/hold.rs server/src/process/http_head.rs server/src/routing/admission.rs
      server/src/routing/refusal.rs server/src/routing/dial.rs server/src/frontend/handshakes.rs)
    ;;
  tls-stream) files=(server/src/frontend/tls_stream.rs) package=bridgehead-server ;;
  *)
    echo "unknown scope '$scope': proto, mux, router, frontend or tls-stream" >&2
    exit 64
    ;;
esac
args=(--package "$package" --minimum-test-timeout 20 --output "mutants.out/$scope")
for file in "${files[@]}"; do
  args+=(--file "$file")
done
# cargo-mutants creates its output directory but not the parent.
mkdir -p mutants.out
exec cargo mutants "${args[@]}" "${extra[@]}" "$@"
