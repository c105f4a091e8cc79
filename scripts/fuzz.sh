#!/usr/bin/env bash
# Builds the libFuzzer targets of proto/fuzz (or server/fuzz, or kubeapi/fuzz: each crate's
# fuzz package sits beside it) and runs each for a number of executions.
#
#   scripts/fuzz.sh                       # the figures of proto/fuzz/README.md
#   scripts/fuzz.sh decode=1000000        # one target, a million executions
#   scripts/fuzz.sh server                # server/fuzz's CONNECT head target (server/fuzz/README.md)
#   scripts/fuzz.sh kubeapi               # kubeapi/fuzz's targets (kubeapi/fuzz/README.md)
#   scripts/fuzz.sh kubeapi jwt=1000000   # one of them
#
# Needs the nightly toolchain (rustup's `nightly`) or RUSTC_BOOTSTRAP=1 with the stable one,
# and a C++ compiler (libfuzzer-sys builds libFuzzer). No cargo-fuzz: the flags it would pass
# are set here. Targets run one after another; each
# grows its corpus in <crate>/fuzz/corpus/<target> (ignored by git) from <crate>/fuzz/seeds/<target>,
# and a crash leaves its input in <crate>/fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail

crate=proto
case "${1:-}" in
proto | server | kubeapi)
    crate=$1
    shift
    ;;
esac
cd "$(dirname "$0")/../$crate/fuzz"

case "$crate" in
proto) runs=("decode=50000000" "ident=35000000" "session=15000000") ;;
server) runs=("connect_head=10000000") ;;
kubeapi) runs=("jwt=5000000" "jwks=5000000") ;;
esac
if [ "$#" -gt 0 ]; then
    runs=("$@")
fi

toolchain=()
if [ -z "${RUSTC_BOOTSTRAP:-}" ]; then
    toolchain=(+nightly)
fi
target=x86_64-unknown-linux-gnu
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
cargo "${toolchain[@]}" build --release --target "$target" --bins

logs=target/fuzz-logs
mkdir -p "$logs"
status=0
for run in "${runs[@]}"; do
    name=${run%%=*}
    count=${run#*=}
    mkdir -p "corpus/$name" "artifacts/$name"
    seeds=()
    [ -d "seeds/$name" ] && seeds=("seeds/$name")
    dict=()
    [ -f "$name.dict" ] && dict=("-dict=$name.dict")
    started=$(date +%s)
    if "target/$target/release/$name" "corpus/$name" "${seeds[@]}" "${dict[@]}" \
        -runs="$count" -print_final_stats=1 -artifact_prefix="artifacts/$name/" \
        >"$logs/$name.log" 2>&1; then
        outcome=ok
    else
        outcome="FAILED (see $logs/$name.log, artifacts/$name/)"
        status=1
    fi
    executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$name.log")
    echo "$name: ${executed:-?} executions in $(($(date +%s) - started)) s: $outcome"
done
exit "$status"
