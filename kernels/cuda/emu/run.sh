#!/usr/bin/env bash
# Runs kernels/test/test_cuda_kernels.c against the CUDA kernels executed on
# the host by the emulator in this folder (README.md, "Checking without a
# GPU"): each kernels/cuda/*.cu is rewritten (emu_rewrite.py), compiled by
# g++ against emu/cuda_runtime.h and emu/cublas_v2.h, and the test is run
# twice, threads scheduled in tid order and in reverse.
#
#   kernels/cuda/emu/run.sh [path/to/libhk_cpu.a]    (default build/...)
set -euo pipefail
cd "$(dirname "$0")/../../.."
cpu_lib=${1:-build/libhk_cpu.a}
out=${HK_EMU_BUILD:-/tmp/hk_emu_build}
mkdir -p "$out"
objs=()
for f in kernels/cuda/*.cu; do
    b=$(basename "$f" .cu)
    python3 kernels/cuda/emu/emu_rewrite.py "$f" "$out/$b.cpp"
    g++ -std=c++17 -O2 -g -Wall -Wno-unused-function -D__CUDACC__ \
        -Ikernels/cuda/emu -I. -include kernels/cuda/emu/cuda_runtime.h \
        -c "$out/$b.cpp" -o "$out/$b.o"
    objs+=("$out/$b.o")
done
rm -f "$out/libhk_cuda_emu.a"
ar rcs "$out/libhk_cuda_emu.a" "${objs[@]}"
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
gcc -std=c11 -D_GNU_SOURCE -g -O2 -fopenmp -Wall -Wextra -Werror -Wshadow \
    -Wno-unused-parameter -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp \
    -DHK_HAVE_CUDA -o "$out/test_cuda_kernels" \
    kernels/test/test_cuda_kernels.c "$out/libhk_cuda_emu.a" "$cpu_lib" \
    -L$blas -Wl,-rpath,$blas -lopenblas -lstdc++ -lm -lpthread
for order in forward reverse; do
    echo "# emulator, threads in $order order"
    HK_EMU_ORDER=$order "$out/test_cuda_kernels"
done
