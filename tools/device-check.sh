#!/usr/bin/env bash
# device-check.sh - everything the GPU host should run, in one call of the
# device tool (/work/shared/device/README.md), within ~8 minutes:
#
#   here:      ../shared/device/pack.sh
#              python3 -m pip download --no-deps --only-binary=:all: \
#                  -d .device/whl fla-core==0.6.0
#   device:    run(carry: [".device"], command: "bash tools/device-check.sh",
#                  timeout_s: 560)
#
# Steps, each under its own `timeout`; a failed or timed-out step is
# reported and the next still runs:
#   1. nvidia-smi (what the device is)
#   2. every CUDA test (build-device/test/test_cuda_*), full shape grid
#   3. build-device/bench/gpu_kernels: timings, copy bandwidth, dumps
#   4. bench/gpu_kernels_ref.py: FLA / torch on the same inputs and shapes,
#      a float64 reference; kernels.tsv, accuracy.tsv, report.md
# Everything goes to $OUT/gpu/<date>-<device>/ (OUT defaults to
# /tmp/device-check), summarized in device-check.md there. Without a
# device (no nvidia-smi, or no CUDA device) the same report says so, the
# tests SKIP, and the reference script still checks the dumps it finds.
# Copy the folder to bench/results/gpu/ afterwards.
#
# Limits (seconds) can be changed: DC_TEST_S, DC_BENCH_S, DC_REF_S.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
run=(bash "$root/.device/on-device.sh")
if [ -f .device/on-device.sh ]; then
    "${run[@]}" true # unpacks build-device/ from the bundle
else
    run=() # a local build: no bundle
fi

name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader \
    2>/dev/null | head -1)
dev=$(echo "${name:-nodevice}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' |
    sed 's/-$//')
res=${OUT:-/tmp/device-check}/gpu/$(date -u +%Y-%m-%d)-$dev
mkdir -p "$res"
sum=$res/device-check.md
t_all=$(date +%s)
{
    echo "# device check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- device: ${name:-none (no nvidia-smi or no GPU): nothing below ran on a GPU}"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| step | status | seconds | notes |"
    echo "|---|---|---:|---|"
} >"$sum"

# step NAME LIMIT LOG CMD...: runs CMD under timeout, logs its output,
# adds a row to the summary.
step() {
    local nm=$1 lim=$2 logf=$3 t0 rc st note=""
    shift 3
    t0=$(date +%s)
    timeout --kill-after=10 "$lim" "$@" >"$logf" 2>&1
    rc=$?
    case $rc in
    0) st=ok ;;
    124 | 137) st="timed out (${lim} s)" ;;
    *) st="failed (exit $rc)" ;;
    esac
    if grep -q '^1\.\.' "$logf" 2>/dev/null; then
        note="$(grep -c '^ok' "$logf") ok, $(grep -c '^not ok' "$logf") not ok,"
        note="$note $(grep -c '# SKIP' "$logf") skipped"
    fi
    echo "| $nm | $st | $(($(date +%s) - t0)) | $note |" >>"$sum"
    echo "== $nm: $st" >&2
    return 0
}

step nvidia-smi 20 "$res/nvidia-smi.txt" nvidia-smi

# FLA, carried as a wheel (the host reaches no package index).
if ls .device/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site \
        .device/whl/*.whl >"$res/pip.txt" 2>&1 &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

found=0
for t in build-device/test/test_cuda_*; do
    [ -x "$t" ] || continue
    found=1
    step "$(basename "$t")" "${DC_TEST_S:-90}" "$res/$(basename "$t").tap" \
        "${run[@]}" "$t"
done
[ $found = 1 ] || echo "| CUDA tests | missing (no build-device/test/test_cuda_*: run pack.sh) | 0 | |" >>"$sum"

if [ -x build-device/bench/gpu_kernels ]; then
    step gpu_kernels "${DC_BENCH_S:-200}" "$res/bench.md" "${run[@]}" \
        build-device/bench/gpu_kernels --out "$res/bench.tsv" \
        --dump "$res/dump" --budget "$((${DC_BENCH_S:-200} - 50))"
else
    echo "| gpu_kernels | missing (no build-device/bench/gpu_kernels) | 0 | |" >>"$sum"
fi

step gpu_kernels_ref "${DC_REF_S:-170}" "$res/ref.log" python3 \
    bench/gpu_kernels_ref.py --bench "$res/bench.tsv" --dump "$res/dump" \
    --out "$res" --budget "$((${DC_REF_S:-170} - 40))"
rm -rf "$res/dump" # inputs and outputs: large, and rebuilt on every run

{
    echo
    echo "Total: $(($(date +%s) - t_all)) s. Results: kernels.tsv, accuracy.tsv,"
    echo "report.md (below), bench.md (the C bench's table), *.tap."
    echo
    [ -f "$res/report.md" ] && cat "$res/report.md"
} >>"$sum"
echo "results in $res" >&2
cat "$sum"
