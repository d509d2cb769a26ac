#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu-bundle.sh:
#   gpu-suite.sh [OUT] [steps...]   steps: tests ptx errors sanitize bench (default: all)
# Each step logs to OUT/<step>*.log; a summary of pass/fail counts is printed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/logs}; shift || true
steps=${*:-tests ptx errors sanitize bench}
mkdir -p "$out"
cd "$here"
export FUSION_GRAPHS_DIR=$here/graphs
export FUSION_TEST_SEED=${FUSION_TEST_SEED:-$(date +%s)}
echo "seed $FUSION_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
status=0
run() { local log=$1; shift; echo "== $*"; "$@" >"$out/$log" 2>&1; local rc=$?; tail -3 "$out/$log"; [[ $rc -eq 0 ]] || { echo "FAILED ($rc): see $log"; status=1; }; }
for step in $steps; do
  case $step in
    tests) run gpu-sm90.log ./gpu --ignored --test-threads 8 --nocapture ;;
    ptx)
      FUSION_FORCE_ARCH=sm80 FUSION_TEST_SIZE=quick run gpu-sm80-ptx.log ./gpu --ignored --test-threads 8 --nocapture
      FUSION_FORCE_ARCH=sm75 FUSION_TEST_SIZE=quick run gpu-sm75-ptx.log ./gpu --ignored --test-threads 8 --nocapture ;;
    errors) run gpu-errors.log ./gpu_errors --ignored ;;
    sanitize)
      FUSION_TEST_SIZE=tiny run sanitize-memcheck.log compute-sanitizer --tool memcheck --error-exitcode 3 \
        ./gpu --ignored --test-threads 1 --nocapture
      FUSION_TEST_SIZE=tiny run sanitize-racecheck.log compute-sanitizer --tool racecheck --error-exitcode 3 \
        ./gpu --ignored --test-threads 1 --nocapture gemm_bias_gelu gemm_bias_residual layernorm_gemm rmsnorm_gemm silu layernorm
      FUSION_FORCE_ARCH=sm80 FUSION_TEST_SIZE=tiny run sanitize-memcheck-sm80.log compute-sanitizer --tool memcheck \
        --error-exitcode 3 ./gpu --ignored --test-threads 1 --nocapture gemm_bias_gelu layernorm_gemm gemm_bias_residual ;;
    bench) run bench.log ./fusion bench --json "$out/bench.json" ;;
  esac
done
exit $status
