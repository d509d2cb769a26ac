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
 * and flags, a norm prologue's row statistics; 0 when none) on the current
 * device. The caller owns that memory, zeroes it when it allocates it and
 * passes it in `workspace`; launchers never allocate. A null, smaller or
 * misaligned workspace makes the launch do without stream-K, and a norm
 * prologue's launch without room for its row statistics returns
 * cudaErrorInvalidValue. */
#ifndef FUSION_ABI_H
#define FUSION_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C = epilogue(prologue(A) @ B). */
typedef struct fusion_gemm_params {
  const void* a;          /* [m, k] */
  const void* b;          /* [k, n] or [n, k], as the launcher's layout says */
  void* c;                /* [m, n] */
  const void* bias;       /* [n], the bias step */
  const void* residual;   /* [m, n], the residual step */
  const void* multiplier; /* [m, n], the mul step */
  const void* gamma;      /* [k], the norm prologue's scale */
  const void* beta;       /* [k], LayerNorm's shift */
  int64_t m, n, k;
  float eps;                /* the norm prologue's epsilon */
  uint32_t flags;           /* FUSION_GEMM_* bits */
  void* workspace;          /* see <symbol>_workspace_bytes; null for none */
  uint64_t workspace_bytes; /* the size of `workspace` */
} fusion_gemm_params;

/* fusion_gemm_params::flags: every tile runs whole on one CTA (no split-K
 * or stream-K), e.g. for a launch captured into a graph that may replay
 * beside other launches sharing its workspace. */
#define FUSION_GEMM_NO_STREAM_K 1u

/* y = norm(x) over rows of length k. */
typedef struct fusion_norm_params {
  const void* x;     /* [m, k] */
  void* y;           /* [m, k] */
  const void* gamma; /* [k] */
  const void* beta;  /* [k], LayerNorm only */
  int64_t m, k;
  float eps;
} fusion_norm_params;

/* y = step(x) elementwise. */
typedef struct fusion_elementwise_params {
  const void* x;          /* [m, n] */
  void* y;                /* [m, n] */
  const void* bias;       /* [n], bias add */
  const void* residual;   /* [m, n], the other addend of add */
  const void* multiplier; /* [m, n], the other factor of mul */
  int64_t m, n;
} fusion_elementwise_params;

/* What one tile config of a GEMM launcher asks for per block at launch;
 * `tile` names the config as the tuned tables do: "large", "small_m" or
 * "small_m_alt". */
typedef struct fusion_tile_resources {
  const char* tile;
  uint32_t smem_bytes; /* dynamic shared memory */
  uint32_t threads;
} fusion_tile_resources;

#ifdef __cplusplus
}
#endif

#endif /* FUSION_ABI_H */
