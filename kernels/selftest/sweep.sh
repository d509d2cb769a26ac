#!/usr/bin/env bash
# Builds and runs the mainloop sweep (sweep.cu): every candidate sm80
# mainloop variant is checked, then timed against cuBLASLt GELU_BIAS on the
# benchmark shapes, and a table is printed last.
#
#   kernels/selftest/sweep.sh [--set=1|2] [--reps=N] [--no-check] [--only=SUBSTRING]
#
# --set=2 builds the second variant list (sweep.cu, FUSION_SWEEP_SET): set 1's
# best config with its store, GELU, tile order and prefetch varied. Each set
# builds into its own directory; the other options go to the program.
# Each variant is its own translation unit, compiled for sm_90a in parallel
# (one nvcc per variant), then linked with the harness. ptxas's resource
# report per variant (registers, spills) is printed before the run.
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc),
# FUSION_SELFTEST_BUILD (build directory, default target/kernels-selftest),
# FUSION_SWEEP_ARCH (default 90a: the -gencode arch/code suffix).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

set_id=1
args=()
for a in "$@"; do
  case "$a" in
    --set=*) set_id=${a#--set=} ;;
    *) args+=("$a") ;;
  esac
done
[[ "$set_id" == 1 || "$set_id" == 2 ]] || { echo "--set is 1 or 2"; exit 2; }

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build=${FUSION_SELFTEST_BUILD:-target/kernels-selftest}/sweep$([[ $set_id == 1 ]] || echo "-set$set_id")
arch=${FUSION_SWEEP_ARCH:-90a}
mkdir -p "$build"
src=kernels/selftest/sweep.cu
count=$(sed -n "s/^constexpr int kVariantCount = \([0-9]*\);.*(set $set_id)\$/\1/p" "$src")
[[ -n "$count" ]] || { echo "cannot read set $set_id's kVariantCount from $src"; exit 1; }
flags=(-O3 -std=c++17 -lineinfo -I kernels/include -gencode "arch=compute_$arch,code=sm_$arch"
  -DFUSION_SWEEP_SET="$set_id")
"$NVCC" --version | tail -1

echo "== building $count variants + harness for sm_$arch (logs in $build/*.log)"
start=$SECONDS
pids=()
for ((i = 0; i < count; i++)); do
  "$NVCC" "${flags[@]}" -Xptxas -v -DFUSION_SWEEP_VARIANT="$i" -c "$src" -o "$build/variant$i.o" \
    >"$build/variant$i.log" 2>&1 &
  pids+=($!)
done
"$NVCC" "${flags[@]}" -c "$src" -o "$build/harness.o" >"$build/harness.log" 2>&1 &
pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for log in "$build"/*.log; do
  if grep -qiE "error" "$log"; then
    echo "-- $log"
    grep -iE -B2 -A2 "error" "$log" | head -20
  fi
done
[[ $status -eq 0 ]] || { echo "build failed"; exit 1; }
objs=()
for ((i = 0; i < count; i++)); do objs+=("$build/variant$i.o"); done
"$NVCC" "${flags[@]}" "$build/harness.o" "${objs[@]}" -lcublasLt -lcublas -o "$build/sweep"
echo "built in $((SECONDS - start)) s"

echo "== ptxas (sm_$arch): registers | spills, per variant"
for ((i = 0; i < count; i++)); do
  regs=$(grep -E "Used [0-9]+ registers" "$build/variant$i.log" | grep -v "ref_\|fill_\|spin_" | tail -1 | sed 's/.*Used \([0-9]*\) registers.*/\1/')
  spills=$(grep -E "spill stores" "$build/variant$i.log" | tail -1 | sed 's/.*info *: *//')
  echo "  variant $i: $regs registers | $spills"
done

echo "== sweep --set=$set_id ${args[*]}"
"$build/sweep" "${args[@]}"
