/*
 * trak_proj: the C ABI of trak_dist's CUDA Rademacher projection (cuda_ext/README.md).
 *
 * Y[:, :p] += G[:, :n] · P[row_offset : row_offset + n, :p], with P the ±1 matrix of
 * docs/projection.md generated on the fly from Philox4x32-10, bit for bit the CPU reference.
 *
 * Plain C types only, so any caller (Python ctypes, C, Rust, another torch build) can use it.
 * All functions return 0 on success or a TRAK_PROJ_ERR_* code; trak_proj_last_error() then holds
 * a message for the calling thread.
 */
#ifndef TRAK_PROJ_H_
#define TRAK_PROJ_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TRAK_PROJ_API __attribute__((visibility("default")))
#else
#define TRAK_PROJ_API
#endif

/* Bumped whenever a signature or a semantic changes; callers refuse a library with another. */
#define TRAK_PROJ_ABI_VERSION 1

enum TrakProjDtype {
  TRAK_PROJ_F32 = 0,
  TRAK_PROJ_F16 = 1,
  TRAK_PROJ_BF16 = 2,
};

enum TrakProjStatus {
  TRAK_PROJ_OK = 0,
  TRAK_PROJ_ERR_INVALID_ARGUMENT = 1,
  TRAK_PROJ_ERR_CUDA = 2,
  TRAK_PROJ_ERR_WORKSPACE = 3,
};

/* TRAK_PROJ_ABI_VERSION of the library. */
TRAK_PROJ_API int trak_proj_abi_version(void);

/* "trak_proj <abi> cuda <runtime version> archs <list>": what this library was built with. */
TRAK_PROJ_API const char* trak_proj_build_info(void);

/* Message of the last failed call on this thread ("" if none). */
TRAK_PROJ_API const char* trak_proj_last_error(void);

/*
 * Bytes of workspace that lets trak_proj_rademacher run all its K-splits in one wave: 0 when a
 * block of n rows needs no split, else splits(n) · B · p · 4. Any workspace of at least B · p · 4
 * bytes is accepted (fewer splits per wave, the same result bit for bit).
 */
TRAK_PROJ_API int64_t trak_proj_workspace_bytes(int64_t B, int64_t n, int64_t p);

/*
 * Y[b, j] += sum_k G[b, k] · P[row_offset + k, j]   for b < B, j < p, k < n.
 *
 * G        device pointer, row b at G + b · ld_g elements, entries contiguous (stride 1);
 *          dtype g_dtype (TrakProjDtype). Any alignment; 16-byte alignment of G and of
 *          ld_g · sizeof(element) enables vector loads.
 * Y        device float32, row b at Y + b · ld_y (ld_y >= p); accumulated into, never cleared.
 * seed, model_id   the projection's key (docs/projection.md); row_offset + n <= 2^64, p <= 2^32.
 * f32_terms        fp32 G only: bf16 terms G is split into (2 or 3; see README for the error).
 * workspace        device memory of workspace_bytes bytes, or NULL when
 *                  trak_proj_workspace_bytes(B, n, p) == 0.
 * cuda_stream      cudaStream_t the work is queued on (NULL: the legacy default stream); the
 *                  work runs on the calling thread's current device, which must own the stream.
 *
 * Asynchronous: returns once the kernels are queued. The result is deterministic: it depends on
 * (G, Y, n, seed, model_id, row_offset) alone, not on B, p, the workspace size, or the GPU.
 */
TRAK_PROJ_API int trak_proj_rademacher(const void* G, int g_dtype, int64_t B, int64_t n,
                                       int64_t ld_g, uint64_t row_offset, float* Y, int64_t p,
                                       int64_t ld_y, uint64_t seed, uint32_t model_id,
                                       int f32_terms, void* workspace, int64_t workspace_bytes,
                                       void* cuda_stream);

/*
 * Host-only checks of the code the kernel runs (no GPU needed).
 *
 * trak_proj_rademacher_signs_host: out[r · ncols + c] = P[row0 + r, col0 + c] (±1), from the
 * same Philox and sign rule the kernel is compiled from. col0 + ncols <= 2^32.
 */
TRAK_PROJ_API int trak_proj_rademacher_signs_host(uint64_t seed, uint32_t model_id, uint64_t row0,
                                                  int64_t nrows, uint64_t col0, int64_t ncols,
                                                  int8_t* out);

/*
 * The 32 × 128 tile of P the kernel writes to shared memory for rows row0 … row0+31 and columns
 * 128 · col_block … +127, as fp16 (half_precision != 0) or bf16 bit patterns, row-major.
 */
TRAK_PROJ_API int trak_proj_p_tile_host(uint64_t seed, uint32_t model_id, uint64_t row0,
                                        uint32_t col_block, int half_precision, uint16_t* out);

/*
 * The kernel's split of fp32 values into `terms` bf16 values (bit patterns), hi first:
 * out[t · count + i] is term t of x[i].
 */
TRAK_PROJ_API int trak_proj_split_f32_host(const float* x, int64_t count, int terms,
                                           uint16_t* out);

#ifdef __cplusplus
}
#endif

#endif /* TRAK_PROJ_H_ */
