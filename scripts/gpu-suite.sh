#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu-bundle.sh:
#   gpu-suite.sh [OUT] [steps...]
#   steps: tests fp8 ptx counter errors graphs examples property stress sanitize bench (default: all)
#   (fp8: the sm90 FP8 GEMMs of graphs/fp8, built with FUSION_FP8=experimental, and memcheck and racecheck on them)
#   (candle: the feature `candle`'s GPU test and example, in a bundle that has them; not in the default)
#   (counter: the sm90 tests with CTAs taking tiles from a counter, FUSION_TILE_COUNTER=1)
#   (corpus: fusion bench --corpus over the bundle's corpus.toml: over a thousand rows; not in the default)
#   (ab: the corpus with the tables, FUSION_SELECT=model, FUSION_GUARD=on and off, FUSION_STREAM_K=0, tail or fill (FUSION_AB_VARIANTS); model and guard need FUSION_BUNDLE_AB=1; not in the default)
#   (tiles: the corpus once per tile tier, FUSION_GEMM_TILE=<tier>, for the model's calibration; not in the default)
#   (fitted: the corpus's layers fitted to a static N, timed against the
#   shipped units by the self-test in ./fitted; not in the default)
#   (sanitize-quick: the sanitizers on the native variant only; selftest:
#   builds the kernel self-test in ./selftest with nvcc, NVCC or nvcc on
#   PATH, and cuBLASLt, then runs its quick checks; not in the default)
# Each step logs to OUT/<step>*.log; a summary of pass/fail counts is printed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/logs}; shift || true
steps=${*:-tests fp8 ptx counter errors graphs examples property stress sanitize bench}
mkdir -p "$out"
cd "$here"
export FUSION_GRAPHS_DIR=$here/graphs
export FUSION_TEST_SEED=${FUSION_TEST_SEED:-$(date +%s)}
# The examples exit 0 without a GPU when run by hand; here that is a failure.
export FUSION_REQUIRE_GPU=1
echo "seed $FUSION_TEST_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
status=0
run() {
  local log=$1; shift
  echo "== $*"
  local started=$SECONDS
  "$@" >"$out/$log" 2>&1; local rc=$?
  tail -3 "$out/$log"
  echo "   ($((SECONDS - started))s)"
  [[ $rc -eq 0 ]] || { echo "FAILED ($rc): see $log"; status=1; }
}

# run_tests LOG EXPECTED CMD...: `run`, then fail unless the libtest
# summaries in LOG add up to EXPECTED passed tests, or to at least one when
# EXPECTED is `any`: a filter that matches nothing (a renamed test) passes
# with "0 passed" and must not look like success.
run_tests() {
  local log=$1 expected=$2; shift 2
  run "$log" "$@"
  local passed
  passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$out/$log" | awk '{n += $4} END {print n + 0}')
  if [[ $expected == any && $passed -eq 0 ]] || [[ $expected != any && $passed -ne $expected ]]; then
    echo "FAILED: $log: $passed tests passed, expected ${expected/any/at least 1} (a test renamed or filtered out?)"
    status=1
  fi
}

# Sanitizer test subsets (tests/gpu.rs, --exact names) at FUSION_TEST_SIZE=tiny:
# every kernel kind (plain GEMM epilogues, the [K, N] layout, norm
# prologues and folded norms, residual, gated GEMMs per call and bound,
# standalone norm and elementwise) without repeating
# what only differs in an activation functor. racecheck is the slowest.
memcheck_tests="gemm_bias_gelu gemm_bias_gelu_bound gemm_silu gemm_bias_silu_bound gemm_bias_residual layernorm_gemm rmsnorm_gemm layernorm_gemm_folded rmsnorm_gemm_folded gemm_silu_glu gemm_silu_glu_bound gemm_gelu_glu_bound layernorm_gemm_silu_glu_residual layernorm_gemm_silu_glu_residual_bound silu mul silu_mul layernorm rmsnorm"
racecheck_tests="gemm_bias_gelu gemm_silu layernorm_gemm layernorm_gemm_folded gemm_silu_glu silu layernorm"
initcheck_tests="gemm_bias_gelu gemm_bias_gelu_bound gemm_silu layernorm_gemm rmsnorm_gemm layernorm_gemm_folded gemm_silu_glu gemm_gelu_glu_bound mul silu_mul rmsnorm"
synccheck_tests="gemm_bias_gelu gemm_silu layernorm_gemm gemm_silu_glu layernorm"

# sanitize ARCH TOOL TESTS...: one compute-sanitizer run of the chosen tests
# on one variant (sm80 and sm75 run as PTX on newer GPUs). Each name must
# run: a renamed test fails the step. racecheck runs with stream-K off and
# without the tiny shapes whose CTAs wrap the ring (FUSION_TEST_SIZE=
# tiny-no-wrap): it reports the consumers' reads of the piece posted beside
# a stage against the producer's next post there once a CTA's k-blocks wrap
# the ring, stream-K pieces or whole tiles (641 x 16904 x 632, 3-4 tiles of
# 10 k-blocks a CTA; 200 x 2560 x 3072, 48 k-blocks on an 8-stage ring),
# though the stage's empty barrier orders them (benchmarks/HISTORY.md v21,
# v30); memcheck, initcheck and synccheck run those shapes and pieces, with stream-K over the last wave asked for (FUSION_STREAM_K=tail:
# split-K alone is the default), or SANITIZE_SPLITS's splits (fill: the
# lone wave of the tiny 200 x 2560 x 3072 shared out).
sanitize() {
  local arch=$1 tool=$2; shift 2
  local stream_k=${SANITIZE_SPLITS:-tail} suffix=${SANITIZE_SPLITS:+-$SANITIZE_SPLITS}
  local size=tiny
  [[ $tool == racecheck ]] && stream_k=0 size=tiny-no-wrap
  FUSION_STREAM_K=$stream_k FUSION_FORCE_ARCH=$arch FUSION_TEST_SIZE=$size run_tests "sanitize-$tool-$arch$suffix.log" $# \
    compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20 \
    ./gpu --ignored --exact --test-threads 1 --nocapture "$@"
}

for step in $steps; do
  case $step in
    # The structs read misaligned weights from padded copies on sm90 (the
    # default, FUSION_PAD_WEIGHTS=sm90), so the strided reads run here; the
    # free functions read dense rows.
    tests)
      FUSION_PAD_WEIGHTS=sm90 run_tests gpu-sm90.log any ./gpu --ignored --test-threads 8 --nocapture
      # The GEMMs with stream-K over the last wave too (FUSION_STREAM_K=tail,
      # off by default), and over a lone wave of more than half the SMs'
      # tiles (fill, slower on the corpus: benchmarks/HISTORY.md v31), at
      # shapes that share them out.
      for splits in tail fill; do
        FUSION_STREAM_K=$splits FUSION_TEST_SIZE=quick run_tests "gpu-sm90-$splits.log" any ./gpu --ignored --test-threads 8 --nocapture gemm
      done
      # The tile the model of the kernel's time names per call
      # (fusion::plan::TileModel), at shapes where it names each tier.
      run_tests gpu-tile-model.log 2 ./gpu_tile_model --ignored --nocapture ;;
    ptx)
      # Every generation the bundle built but the newest (the native
      # variant): sm80 and sm75, which run as PTX on newer GPUs.
      # FUSION_PAD_WEIGHTS=all: the structs' padded weights there too, so
      # that their strided B loads run (the free functions read dense rows).
      generations=$(cat "$here/generations")
      # shellcheck disable=SC2086 # the list is meant to split
      for arch in ${generations#* }; do
        [[ $arch == "$generations" ]] && break  # one generation built: none runs as PTX
        FUSION_PAD_WEIGHTS=all FUSION_FORCE_ARCH=$arch FUSION_TEST_SIZE=quick run_tests "gpu-$arch-ptx.log" any ./gpu --ignored --test-threads 8 --nocapture
      done ;;
    # The sm90 FP8 GEMMs (tests/gpu_fp8.rs, in a bundle built for sm90),
    # then memcheck and racecheck at its tiny shapes (no stream-K there).
    fp8)
      if [[ -x ./gpu_fp8 ]]; then
        run_tests gpu-fp8.log 3 ./gpu_fp8 --ignored --nocapture
        for tool in memcheck racecheck; do
          FUSION_TEST_SIZE=tiny run_tests "sanitize-$tool-fp8.log" 3 \
            compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20 \
            ./gpu_fp8 --ignored --test-threads 1 --nocapture
        done
      else
        echo "== fp8: no gpu_fp8 in this bundle (built without sm90)"
      fi ;;
    counter) FUSION_TILE_COUNTER=1 FUSION_TEST_SIZE=quick run_tests gpu-sm90-counter.log any ./gpu --ignored --test-threads 8 --nocapture ;;
    errors)
      # The other-context case needs a second GPU.
      gpus=$(nvidia-smi -L | grep -c '^GPU')
      skip=(--skip a_forced_variant_that_cannot_run_is_refused_by_the_wrapper)
      [[ $gpus -ge 2 ]] || skip+=(--skip a_tensor_from_another_device_is_refused)
      run_tests gpu-errors.log any ./gpu_errors --ignored "${skip[@]}"
      # A forced variant that does not exist: the wrapper refuses with ForcedArch.
      FUSION_FORCE_ARCH=sm61 run_tests gpu-errors-forced.log 1 ./gpu_errors --ignored --exact \
        a_forced_variant_that_cannot_run_is_refused_by_the_wrapper
      # fusion bench's cuBLASLt baseline refuses buffers that do not match its plan.
      run_tests gpu-cublaslt.log 3 ./gpu_cublaslt --ignored
      # The guard's vendor path (cuBLASLt and its epilogues, after the norm
      # kernel for a norm GEMM) against the CPU reference, f16 and bf16.
      run_tests gpu-guard.log 15 ./gpu_guard --ignored ;;
    graphs)
      run_tests gpu-graphs.log any ./gpu_graphs --ignored --nocapture
      # The executor's other callers first (the short tests before the long
      # ones): `fusion run`'s kernels are built at run time by nvcc (NVCC,
      # CUDA_HOME or PATH), and `fusion tune`'s candidates the same way,
      # each checked and timed through the executor.
      run_tests gpu-run.log 4 ./gpu_run --ignored --nocapture
      run_tests gpu-tune.log 1 ./gpu_tune --ignored --nocapture
      # A stack of layers in one workspace, eager and captured; with
      # FUSION_STREAM_K=0 direct calls run the captured schedule, and the
      # two must agree to the bit.
      run_tests gpu-forward.log 2 ./gpu_forward --ignored --nocapture
      FUSION_STREAM_K=0 run_tests gpu-forward-one-schedule.log 2 ./gpu_forward --ignored --nocapture
      run_tests gpu-workspace.log any ./gpu_workspace --ignored --test-threads 1 --nocapture
      run_tests gpu-safetensors.log any ./gpu_safetensors --ignored --nocapture
      run_tests gpu-llama-safetensors.log 1 ./llama_ffn_safetensors --ignored --nocapture ;;
    examples)
      run example-swiglu-ffn.log ./swiglu_ffn 512
      # 32 Llama-3-8B FFN sub-layers at M = 1: 11 GB of random weights
      # written to a temporary file, bound, run eagerly and captured.
      run example-llama-stack.log ./llama_stack 32 1
      run example-llama-ffn.log ./llama-ffn ;;
    property)
      run_tests gpu-property.log any ./gpu_property --ignored --nocapture
      FUSION_FORCE_ARCH=sm80 FUSION_PROPERTY_CASES=100 run_tests gpu-property-sm80.log any ./gpu_property --ignored --nocapture ;;
    # The stress tests' first shape splits by stream-K only with the tail
    # (FUSION_STREAM_K=tail), their second by split-K either way.
    stress) FUSION_STREAM_K=tail run_tests gpu-stress.log any ./gpu_stress --ignored --test-threads 1 --nocapture ;;
    candle)
      # Feature `candle` (a bundle made with FUSION_BUNDLE_CANDLE=1): linked
      # against the CUDA libraries by name, found here through
      # LD_LIBRARY_PATH or, where unset, PyTorch's copies of them.
      if [[ -z ${LD_LIBRARY_PATH:-} ]]; then
        LD_LIBRARY_PATH=$(python3 -c "import nvidia, os; d = os.path.dirname(nvidia.__path__[0]); print(':'.join(os.path.join(r) for r, _, fs in os.walk(d + '/nvidia') if any(f.startswith(('libcublas.so', 'libcurand.so', 'libnvrtc.so', 'libcudart.so')) for f in fs)))" 2>/dev/null)
        export LD_LIBRARY_PATH
      fi
      run_tests gpu-candle.log 3 ./gpu_candle --ignored --nocapture
      run example-candle-ffn.log ./candle_ffn 512 ;;
    sanitize|sanitize-quick)
      # Every generation the bundle was built for, newest (the native
      # variant) first: gpu-bundle.sh writes them from fusion-compiler's list.
      archs=$(cat "$here/generations")
      [[ $step == sanitize-quick ]] && archs=${archs%% *}
      for arch in $archs; do
        # shellcheck disable=SC2086 # the lists are meant to split
        sanitize "$arch" memcheck $memcheck_tests
        sanitize "$arch" racecheck $racecheck_tests
        sanitize "$arch" initcheck $initcheck_tests
        sanitize "$arch" synccheck $synccheck_tests
      done
      # FUSION_STREAM_K=fill (sm90's launchers; not the default) under memcheck.
      SANITIZE_SPLITS=fill sanitize "${archs%% *}" memcheck gemm_bias_gelu gemm_bias_residual layernorm_gemm gemm_silu_glu ;;
    bench) run bench.log ./fusion bench --json "$out/bench.json" ;;
    corpus) run corpus.log ./fusion bench --corpus corpus.toml --json "$out/corpus.json" ;;
    ab)
      # The build options against their baselines on the corpus (a bundle
      # made with FUSION_BUNDLE_AB=1): the tables (./fusion), the model's
      # tiles (./fusion-model), the guard (./fusion-guard), the same tool
      # with FUSION_GUARD=off (fused), the tables without split-K or
      # stream-K (nosk, FUSION_STREAM_K=0) and with stream-K over the last
      # wave too (tail, FUSION_STREAM_K=tail) or over a lone wave of more
      # than half the SMs' tiles (fill, FUSION_STREAM_K=fill), those of FUSION_AB_VARIANTS
      # (default: the first four), at the token counts of
      # FUSION_AB_TOKENS, part FUSION_AB_SHARD (I/N) of the rows; compare
      # with `fusion bench --summary`, and row by row with `fusion bench
      # --summary ab-fill.json --against ab-tables.json`, which the step
      # prints into ab-<variant>-vs-<first>.log for each variant after the
      # first. (The norm rows run the same kernels in all of them.)
      shard=(); [[ -n ${FUSION_AB_SHARD:-} ]] && shard=(--shard "$FUSION_AB_SHARD")
      first=
      for variant in ${FUSION_AB_VARIANTS:-tables model guard fused}; do
        tool=./fusion; settings=()
        case $variant in
          tables) ;;
          model) tool=./fusion-model ;;
          guard) tool=./fusion-guard ;;
          fused) tool=./fusion-guard; settings=(FUSION_GUARD=off) ;;
          nosk) settings=(FUSION_STREAM_K=0) ;;
          tail) settings=(FUSION_STREAM_K=tail) ;;
          fill) settings=(FUSION_STREAM_K=fill) ;;
          *) echo "FAILED: unknown ab variant $variant"; status=1; continue ;;
        esac
        [[ -x $tool ]] || { echo "FAILED: $tool missing (a bundle made with FUSION_BUNDLE_AB=1 has it)"; status=1; continue; }
        run "ab-$variant.log" env "${settings[@]}" "$tool" bench --corpus corpus.toml \
          --corpus-tokens "${FUSION_AB_TOKENS:-128,512,1000}" "${shard[@]}" \
          --runs "${FUSION_AB_RUNS:-10}" --json "$out/ab-$variant.json"
        # Row by row against the first variant of this step that ran.
        first=${first:-$variant}
        if [[ $variant != "$first" && -s $out/ab-$variant.json && -s $out/ab-$first.json ]]; then
          run "ab-$variant-vs-$first.log" ./fusion bench --summary "$out/ab-$variant.json" --against "$out/ab-$first.json"
        fi
      done ;;
    tiles)
      # Each tile tier of the GEMM units at every corpus layer (FUSION_GEMM_TILE):
      # the measurements the model of the kernel's time is fitted to
      # (fusion-compiler's select::model; its calibration names the files).
      # FUSION_TILES_TIERS, FUSION_TILES_TOKENS and FUSION_TILES_SHARD (I/N
      # of the rows) split a long run over several.
      shard=(); [[ -n ${FUSION_TILES_SHARD:-} ]] && shard=(--shard "$FUSION_TILES_SHARD")
      for tier in ${FUSION_TILES_TIERS:-large large_alt small_m small_m_alt few_m}; do
        FUSION_GEMM_TILE=$tier run "tiles-$tier.log" ./fusion bench --corpus corpus.toml \
          --corpus-tokens "${FUSION_TILES_TOKENS:-128,512,2048}" "${shard[@]}" \
          --runs "${FUSION_TILES_RUNS:-10}" --json "$out/tiles-$tier.json"
      done ;;
    selftest)
      run selftest-build.log make -C selftest -j "NVCC=${NVCC:-nvcc}"
      run selftest.log ./selftest/selftest --quick ;;
    fitted)
      # The corpus's layers whose GEMM a build with N static fits to N
      # (fusion render --fitted-corpus: fitted/fitted.txt), each timed
      # beside the shipped unit at M = 512 and 1000 (the self-test's bench,
      # the two alternating with cuBLASLt), then the time shipped / fitted
      # per row and its geometric mean: above 1, the fitted tile is faster.
      run fitted-build.log make -C fitted -j "NVCC=${NVCC:-nvcc}"
      run fitted-check.log ./fitted/selftest --quick
      : > "$out/fitted-bench.log"
      while read -r shape shipped fitted kernel; do
        echo "# $kernel $shape" >> "$out/fitted-bench.log"
        ./fitted/selftest --no-check --bench --reps="${FITTED_REPS:-30}" --unit="$shipped,$fitted" --shape="$shape" \
          | grep -E '^sm90' >> "$out/fitted-bench.log"
      done < fitted/fitted.txt
      # Each row: shipped and fitted µs (the bench's "ours" column, right
      # after the shape) and cuBLASLt's (the next), in the order --unit
      # names them; then the geometric means of shipped / fitted and of
      # the ratio to cuBLASLt of each (above 1: faster than cuBLASLt).
      awk '/^# / { kernel = $2; shape = $3; n = 0; next }
           { for (i = 1; i <= NF; ++i) if ($i ~ /^\([0-9]+,[0-9]+,[0-9]+\)$/) { us[n] = $(i + 1); lt[n] = $(i + 2); n++; break } }
           n == 2 { q = us[0] / us[1]; a = lt[0] / us[0]; b = lt[1] / us[1];
                    printf "%-22s %-18s shipped %8.1f fitted %8.1f  %.3fx  vs cuBLASLt %.3f -> %.3f\n", kernel, shape, us[0], us[1], q, a, b;
                    s += log(q); sa += log(a); sb += log(b); c++; n = 0 }
           END { if (c) printf "rows %d, shipped / fitted geomean %.3f; ratio to cuBLASLt geomean %.3f shipped, %.3f fitted\n", c, exp(s / c), exp(sa / c), exp(sb / c) }' \
        "$out/fitted-bench.log" | tee "$out/fitted-summary.log" | tail -1 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
