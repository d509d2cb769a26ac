#!/usr/bin/env bash
# Builds everything the GPU checks need into one folder that can be copied to
# a machine with an NVIDIA GPU and no Rust toolchain:
#
#   scripts/gpu-bundle.sh DIR      # here: release test binaries + fusion CLI
#   DIR/gpu-suite.sh [OUT]         # there: tests per variant, sanitizers, bench
#
# DIR/selftest is the kernel self-test as sources (`fusion render` of
# fusion-compiler/kernels/selftest/candidates.json): the suite's `selftest` step builds it
# there with nvcc and cuBLASLt, which that step alone needs.
#
# Binaries are stripped; logs go to OUT (default DIR/logs). The folder is
# large (every binary carries the whole kernel library): `tar cJf` packs it
# to about a quarter for copying.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu-bundle.sh DIR}
mkdir -p "$dir"
# Every generation fusion-compiler lists (fusion-compiler/kernels/targets.json,
# oldest first), unless FUSION_FEATURES names some.
targets=fusion-compiler/kernels/targets.json
every=$(python3 -c 'import json, sys; print(",".join(g["name"] for g in json.load(open(sys.argv[1]))["generations"]))' "$targets")
features=${FUSION_FEATURES:-$every}
# The same generations for fusion's own tests, which also need its shipped
# kernels, `fusion::testing` and the guard's cuBLASLt path (fusion-cli's
# features name fusion's).
fusion_features=kernels,testing,cublaslt,$features
fusion_features=fusion/${fusion_features//,/,fusion/}
if [[ -f target/toolchain/env ]]; then
  set -a; source <(grep -E '^(NVCC|LIBCLANG_PATH|CUDA_HOME)=' target/toolchain/env); set +a
fi
json=$(cargo test --release -p fusion -p fusion-cli --features "$fusion_features" --tests --no-run --message-format=json 2>/dev/null)
cargo build --release -p fusion-cli --features "$features" --bin fusion --example swiglu_ffn --example llama_stack
cargo build --release -p llama-ffn
llama_json=$(cargo test --release -p llama-ffn --tests --no-run --message-format=json 2>/dev/null)
# executable NAME: the test binary named NAME in cargo's JSON messages on stdin.
executable() {
  python3 -c "
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get('reason') == 'compiler-artifact' and m['target']['name'] == sys.argv[1] and m.get('executable'):
        print(m['executable'])" "$1"
}
for name in gpu gpu_errors gpu_cublaslt gpu_guard gpu_graphs gpu_forward gpu_workspace gpu_safetensors gpu_run gpu_tune gpu_property gpu_stress gpu_tile_model; do
  cp "$(echo "$json" | executable "$name")" "$dir/$name"
done
cp target/release/fusion "$dir/fusion"
# The sm90 FP8 GEMMs' test (tests/gpu_fp8.rs) needs the FP8 graphs
# (graphs/fp8) in the library, which FUSION_FP8=experimental adds: the
# library is rebuilt with them (its other units come from nvcc's cache).
# After the copies above, so that no other binary carries them.
if [[ ,$features, == *,sm90,* ]]; then
  fp8_json=$(FUSION_FP8=experimental cargo test --release -p fusion --features "$fusion_features" --test gpu_fp8 --no-run --message-format=json 2>/dev/null)
  cp "$(echo "$fp8_json" | executable gpu_fp8)" "$dir/gpu_fp8"
  strip "$dir/gpu_fp8"
fi
# FUSION_BUNDLE_AB=1: the tool twice more, built with the model's tiles
# (fusion-model, FUSION_SELECT=model) and with the guard (fusion-guard,
# FUSION_GUARD=on), for the suite's step `ab` (each option against the
# tables and the fused kernels on the corpus, in one GPU run). Last, so that
# the binaries above carry neither option.
if [[ ${FUSION_BUNDLE_AB:-0} == 1 ]]; then
  for variant in model:FUSION_SELECT=model guard:FUSION_GUARD=on; do
    env "${variant#*:}" cargo build --release -p fusion-cli --features "$features" --bin fusion
    cp target/release/fusion "$dir/fusion-${variant%%:*}"
    strip "$dir/fusion-${variant%%:*}"
  done
  # Back to the plain tool, for the render below and the next build.
  cargo build --release -p fusion-cli --features "$features" --bin fusion
fi
target/release/fusion render fusion-compiler/kernels/selftest/candidates.json --out "$dir/selftest"
# The corpus's layers a build with N static fits to N, beside the shipped
# units (the suite's step `fitted`).
target/release/fusion render --fitted-corpus benchmarks/corpus.toml --out "$dir/fitted"
cp target/release/examples/swiglu_ffn "$dir/swiglu_ffn"
cp target/release/examples/llama_stack "$dir/llama_stack"
cp target/release/llama-ffn "$dir/llama-ffn"
# The example crate's own GPU test: its block bound from a safetensors file.
cp "$(echo "$llama_json" | executable safetensors)" "$dir/llama_ffn_safetensors"
# Feature `candle` (FUSION_BUNDLE_CANDLE=1): its GPU test and example, for
# one compute capability (CUDA_COMPUTE_CAP, default 90). Where CUDA_HOME is
# the compiler wheels alone, they link against stubs of the CUDA libraries
# (scripts/cuda-link-stubs.sh); the GPU machine's own are loaded at run time.
if [[ ${FUSION_BUNDLE_CANDLE:-0} == 1 ]]; then
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
  [[ -e ${CUDA_HOME:?}/lib/stubs/libcuda.so ]] || scripts/cuda-link-stubs.sh "$CUDA_HOME"
  candle_json=$(cargo test --release -p fusion --features candle,kernels,testing --test gpu_candle --no-run --message-format=json 2>/dev/null)
  cargo build --release -p fusion-cli --features candle --example candle_ffn
  cp "$(echo "$candle_json" | executable gpu_candle)" "$dir/gpu_candle"
  cp target/release/examples/candle_ffn "$dir/candle_ffn"
  strip "$dir/gpu_candle" "$dir/candle_ffn"
  unset CUDA_COMPUTE_CAP
fi
cp -r graphs "$dir/"
# The layer corpus of `fusion bench --corpus` (the suite's step `corpus`).
cp benchmarks/corpus.toml "$dir/"
cp scripts/gpu-suite.sh "$dir/"
# The generations built, newest first, for the suite's per-variant steps.
python3 -c 'import json, sys
built = sys.argv[2].split(",")
names = [g["name"] for g in json.load(open(sys.argv[1]))["generations"] if g["name"] in built]
print(" ".join(reversed(names)))' "$targets" "$features" > "$dir/generations"
strip "$dir/gpu" "$dir/gpu_errors" "$dir/gpu_cublaslt" "$dir/gpu_guard" "$dir/gpu_graphs" "$dir/gpu_forward" "$dir/gpu_workspace" "$dir/gpu_safetensors" "$dir/gpu_run" "$dir/gpu_tune" "$dir/gpu_property" "$dir/gpu_stress" "$dir/gpu_tile_model" "$dir/fusion" \
  "$dir/swiglu_ffn" "$dir/llama_stack" "$dir/llama-ffn" "$dir/llama_ffn_safetensors"
du -sh "$dir"
