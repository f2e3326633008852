#!/usr/bin/env bash
# A CUDA 13.0 build toolkit from PyPI's wheels, for building `--features candle-cuda` (candle's
# `cuda` compiles candle's kernels with nvcc and links the CUDA libraries) on a machine with no
# system toolkit and no GPU. Prints the environment to use; `source` it:
#
#   eval "$(tools/cuda-from-pypi.sh [FOLDER])"     # FOLDER defaults to target/cuda-pypi
#   CUDA_COMPUTE_CAP=90 cargo build --release --features candle-cuda
#
# The folder holds nvcc with its compiler, headers and libraries, and `link/`: the libraries
# under the names the linker asks for, plus a stub `libcuda.so` (the driver's entry points as
# empty functions, named libcuda.so.1) that is only linked against: binaries load the real
# driver at run time, so `link/` must not be on a GPU machine's library path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(realpath -m "${1:-target/cuda-pypi}")
cuda=$root/nvidia/cu13

if [ ! -x "$cuda/bin/nvcc" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$root" \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-curand==10.4.0.35 nvidia-cublas==13.0.0.19 >&2
fi

link=$root/link
if [ ! -e "$link/libcuda.so" ]; then
    mkdir -p "$link"
    for versioned in "$cuda"/lib/lib{cudart,nvrtc,cublas,cublasLt,curand}.so.*; do
        ln -sf "$versioned" "$link/$(basename "${versioned%%.so.*}").so"
    done
    # Every driver function the header declares, under its plain and its versioned names
    # (the header's macros map cuFoo to cuFoo_v2; the preprocessed text has the latter).
    {
        grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$cuda/include/cuda.h"
        echo '#include <cuda.h>' | cc -E -I "$cuda/include" - | grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
    } | tr -d ' \t(' | sort -u | sed 's/.*/void &(void) {}/' > "$link/libcuda-stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/libcuda-stub.c"
fi

echo "export PATH=\"$cuda/bin:\$PATH\""
echo "export LIBRARY_PATH=\"$link\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
