#!/usr/bin/env bash
# Runs kernels/test/test_cuda_kernels.c against the CUDA kernels executed on
# the host by the emulator in this folder (README.md, "Checking without a
# GPU"): each kernels/cuda/*.cu and *.h is rewritten (emu_rewrite.py; the
# headers for launches inside macros), compiled by g++ against
# emu/cuda_runtime.h and emu/cublas_v2.h, and the test is run twice,
# threads scheduled in tid order and in reverse.
#
#   kernels/cuda/emu/run.sh [path/to/libhk_cpu.a]    (default build/...)
#
# HK_CUDA_TEST_GRID=small runs the reduced shape grid (make test, through
# t/015-cuda-emu.t); HK_EMU_ORDERS="forward" runs one order only, "" none
# (build only);
# HK_EMU_BUILD is the work folder (default /tmp/hk_emu_build); HK_EMU_BENCH=1
# also builds bench/gpu_kernels against the emulator; HK_EMU_ENGINE=path/to/
# libhypic.a also builds engine/test/test_cuda_backend.c and test_cuda_pic.c
# (the CUDA backend on whole models and the caches, against the CPU
# backend) and runs them in tid order, and links hypic-engine and
# bench/gpu_engine against the emulated device. HK_EMU_JOBS (default 2) is
# how many compilers and linkers run at once.
set -euo pipefail
cd "$(dirname "$0")/../../.."
cpu_lib=${1:-build/libhk_cpu.a}
out=${HK_EMU_BUILD:-/tmp/hk_emu_build}
mkdir -p "$out/kernels/cuda"
# Quoted includes look next to the including file first: the rewritten
# headers in $out/kernels/cuda/ shadow the originals.
for h in kernels/cuda/*.h; do
    python3 kernels/cuda/emu/emu_rewrite.py "$h" "$out/$h"
done
# At most HK_EMU_JOBS (default 2, the machine's cores) compilers at once,
# a free one taking the next file: the largest files first, so that no
# long compile starts last.
jobs=${HK_EMU_JOBS:-2}
running=0
# Starts "$@" in the background once fewer than $jobs run (set -e: a
# failed one ends the script).
spawn() {
    while ((running >= jobs)); do
        wait -n
        running=$((running - 1))
    done
    "$@" &
    running=$((running + 1))
}
drain() {
    while ((running > 0)); do
        wait -n
        running=$((running - 1))
    done
}
objs=()
# shellcheck disable=SC2045 # the names: no blanks
for f in $(ls -S kernels/cuda/*.cu); do
    b=$(basename "$f" .cu)
    python3 kernels/cuda/emu/emu_rewrite.py "$f" "$out/$b.cpp"
    # -O1: the emulated kernels spend their time in context switches, not
    # arithmetic, and -O2 doubles the compile time.
    spawn g++ -std=c++17 -O1 -g0 -Wall -Wno-unused-function -Wno-unknown-pragmas -D__CUDACC__ \
        -Ikernels/cuda/emu -I"$out" -I. \
        -include kernels/cuda/emu/cuda_runtime.h \
        -c "$out/$b.cpp" -o "$out/$b.o"
    objs+=("$out/$b.o")
done
drain
rm -f "$out/libhk_cuda_emu.a"
ar rcs "$out/libhk_cuda_emu.a" "${objs[@]}"
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
pkgs="libcjson hiredis libpcre2-8 libxxhash libutf8proc python3-embed"
# The programs, linked HK_EMU_JOBS at a time (the CUDA backend compiled once
# for all of them first).
spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror -Wshadow \
    -Wno-unused-parameter -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp \
    -DHK_HAVE_CUDA -o "$out/test_cuda_kernels" \
    kernels/test/test_cuda_kernels.c "$out/libhk_cuda_emu.a" "$cpu_lib" \
    -L$blas -Wl,-rpath,$blas -lopenblas -lstdc++ -lm -lpthread
if [[ -n ${HK_EMU_ENGINE:-} ]]; then
    # shellcheck disable=SC2046
    spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror \
        -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp -DHK_HAVE_CUDA \
        $(pkg-config --cflags libcjson) \
        -c engine/backend/backend_cuda.c -o "$out/backend_cuda.o"
fi
drain
# HK_EMU_BENCH=1: bench/gpu_kernels too (its --tiny plumbing runs here;
# the KVBuffer rows take the traffic model from libhypic.a).
if [ -n "${HK_EMU_BENCH:-}" ]; then
    spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -Wall -Wextra -Werror -Wshadow \
        -Wno-unused-parameter -I. -o "$out/gpu_kernels" bench/gpu_kernels.c \
        "$out/libhk_cuda_emu.a" "${HK_EMU_ENGINE:-build/libhypic.a}" \
        "$cpu_lib" -L$blas -Wl,-rpath,$blas \
        -lopenblas -lstdc++ -lm -lpthread -fopenmp
fi
if [[ -n ${HK_EMU_ENGINE:-} ]]; then
    # the CUDA backend's whole-model tests (engine/test/test_cuda_*.c)
    for t in backend pic pool peer; do
        # shellcheck disable=SC2046
        spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror \
            -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp -DHK_HAVE_CUDA \
            $(pkg-config --cflags libcjson) \
            -o "$out/test_cuda_$t" "engine/test/test_cuda_$t.c" \
            "$out/backend_cuda.o" "$HK_EMU_ENGINE" \
            "$out/libhk_cuda_emu.a" "$cpu_lib" -L$blas -Wl,-rpath,$blas \
            -lopenblas $(pkg-config --libs libcjson hiredis libpcre2-8 \
            libxxhash libutf8proc) -lstdc++ -lm -lpthread -lrt
    done
    # hypic-engine and bench/gpu_engine on the emulated device (t/015 runs
    # them with --device cuda on toy shapes)
    # shellcheck disable=SC2046
    spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror \
        -I. $(pkg-config --cflags $pkgs) -DHK_HAVE_CUDA \
        -o "$out/hypic-engine" engine/cli/*.c "$out/backend_cuda.o" \
        "$HK_EMU_ENGINE" "$out/libhk_cuda_emu.a" "$cpu_lib" -L$blas \
        -Wl,-rpath,$blas -lopenblas $(pkg-config --libs $pkgs) -lstdc++ -lm \
        -lpthread -lrt
    # shellcheck disable=SC2046
    spawn gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror \
        -I. $(pkg-config --cflags $pkgs) -DHK_HAVE_CUDA \
        -o "$out/gpu_engine" bench/gpu_engine.c "$out/backend_cuda.o" \
        "$HK_EMU_ENGINE" "$out/libhk_cuda_emu.a" "$cpu_lib" -L$blas \
        -Wl,-rpath,$blas -lopenblas $(pkg-config --libs $pkgs) -lstdc++ -lm \
        -lpthread -lrt
fi
drain
if [[ -n ${HK_EMU_ENGINE:-} ]]; then
    for t in backend pic pool peer; do
        for order in ${HK_EMU_ORDERS-forward}; do
            echo "# test_cuda_$t on the emulator, threads in $order order"
            HK_EMU_ORDER=$order "$out/test_cuda_$t"
        done
    done
fi
for order in ${HK_EMU_ORDERS-forward reverse}; do
    echo "# emulator, threads in $order order"
    HK_EMU_ORDER=$order "$out/test_cuda_kernels"
done
