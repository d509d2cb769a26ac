#!/usr/bin/env bash
# Builds the kernel self-test and runs it.
#
#   kernels/selftest/run.sh [--ptx] [selftest args: --quick --bench --trace --filter=S --seed=N --no-check]
#
# Three executables, because on an sm_90 GPU the sm_80/sm_75 *machine code*
# never runs; the older paths run there only as PTX that the driver compiles:
#   selftest         sm_90a SASS (sm80 and sm75 paths compiled natively) plus
#                    compute_80 and compute_75 PTX; runs checks and --bench
#   selftest_ptx80   compute_80 PTX only: sm80 + sm75 paths through the JIT
#   selftest_ptx75   compute_75 PTX only: the sm75 path through the JIT
# --ptx (or FUSION_SELFTEST_PTX=1) also runs the two PTX builds
# after the main one (their --bench is dropped); --trace builds the main
# executable with the sm90 mainloop's timeline stamps (-DFUSION_SM90_TRACE,
# which a library build never sets); the loaded-kernel report
# at the top of their output shows ptx=80 or 75 and sass=<the GPU>.
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc),
# FUSION_SELFTEST_BUILD (build directory, default target/kernels-selftest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

run_ptx=${FUSION_SELFTEST_PTX:-0}
args=()
trace=()
for a in "$@"; do
  if [[ "$a" == "--ptx" ]]; then run_ptx=1; else args+=("$a"); fi
  if [[ "$a" == "--trace" ]]; then trace=(-DFUSION_SM90_TRACE); fi
done

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build=${FUSION_SELFTEST_BUILD:-target/kernels-selftest}
mkdir -p "$build"
common=(-O3 -std=c++17 -lineinfo -I kernels/include kernels/selftest/selftest.cu -lcublasLt -lcublas)
"$NVCC" --version | tail -2

echo "== building (logs in $build/*.log)"
"$NVCC" "${common[@]}" "${trace[@]}" -DFUSION_SELFTEST_SM90=1 -Xptxas -v --threads 0 \
  -gencode arch=compute_90a,code=sm_90a \
  -gencode arch=compute_80,code=compute_80 \
  -gencode arch=compute_75,code=compute_75 \
  -o "$build/selftest" >"$build/selftest.log" 2>&1 &
pid_main=$!
"$NVCC" "${common[@]}" -gencode arch=compute_80,code=compute_80 \
  -o "$build/selftest_ptx80" >"$build/selftest_ptx80.log" 2>&1 &
pid_80=$!
"$NVCC" "${common[@]}" -DFUSION_SELFTEST_SM80=0 -gencode arch=compute_75,code=compute_75 \
  -o "$build/selftest_ptx75" >"$build/selftest_ptx75.log" 2>&1 &
pid_75=$!
status=0
for p in $pid_main $pid_80 $pid_75; do wait "$p" || status=1; done
for log in "$build"/selftest.log "$build"/selftest_ptx80.log "$build"/selftest_ptx75.log; do
  if grep -qiE "error|warning" "$log"; then
    echo "-- $log"
    grep -iE -B2 -A2 "error|warning" "$log" | grep -v "^ptxas info" | head -40
  fi
done
[[ $status -eq 0 ]] || { echo "build failed"; exit 1; }

# ptxas resource usage of the sm_90a fused GEMM kernels: registers, shared
# memory, stack frame and spills (all spill counts should be 0).
echo "== ptxas -v (sm_90a), fused_gemm_kernel instances"
demangle=$(command -v cu++filt || command -v c++filt || echo cat)
awk '
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
  /bytes stack frame/ { frame = $0; sub(/^.*info    : /, "", frame) }
  /Used [0-9]+ registers/ { used = $0; sub(/^.*Used /, "", used); print used " | " frame " | " name }
' "$build/selftest.log" | grep -E "fused_gemm_kernel|persistent_gemm_kernel" |
  while IFS='|' read -r used frame name; do
    pretty=$(echo "$name" | tr -d ' ' | $demangle | sed -e 's/fusion:://g' -e 's/(fusion::GemmArgs.*$//' -e 's/(GemmArgs.*$//')
    printf '%s|%s| %s\n' "$used" "$frame" "$pretty"
  done | sort | uniq -c | sort -k2 -n

rc=0
echo "== selftest (sm_90a) ${args[*]:-}"
"$build/selftest" "${args[@]}" || rc=$?
if [[ "$run_ptx" == 1 ]]; then
  ptx_args=()
  for a in "${args[@]}"; do [[ "$a" == "--bench" ]] || ptx_args+=("$a"); done
  echo "== selftest_ptx80 (compute_80 PTX, JIT) ${ptx_args[*]:-}"
  "$build/selftest_ptx80" "${ptx_args[@]}" || rc=$?
  echo "== selftest_ptx75 (compute_75 PTX, JIT) ${ptx_args[*]:-}"
  "$build/selftest_ptx75" "${ptx_args[@]}" || rc=$?
fi
echo "== exit status $rc"
exit $rc
