// The C ABI of include/trak_proj.h: argument checks, the K-split plan, launches, host hooks.
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "../include/trak_proj.h"
#include "rademacher_hash.cuh"
#include "rademacher_kernel.cuh"

#ifndef TRAK_PROJ_ARCHS
#define TRAK_PROJ_ARCHS "unknown"
#endif
#define TRAK_PROJ_STR2(x) #x
#define TRAK_PROJ_STR(x) TRAK_PROJ_STR2(x)

namespace trak_proj {
namespace {

thread_local char g_last_error[1024] = "";

int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return code;
}

int cuda_fail(cudaError_t err, const char* what) {
  return fail(TRAK_PROJ_ERR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The K-split depends on n alone, never on B, p, the workspace or the GPU, so every caller sees
// the same summation order. Up to 64 splits of at least 8192 rows, each at most 65536 rows: a
// 1e8-row block gives ~1500 splits, enough CTAs for any GPU even when B·p is one tile.
struct Plan {
  int64_t chunk;
  int64_t splits;
};

Plan plan_for(int64_t n) {
  constexpr int64_t kMinChunk = 8192, kMaxChunk = 65536, kTargetSplits = 64, kAlign = 1024;
  static_assert(kAlign % kBK == 0, "splits start on stage boundaries");
  int64_t chunk = ceil_div(ceil_div(n, kTargetSplits), kAlign) * kAlign;
  chunk = chunk < kMinChunk ? kMinChunk : chunk > kMaxChunk ? kMaxChunk : chunk;
  return Plan{chunk, ceil_div(n, chunk)};
}

constexpr int64_t kMaxGridYZ = 65535;

template <Mode M>
int launch_all(Params prm, int64_t splits, int64_t workspace_bytes, cudaStream_t stream) {
  constexpr int kSmem = SmemLayout<M>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(rademacher_kernel<M>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute");

  dim3 grid(static_cast<unsigned>(ceil_div(prm.p, kBP)), 1,
            static_cast<unsigned>(ceil_div(prm.B, kBB)));
  if (splits == 1) {
    prm.direct = 1;
    prm.split0 = 0;
    rademacher_kernel<M><<<grid, kThreads, kSmem, stream>>>(prm);
    err = cudaGetLastError();
    return err == cudaSuccess ? TRAK_PROJ_OK : cuda_fail(err, "rademacher_kernel launch");
  }

  const int64_t per_split = prm.B * prm.p * static_cast<int64_t>(sizeof(float));
  if (prm.ws == nullptr || workspace_bytes < per_split) {
    return fail(TRAK_PROJ_ERR_WORKSPACE,
                "a block of n=%lld rows is summed in %lld K-splits and needs a workspace of at "
                "least B*p*4 = %lld bytes (all splits at once: %lld); got %lld bytes at %p",
                static_cast<long long>(prm.n), static_cast<long long>(splits),
                static_cast<long long>(per_split), static_cast<long long>(per_split * splits),
                static_cast<long long>(workspace_bytes), static_cast<void*>(prm.ws));
  }
  int64_t wave = workspace_bytes / per_split;
  if (wave > splits) wave = splits;
  if (wave > kMaxGridYZ) wave = kMaxGridYZ;
  prm.direct = 0;
  const int64_t total = prm.B * prm.p;
  const int64_t reduce_blocks_max = int64_t{1} << 20;
  int64_t reduce_blocks = ceil_div(total, 256);
  if (reduce_blocks > reduce_blocks_max) reduce_blocks = reduce_blocks_max;
  for (int64_t s0 = 0; s0 < splits; s0 += wave) {
    const int64_t count = splits - s0 < wave ? splits - s0 : wave;
    prm.split0 = s0;
    grid.y = static_cast<unsigned>(count);
    rademacher_kernel<M><<<grid, kThreads, kSmem, stream>>>(prm);
    err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, "rademacher_kernel launch");
    reduce_splits_kernel<<<static_cast<unsigned>(reduce_blocks), 256, 0, stream>>>(
        prm.y, prm.ld_y, prm.ws, prm.B, prm.p, count);
    err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, "reduce_splits_kernel launch");
  }
  return TRAK_PROJ_OK;
}

}  // namespace
}  // namespace trak_proj

using namespace trak_proj;

extern "C" {

int trak_proj_abi_version(void) { return TRAK_PROJ_ABI_VERSION; }

const char* trak_proj_build_info(void) {
  return "trak_proj abi " TRAK_PROJ_STR(TRAK_PROJ_ABI_VERSION) " cuda " TRAK_PROJ_STR(
      CUDART_VERSION) " archs " TRAK_PROJ_ARCHS;
}

const char* trak_proj_last_error(void) { return g_last_error; }

int64_t trak_proj_workspace_bytes(int64_t B, int64_t n, int64_t p) {
  if (B <= 0 || n <= 0 || p <= 0) return 0;
  const Plan plan = plan_for(n);
  return plan.splits == 1 ? 0 : plan.splits * B * p * static_cast<int64_t>(sizeof(float));
}

int trak_proj_rademacher(const void* G, int g_dtype, int64_t B, int64_t n, int64_t ld_g,
                         uint64_t row_offset, float* Y, int64_t p, int64_t ld_y, uint64_t seed,
                         uint32_t model_id, int f32_terms, void* workspace,
                         int64_t workspace_bytes, void* cuda_stream) {
  g_last_error[0] = '\0';
  if (B < 0 || n < 0 || p < 0) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "negative size: B=%lld n=%lld p=%lld",
                static_cast<long long>(B), static_cast<long long>(n), static_cast<long long>(p));
  }
  if (g_dtype != TRAK_PROJ_F32 && g_dtype != TRAK_PROJ_F16 && g_dtype != TRAK_PROJ_BF16) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "g_dtype=%d; expected 0 (f32), 1 (f16), 2 (bf16)",
                g_dtype);
  }
  if (g_dtype == TRAK_PROJ_F32 && f32_terms != 2 && f32_terms != 3) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "f32_terms=%d; expected 2 or 3", f32_terms);
  }
  if (B == 0 || n == 0 || p == 0) return TRAK_PROJ_OK;
  if (G == nullptr || Y == nullptr) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "null pointer: G=%p Y=%p", G,
                static_cast<void*>(Y));
  }
  if (ld_g < 0 || ld_y < p) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "ld_g=%lld must be >= 0 and ld_y=%lld >= p=%lld",
                static_cast<long long>(ld_g), static_cast<long long>(ld_y),
                static_cast<long long>(p));
  }
  if (p > (int64_t{1} << 32)) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "p=%lld exceeds 2^32 columns",
                static_cast<long long>(p));
  }
  if (row_offset > UINT64_MAX - static_cast<uint64_t>(n - 1)) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "row_offset=%llu + n=%lld overflows 2^64",
                static_cast<unsigned long long>(row_offset), static_cast<long long>(n));
  }
  if (ceil_div(B, kBB) > kMaxGridYZ) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "B=%lld exceeds the %lld rows one call handles",
                static_cast<long long>(B), static_cast<long long>(kMaxGridYZ * kBB));
  }

  const int elem = g_dtype == TRAK_PROJ_F32 ? 4 : 2;
  const Plan plan = plan_for(n);
  Params prm{};
  prm.g = G;
  prm.B = B;
  prm.n = n;
  prm.ld_g = ld_g;
  prm.row_offset = row_offset;
  prm.y = Y;
  prm.p = p;
  prm.ld_y = ld_y;
  prm.ws = static_cast<float*>(workspace);
  prm.chunk = plan.chunk;
  prm.split0 = 0;
  prm.keys = philox_round_keys(seed);
  prm.model_id = model_id;
  prm.g_aligned = reinterpret_cast<uintptr_t>(G) % 16 == 0 && (B == 1 || (ld_g * elem) % 16 == 0);
  prm.direct = 0;
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream);

  switch (g_dtype) {
    case TRAK_PROJ_F16:
      return launch_all<Mode::kF16>(prm, plan.splits, workspace_bytes, stream);
    case TRAK_PROJ_BF16:
      return launch_all<Mode::kBF16>(prm, plan.splits, workspace_bytes, stream);
    default:
      return f32_terms == 2 ? launch_all<Mode::kF32x2>(prm, plan.splits, workspace_bytes, stream)
                            : launch_all<Mode::kF32x3>(prm, plan.splits, workspace_bytes, stream);
  }
}

int trak_proj_rademacher_signs_host(uint64_t seed, uint32_t model_id, uint64_t row0,
                                    int64_t nrows, uint64_t col0, int64_t ncols, int8_t* out) {
  g_last_error[0] = '\0';
  if (nrows < 0 || ncols < 0 || col0 + static_cast<uint64_t>(ncols) > (uint64_t{1} << 32)) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT,
                "nrows=%lld, ncols=%lld must be >= 0 and col0 + ncols <= 2^32 (col0=%llu)",
                static_cast<long long>(nrows), static_cast<long long>(ncols),
                static_cast<unsigned long long>(col0));
  }
  if (nrows == 0 || ncols == 0) return TRAK_PROJ_OK;
  if (out == nullptr) return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "out is null");
  const PhiloxKeys keys = philox_round_keys(seed);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint64_t row = row0 + static_cast<uint64_t>(r);
    uint64_t block = ~uint64_t{0};
    U32x4 words{0, 0, 0, 0};
    for (int64_t c = 0; c < ncols; ++c) {
      const uint64_t j = col0 + static_cast<uint64_t>(c);
      if ((j >> 7) != block) {
        block = j >> 7;
        words = rademacher_words(keys, model_id, row, static_cast<uint32_t>(block));
      }
      const uint32_t bit = (word_at(words, static_cast<int>((j >> 5) & 3)) >> (j & 31)) & 1u;
      out[r * ncols + c] = bit ? -1 : 1;
    }
  }
  return TRAK_PROJ_OK;
}

int trak_proj_p_tile_host(uint64_t seed, uint32_t model_id, uint64_t row0, uint32_t col_block,
                          int half_precision, uint16_t* out) {
  g_last_error[0] = '\0';
  if (out == nullptr) return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "out is null");
  const PhiloxKeys keys = philox_round_keys(seed);
  const uint32_t one_pair = half_precision ? kOnePairF16 : kOnePairBf16;
  for (int r = 0; r < kBK; ++r) {
    const U32x4 words = rademacher_words(keys, model_id, row0 + static_cast<uint64_t>(r),
                                         col_block);
    for (int c = 0; c < kBP / 8; ++c) {
      uint32_t pairs[4];
      expand_chunk(words, c, one_pair, pairs);
      for (int q = 0; q < 4; ++q) {
        out[r * kBP + 8 * c + 2 * q] = static_cast<uint16_t>(pairs[q] & 0xFFFFu);
        out[r * kBP + 8 * c + 2 * q + 1] = static_cast<uint16_t>(pairs[q] >> 16);
      }
    }
  }
  return TRAK_PROJ_OK;
}

int trak_proj_split_f32_host(const float* x, int64_t count, int terms, uint16_t* out) {
  g_last_error[0] = '\0';
  if (count < 0 || terms < 1 || terms > 3) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "count=%lld must be >= 0 and terms=%d in 1..3",
                static_cast<long long>(count), terms);
  }
  if (count > 0 && (x == nullptr || out == nullptr)) {
    return fail(TRAK_PROJ_ERR_INVALID_ARGUMENT, "null pointer");
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t t[3] = {0, 0, 0};
    if (terms == 1) split_f32<1>(x[i], t);
    if (terms == 2) split_f32<2>(x[i], t);
    if (terms == 3) split_f32<3>(x[i], t);
    for (int k = 0; k < terms; ++k) out[k * count + i] = t[k];
  }
  return TRAK_PROJ_OK;
}

}  // extern "C"
