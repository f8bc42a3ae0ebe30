#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time and prints one line:
#   fuzz_x: ok, N runs in S s (R/s), corpus U units
# It fuzzes from its seeds, fuzz/corpus/<target>/, which it never writes
# (new units go to a scratch folder). On a crash it prints the report,
# keeps the input in build-fuzz/crashes/ and exits non-zero.
#
#   fuzz/run.sh build-fuzz/fuzz/fuzz_json [SECONDS]
#
# FUZZ_SEED fixes libFuzzer's random stream (make test does, so that a CI
# run replays the mutations every run before it made; `make fuzz` leaves
# it random to explore).
set -euo pipefail

bin=$(realpath "$1")
secs=${2:-60}
name=$(basename "$bin")
cd "$(dirname "$0")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/hypic-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"

opts=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048
      -artifact_prefix="$work/" -print_final_stats=1)
if [ -n "${FUZZ_SEED:-}" ]; then
    opts+=(-seed="$FUZZ_SEED")
fi
if [ -f "fuzz/$name.dict" ]; then
    opts+=(-dict="fuzz/$name.dict")
fi

rc=0
"$bin" "${opts[@]}" "$work/corpus" "fuzz/corpus/$name" > "$work/log" 2>&1 \
    || rc=$?

stat() { sed -n "s/^stat::$1: *//p" "$work/log" | tail -1; }

if [ "$rc" -ne 0 ]; then
    mkdir -p build-fuzz/crashes
    for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
        [ -e "$a" ] || continue
        cp "$a" "build-fuzz/crashes/$name-${a##*/}"
        echo "$name: input kept in build-fuzz/crashes/$name-${a##*/}"
    done
    tail -n 60 "$work/log"
    echo "$name: FAILED (exit $rc)"
    exit "$rc"
fi

runs=$(stat number_of_executed_units)
echo "$name: ok, ${runs:-?} runs in $secs s ($(( ${runs:-0} / secs ))/s)," \
     "corpus $(find "$work/corpus" "fuzz/corpus/$name" -type f | wc -l) units"
