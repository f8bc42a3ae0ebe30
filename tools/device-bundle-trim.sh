#!/usr/bin/env bash
# device-bundle-trim.sh - keep in .device/bundle.tar.xz (made by
# ../shared/device/pack.sh) only what tools/device-check.sh runs: the CUDA
# tests, gpu_engine, gpu_kernels, hypic-engine and the packed libraries.
#
# Why: the device tool carries at most 64 MiB a call (the tracked tree,
# ~24 MB, plus what `carry` names); pack.sh's bundle holds every test and
# bench (~43 MB with xz), which with the FLA wheel passed it in session
# 15. Trimmed: ~38 MB at xz's default window (8 MiB), which left the call
# ~3.7 MB under the limit in session 20. Each of the eight programs kept
# links libhk_cuda statically, so each carries the same ~13 MB of kernels:
# one window holding the whole tar (~170 MB) stores them once, ~13 MB in
# all (single-threaded: threads would cut the tar into blocks compressed
# apart; unpacking takes the window's ~200 MB of memory). Run from the
# project's root after pack.sh and the wheel's download; prints the bytes
# a call will carry.
set -euo pipefail
cd "$(dirname "$0")/.."
b=.device/bundle.tar.xz
[ -f "$b" ] || {
    echo "no $b: run ../shared/device/pack.sh first" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xJf "$b"
find "$tmp/build-device/test" -type f ! -name 'test_cuda_*' -delete
find "$tmp/build-device/bench" -type f ! -name gpu_engine ! -name gpu_kernels \
    -delete
tar -C "$tmp" -cf - . | xz -T1 --lzma2=preset=6,dict=192MiB >"$b.new"
mv "$b.new" "$b"
carried=$(du -cb .device | tail -1 | cut -f1)
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s += $1} END {print s}')
total=$((carried + tracked))
echo "bundle $(du -b "$b" | cut -f1) bytes; a call carries ~$total of 67108864"
# past the limit the device tool refuses the call: say so here, not there
if [ "$total" -gt 67108864 ]; then
    echo "device-bundle-trim: a call would carry $total bytes, over the" \
        "device tool's 64 MiB: drop files from the bundle or the tree" >&2
    exit 1
fi
