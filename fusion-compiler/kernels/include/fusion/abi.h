/* The C ABI between generated launchers and their callers (the Rust
 * wrappers, through bindgen). Plain C, only <stdint.h>: bindgen may run on a
 * libclang without clang's own headers.
 *
 * Every launcher is `int <symbol>(const <params>* p, void* stream)` and
 * returns a cudaError_t as int (0 is success). The stream is `void*` so the
 * bindings do not declare a CUstream type of their own. One params struct
 * serves every composition of a kind; pointers a composition does not read
 * are null. Every pointer is a device address, 16-byte aligned.
 *
 * A GEMM launcher also has `int <symbol>_resources(fusion_tile_resources*
 * out, int capacity)`, which says what its tile configs ask for per block.
 *
 * It also has `int <symbol>_workspace_bytes(const
 * fusion_gemm_params* p, void* stream, uint64_t* bytes)`: the device memory
 * the launch of the same params needs as its workspace (stream-K partials
 * and flags, a folded norm's row statistics, a per-call norm's normalized
 * A; 0 when none) on the current device. The caller owns that memory,
 * zeroes it when it allocates it and passes it in `workspace`; launchers
 * never allocate. A null, smaller or misaligned workspace makes the launch
 * do without stream-K, and a norm's launch without room for its row
 * statistics or normalized A returns cudaErrorInvalidValue.
 *
 * A GEMM whose norm prologue's gamma and beta are weights can also run
 * folded: `int <symbol>_fold_weights(const fusion_fold_params* p, void*
 * stream)` writes W' = W·diag(gamma) and the per-column terms once, when the
 * weights are bound, and `<symbol>_folded` (with its own
 * `_workspace_bytes`) then takes W' as `b` and the terms as `col_terms`,
 * and reads no gamma or beta.
 *
 * A gated GEMM's launcher has `_fold_weights` too, which interleaves its
 * gate and up weights (`w`, `w_up`) into one, with the norm folded in when
 * the params give gamma; the launcher (or `_folded`) then takes that as
 * `b`, with `b_up` null. */
#ifndef FUSION_ABI_H
#define FUSION_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C = epilogue(prologue(A) @ B). A gated GEMM (act(A @ B) * (A @ B_up),
 * fusion/gated.cuh) takes B as gate and up interleaved, prepared by
 * `_fold_weights`, or gate in `b` and up in `b_up` per call (the launch
 * interleaves them into its workspace); `n` is C's columns either way. */
typedef struct fusion_gemm_params {
  const void* a;          /* [m, k] */
  const void* b;          /* [k, n] or [n, k], as the launcher's layout says */
  const void* b_up;       /* a gated GEMM's up weight, b's shape, given per call (the launch then writes
                           * both weights interleaved into its workspace first: 2 n k elements, which
                           * at decode costs more than the GEMM); null when b is prepared */
  void* c;                /* [m, n] */
  const void* bias;       /* [n], the bias step */
  const void* residual;   /* [m, n], the residual step */
  const void* multiplier; /* [m, n], the mul step */
  const void* gamma;      /* [k], a per-call norm's scale */
  const void* beta;       /* [k], LayerNorm's shift */
  const void* col_terms;  /* f32 pairs [n]: a folded norm's (rowsum of W', W·beta) */
  int64_t m, n, k;
  int64_t ldb;              /* B's row stride in elements: 0 for dense rows (k for [n, k], n for [k, n];
                             * a gated GEMM's prepared B counts its 2n columns), else at least that and a
                             * multiple of 8, e.g. a bound weight's rows padded to 128 bytes */
  float eps;                /* the norm's epsilon */
  uint32_t flags;           /* FUSION_GEMM_* bits */
  void* workspace;          /* see <symbol>_workspace_bytes; null for none */
  uint64_t workspace_bytes; /* the size of `workspace` */
  const void* scale_a;      /* f32 [1]: an FP8 GEMM's scale of A (null for others) */
  const void* scale_b;      /* f32 [1] or [n]: an FP8 GEMM's scale of B, per tensor or per output channel */
} fusion_gemm_params;

/* fusion_gemm_params::flags: every tile runs whole on one CTA (no split-K
 * or stream-K), e.g. for a launch captured into a graph that may replay
 * beside other launches sharing its workspace. */
#define FUSION_GEMM_NO_STREAM_K 1u
/* fusion_gemm_params::flags: each CTA's whole tiles are fixed at launch
 * (no tile counter in the workspace), for the same reason; without it the
 * sm90 kernel's CTAs take whole tiles from a counter as they get to them,
 * so that CTAs delayed by another stream's kernels take fewer. */
#define FUSION_GEMM_STATIC_TILES 2u
/* fusion_gemm_params::flags, bits 2-4: a tile tier the caller names, for
 * measuring each tier of a unit at any shape (the run time's
 * FUSION_GEMM_TILE): FUSION_GEMM_TILE_<TIER> << FUSION_GEMM_TILE_SHIFT. 0,
 * or a tier the unit does not have, leaves the choice to the launcher; a
 * named tier runs ahead of the decode kernel. */
#define FUSION_GEMM_TILE_SHIFT 2u
#define FUSION_GEMM_TILE_MASK (7u << FUSION_GEMM_TILE_SHIFT)
#define FUSION_GEMM_TILE_LARGE 1u
#define FUSION_GEMM_TILE_LARGE_ALT 2u
#define FUSION_GEMM_TILE_SMALL_M 3u
#define FUSION_GEMM_TILE_SMALL_M_ALT 4u
/* The sm90 few-M tile (64x64), which the launcher otherwise runs only
 * where its tiles make one wave (fusion/gemm.cuh's few_m_runs). */
#define FUSION_GEMM_TILE_FEW_M 5u
/* fusion_gemm_params::flags: besides split-K where the tiles are fewer than
 * the SMs, share the last wave's tiles out over every CTA (stream-K) where
 * the tiles are more. Off by default: over the layer corpus's GEMMs on an
 * H200 it took 1.025x the time of whole last waves on the 46 rows it ran
 * (geometric mean), from 0.95x to 1.15x row by row, and it doubled
 * the time of four launches at once on four streams at 8192^3 on an H100
 * (the run time's FUSION_STREAM_K=tail asks for it). It also keeps split-K
 * on tiles of fewer than 48 k-blocks, which is otherwise refused: the plan
 * as it was before the corpus measured it. */
#define FUSION_GEMM_STREAM_K_TAIL 32u
/* fusion_gemm_params::flags: where the tiles are more than half the SMs but
 * fewer, share them out over every CTA (stream-K over the lone wave)
 * instead of running them whole on fewer CTAs than SMs; being measured (the
 * run time's FUSION_STREAM_K=fill asks for it). */
#define FUSION_GEMM_STREAM_K_FILL 64u

/* A norm folded into the weight of the GEMM after it: w_folded =
 * w·diag(gamma) in w's layout, col_terms[j] = (Σ_k w_folded[j, k],
 * Σ_k w[j, k]·beta[k]) in f32, for j < n. For a gated GEMM, w is w and
 * w_up interleaved (fusion/gated.cuh): 2n columns; with gamma null the
 * weights are only interleaved and col_terms is not written. */
typedef struct fusion_fold_params {
  const void* w;     /* [n, k] or [k, n], as the launcher's layout says */
  const void* w_up;  /* a gated GEMM's up weight, w's shape; null for others */
  const void* gamma; /* [k] */
  const void* beta;  /* [k], LayerNorm only */
  void* w_folded;    /* w's shape and layout; a gated GEMM's [2n, k] or [k, 2n] */
  void* col_terms;   /* f32 pairs [n] (a gated GEMM's [2n]) */
  int64_t n, k;
  int64_t ld_folded; /* w_folded's row stride in elements, as fusion_gemm_params::ldb: 0 for dense */
} fusion_fold_params;

/* y = norm(x) over rows of length k. */
typedef struct fusion_norm_params {
  const void* x;     /* [m, k] */
  void* y;           /* [m, k] */
  const void* gamma; /* [k]; null, with beta null: the norm without its affine */
  const void* beta;  /* [k], LayerNorm only */
  int64_t m, k;
  float eps;
} fusion_norm_params;

/* The most steps an elementwise launcher chains (the planner's
 * MAX_EPILOGUE_STEPS). */
#define FUSION_ELEMENTWISE_MAX_STEPS 4

/* y = steps(x) elementwise: the launcher's steps applied in order, step i
 * reading operands[i], so that a chain may read two tensors of one kind
 * (x * a * b). */
typedef struct fusion_elementwise_params {
  const void* x; /* [m, n] */
  void* y;       /* [m, n] */
  /* Per step: [n] for a bias add, [m, n] for the other addend of an add or
   * the other factor of a mul; null for a step that reads none and past
   * the last step. */
  const void* operands[FUSION_ELEMENTWISE_MAX_STEPS];
  int64_t m, n;
} fusion_elementwise_params;

/* What one tile config of a GEMM launcher asks for per block at launch;
 * `tile` names the config as the tuned tables do: "large", "large_alt",
 * "small_m", "small_m_alt" or "few_m", or is "decode" for the decode kernel that runs for
 * m <= the table's decode_max_m (fusion/decode.cuh). */
typedef struct fusion_tile_resources {
  const char* tile;
  uint32_t smem_bytes; /* dynamic shared memory */
  uint32_t threads;
} fusion_tile_resources;

#ifdef __cplusplus
}
#endif

#endif /* FUSION_ABI_H */
