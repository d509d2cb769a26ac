#!/usr/bin/env bash
# Link stubs of the CUDA libraries that candle's CUDA backend links at build
# time (the driver, cuBLAS, cuBLASLt, cuRAND, NVRTC, through cudarc's
# `dynamic-linking`), for building fusion's feature `candle` on a machine
# with the PyPI compiler wheels (`cargo xtask toolchain`) and no CUDA
# libraries. A CUDA toolkit ships such stubs for the driver in lib/stubs;
# these are the same idea for all five: one empty function per symbol
# cudarc declares, under the real library's soname, so the binary records
# the real libraries and the GPU machine's own copies are loaded at run time.
#
#   scripts/cuda-link-stubs.sh CUDA_HOME
#
# writes CUDA_HOME/lib/stubs/lib{cuda,cublas,cublasLt,curand,nvrtc}.so
# (where cudarc's build script looks) and CUDA_HOME/lib/libcudart.so (the
# name candle's kernels link the runtime by; the wheel has libcudart.so.13).
set -euo pipefail
cuda_home=${1:?usage: scripts/cuda-link-stubs.sh CUDA_HOME}
cd "$(dirname "$0")/.."
# The cudarc sources cargo fetched for this lock file.
version=$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c "
import json, sys
print(next(p['manifest_path'] for p in json.load(sys.stdin)['packages'] if p['name'] == 'cudarc'))")
sys_dir=$(dirname "$version")/src
stubs="$cuda_home/lib/stubs"
mkdir -p "$stubs"
# library name, soname (CUDA 13's), cudarc module declaring its functions
while read -r lib soname module; do
  c=$(mktemp --suffix=.c)
  grep -oP '^pub unsafe fn \K\w+(?=\()' "$sys_dir/$module/sys/mod.rs" | sort -u |
    sed 's/.*/void &(void) {}/' > "$c"
  cc -shared -fPIC -Wl,-soname,"$soname" -o "$stubs/lib$lib.so" "$c"
  echo "$stubs/lib$lib.so: $(wc -l < "$c") symbols, soname $soname"
  rm -f "$c"
done <<'EOF'
cuda libcuda.so.1 driver
cublas libcublas.so.13 cublas
cublasLt libcublasLt.so.13 cublaslt
curand libcurand.so.10 curand
nvrtc libnvrtc.so.13 nvrtc
EOF
runtime=$(ls "$cuda_home"/lib/libcudart.so.* | head -1)
ln -sf "$(basename "$runtime")" "$cuda_home/lib/libcudart.so"
