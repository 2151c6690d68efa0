// Y += G · P with P generated on the fly: the kernel and its tiling (cuda_ext/README.md).
//
// GEMM view: Yᵀ[p, B] += Pᵀ[p, K] · Gᵀ[K, B]. Pᵀ is the mma "A" operand (M = columns of P),
// Gᵀ the "B" operand (N = batch rows): G's rows are contiguous in K, which is exactly the
// m16n8k16 ".col" B layout, and a batch granularity of 8 wastes less than 16 for small B.
//
// One CTA owns a 128-column block of P (one Philox call per row) × 128 batch rows × one K-split.
// Per 32-row stage: one warp hashes 32 rows (stage s+2, rotating warps), all threads expand the
// previous hash words into a ±1 bf16/fp16 tile in shared memory (stage s+1), load G registers
// for stage s+1, and all warps run mma.sync on stage s. Two shared buffers, one barrier a stage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "rademacher_hash.cuh"

namespace trak_proj {

enum class Mode : int { kF16 = 0, kBF16 = 1, kF32x2 = 2, kF32x3 = 3 };

// What a mode means for the kernel: bytes per G element, bf16 terms per G element (fp32 is split
// into 2 or 3), and whether the MMA takes fp16 (otherwise bf16) inputs.
template <Mode M>
struct ModeTraits {
  static constexpr bool kF32 = M == Mode::kF32x2 || M == Mode::kF32x3;
  static constexpr int kInBytes = kF32 ? 4 : 2;
  static constexpr int kTerms = M == Mode::kF32x3 ? 3 : M == Mode::kF32x2 ? 2 : 1;
  static constexpr bool kF16Mma = M == Mode::kF16;
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBP = 128;  // columns of P per CTA
constexpr int kBB = 128;  // batch rows per CTA
constexpr int kBK = 32;   // rows of P per pipeline stage
// Tensor cores accumulate in fp32 with truncation, a bias that grows with the chain of MMAs
// into one accumulator; every kFlushStages stages the MMA accumulator is added to a second one
// with round-to-nearest adds, so chains stay 1024 rows long whatever the split length.
constexpr int kFlushStages = 32;
constexpr int kWarpsP = 4;
constexpr int kWarpsB = kWarps / kWarpsP;
constexpr int kWP = kBP / kWarpsP;  // 32 columns per warp
constexpr int kWB = kBB / kWarpsB;  // 64 batch rows per warp
constexpr int kMT = kWP / 16;       // m16 tiles per warp
constexpr int kNT = kWB / 8;        // n8 tiles per warp
// +8 elements (16 bytes) per row: consecutive rows then start in different 16-byte bank groups
// (the row pitch in 16-byte units is odd), so ldmatrix's 8 row reads never conflict.
constexpr int kPStride = kBP + 8;
constexpr int kGStride = kBK + 8;

static_assert(kBP == kColsPerHash, "a CTA's columns are exactly one hash block");
static_assert(kBK == 32, "the hash warp computes one row per lane");
static_assert(kThreads == kBK * 8, "expansion: 8 threads per row, two 8-column chunks each");
static_assert(kWarpsP * kWarpsB == kWarps && kWP * kWarpsP == kBP && kWB * kWarpsB == kBB, "");
static_assert(kWP % 16 == 0 && kWB % 16 == 0 && kBK % 16 == 0, "whole m16n8k16 tiles");
static_assert((kPStride * 2) % 16 == 0 && ((kPStride * 2 / 16) & 1) == 1, "P row pitch");
static_assert((kGStride * 2) % 16 == 0 && ((kGStride * 2 / 16) & 1) == 1, "G row pitch");

constexpr int kWordsBuf = kBK;             // uint4 per words buffer
constexpr int kPBuf = kBK * kPStride;      // uint16 per P buffer
constexpr int kWordsBytes = 2 * kWordsBuf * 16;
constexpr int kPBytes = 2 * kPBuf * 2;

template <Mode M>
struct SmemLayout {
  static constexpr int kGBuf = ModeTraits<M>::kTerms * kBB * kGStride;  // uint16 per G buffer
  static constexpr int kBytes = kWordsBytes + kPBytes + 2 * kGBuf * 2;
};
static_assert(kWordsBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned sections");

struct Params {
  const void* g;
  int64_t B, n, ld_g;
  uint64_t row_offset;
  float* y;
  int64_t p, ld_y;
  float* ws;       // [splits in this wave][B][p] partial sums, unused when direct
  int64_t chunk;   // rows of the block per K-split (a multiple of kBK)
  int64_t split0;  // first split of this launch
  PhiloxKeys keys;
  uint32_t model_id;
  int g_aligned;  // every row start is 16-byte aligned: vector loads are legal
  int direct;     // one split: add into y; else write partial sums to ws
};

// ---- G: global → registers → shared --------------------------------------------------------

template <Mode M>
struct GLoad {
  static constexpr int kInBytes = ModeTraits<M>::kInBytes;
  static constexpr int kElems = 16 / kInBytes;  // per 16-byte chunk
  static constexpr int kChunksPerRow = kBK / kElems;
  static constexpr int kChunks = kBB * kChunksPerRow / kThreads;  // per thread
  static_assert(kBK % kElems == 0 && (kBB * kChunksPerRow) % kThreads == 0, "");
};

template <int kInBytes>
__device__ __forceinline__ uint4 load_chunk_checked(const unsigned char* src, int64_t valid) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if constexpr (kInBytes == 4) {
    const unsigned int* q = reinterpret_cast<const unsigned int*>(src);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < valid) w[e] = __ldg(q + e);
    }
  } else {
    const unsigned short* q = reinterpret_cast<const unsigned short*>(src);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < valid) w[e >> 1] |= static_cast<uint32_t>(__ldg(q + e)) << (16 * (e & 1));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stage `stage` of this CTA's split into registers; rows ≥ B and columns ≥ the split's end
// are zero, so the padded products vanish whatever P holds there.
template <Mode M>
__device__ __forceinline__ void load_g(uint4 (&staged)[GLoad<M>::kChunks], const Params& prm,
                                       int64_t b0, int rows_valid, int64_t k_begin,
                                       int64_t k_len, int stage, int tid) {
  using L = GLoad<M>;
  const int64_t k_stage = static_cast<int64_t>(stage) * kBK;
  const bool vector_ok = prm.g_aligned && k_stage + kBK <= k_len;
  const unsigned char* base = static_cast<const unsigned char*>(prm.g);
#pragma unroll
  for (int i = 0; i < L::kChunks; ++i) {
    const int q = tid + i * kThreads;
    const int r = q / L::kChunksPerRow;
    const int part = q % L::kChunksPerRow;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows_valid) {
      const int64_t kc = k_stage + part * L::kElems;
      const unsigned char* src = base + ((b0 + r) * prm.ld_g + k_begin + kc) * L::kInBytes;
      if (vector_ok) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        v = load_chunk_checked<L::kInBytes>(src, k_len - kc);
      }
    }
    staged[i] = v;
  }
}

__device__ __forceinline__ uint32_t pack_pair(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Registers → shared G buffer [kTerms][kBB][kGStride]; fp32 is split into bf16 terms here.
template <Mode M>
__device__ __forceinline__ void store_g(const uint4 (&staged)[GLoad<M>::kChunks], uint16_t* g_buf,
                                        int tid) {
  using L = GLoad<M>;
  constexpr int kTerms = ModeTraits<M>::kTerms;
#pragma unroll
  for (int i = 0; i < L::kChunks; ++i) {
    const int q = tid + i * kThreads;
    const int r = q / L::kChunksPerRow;
    const int part = q % L::kChunksPerRow;
    if constexpr (L::kInBytes == 2) {
      *reinterpret_cast<uint4*>(g_buf + r * kGStride + part * L::kElems) = staged[i];
    } else {
      uint16_t t0[kTerms], t1[kTerms], t2[kTerms], t3[kTerms];
      split_f32<kTerms>(__uint_as_float(staged[i].x), t0);
      split_f32<kTerms>(__uint_as_float(staged[i].y), t1);
      split_f32<kTerms>(__uint_as_float(staged[i].z), t2);
      split_f32<kTerms>(__uint_as_float(staged[i].w), t3);
#pragma unroll
      for (int t = 0; t < kTerms; ++t) {
        *reinterpret_cast<uint2*>(g_buf + (t * kBB + r) * kGStride + part * L::kElems) =
            make_uint2(pack_pair(t0[t], t1[t]), pack_pair(t2[t], t3[t]));
      }
    }
  }
}

// ---- P: hash words → ±1 tile in shared memory ----------------------------------------------

__device__ __forceinline__ void hash_stage(uint4* words_buf, const Params& prm, int64_t k_first,
                                           uint32_t col_block, int lane) {
  const uint64_t row = prm.row_offset + static_cast<uint64_t>(k_first + lane);
  const U32x4 w = rademacher_words(prm.keys, prm.model_id, row, col_block);
  words_buf[lane] = make_uint4(w.x, w.y, w.z, w.w);
}

// Thread t expands row t/8, chunks h and h+8 (h = t%8): a quarter-warp's 16-byte stores then
// cover 128 contiguous bytes, free of bank conflicts.
__device__ __forceinline__ void expand_stage(const uint4* words_buf, uint16_t* p_buf,
                                             uint32_t one_pair, int tid) {
  const int r = tid >> 3;
  const int h = tid & 7;
  const uint4 raw = words_buf[r];
  const U32x4 w{raw.x, raw.y, raw.z, raw.w};
  uint32_t out[4];
  expand_chunk(w, h, one_pair, out);
  *reinterpret_cast<uint4*>(p_buf + r * kPStride + 8 * h) =
      make_uint4(out[0], out[1], out[2], out[3]);
  expand_chunk(w, h + 8, one_pair, out);
  *reinterpret_cast<uint4*>(p_buf + r * kPStride + 8 * (h + 8)) =
      make_uint4(out[0], out[1], out[2], out[3]);
}

// ---- tensor cores ----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One stage of the warp's 32 × 64 (columns × batch) tile. Every accumulator sees the same
// sequence of MMAs (per 16 rows: term 0, term 1, …) whatever its position, B or p: that is what
// makes results independent of the batch and of p (the prefix property holds bit for bit).
//
// Fragment addresses (PTX ISA, "Matrix Fragments for mma.m16n8k16", ldmatrix): lane l feeds row
// (l & 7) of 8×8 matrix l >> 3. A = Pᵀ (16 columns × 16 rows of P) comes from the row-major P
// tile through .trans; its registers are [m0-7,k0-7], [m8-15,k0-7], [m0-7,k8-15], [m8-15,k8-15],
// so matrix q sits at row offset 8·(q >> 1), column offset 8·(q & 1). B = Gᵀ (16 rows of P × 8
// batch rows) is G's [batch][k] tile read without .trans; an x4 load yields {b0, b1} of batch
// rows n…n+7 (matrices 0, 1: k offsets 0, 8) and of n+8…n+15 (matrices 2, 3).
template <Mode M>
__device__ __forceinline__ void compute_stage(float (&acc)[kMT][kNT][4], const uint16_t* p_buf,
                                              const uint16_t* g_buf, int lane, int m_base,
                                              int n_base, int rows_valid) {
  constexpr int kTerms = ModeTraits<M>::kTerms;
  const int l_row = (lane & 7) + ((lane >> 4) << 3);
  const int l_col = ((lane >> 3) & 1) << 3;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      ldmatrix_x4_trans(a[mt], p_buf + (kk + l_row) * kPStride + m_base + mt * 16 + l_col);
    }
#pragma unroll
    for (int t = 0; t < kTerms; ++t) {
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        if (n_base + np * 16 < rows_valid) {
          uint32_t b[4];
          ldmatrix_x4(b, g_buf + (t * kBB + n_base + np * 16 + l_row) * kGStride + kk + l_col);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<ModeTraits<M>::kF16Mma>(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma_16816<ModeTraits<M>::kF16Mma>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
}

// ---- the kernel ------------------------------------------------------------------------------

// grid: x = 128-column block of P, y = K-split within this launch, z = 128-row batch block.
template <Mode M>
__global__ void __launch_bounds__(kThreads, 1) rademacher_kernel(const Params prm) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* s_words = reinterpret_cast<uint4*>(smem);
  uint16_t* s_p = reinterpret_cast<uint16_t*>(smem + kWordsBytes);
  uint16_t* s_g = reinterpret_cast<uint16_t*>(smem + kWordsBytes + kPBytes);
  constexpr int kGBuf = SmemLayout<M>::kGBuf;
  constexpr uint32_t kOnePair = ModeTraits<M>::kF16Mma ? kOnePairF16 : kOnePairBf16;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const uint32_t col_block = blockIdx.x;
  const int64_t split = prm.split0 + blockIdx.y;
  const int64_t b0 = static_cast<int64_t>(blockIdx.z) * kBB;
  const int64_t k_begin = split * prm.chunk;
  const int64_t k_len = min(prm.chunk, prm.n - k_begin);
  const int num_stages = static_cast<int>((k_len + kBK - 1) / kBK);
  const int rows_valid = static_cast<int>(min(static_cast<int64_t>(kBB), prm.B - b0));
  const int cols_valid = static_cast<int>(
      min(static_cast<int64_t>(kBP), prm.p - static_cast<int64_t>(col_block) * kBP));
  const int m_base = (warp % kWarpsP) * kWP;
  const int n_base = (warp / kWarpsP) * kWB;
  const bool warp_active = m_base < cols_valid && n_base < rows_valid;

  float acc[kMT][kNT][4];    // the current MMA chain
  float total[kMT][kNT][4];  // finished chains, summed with round-to-nearest
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[mt][nt][i] = 0.0f;
        total[mt][nt][i] = 0.0f;
      }
    }
  }
  uint4 staged[GLoad<M>::kChunks];

  if (warp == 0) hash_stage(s_words, prm, k_begin, col_block, lane);
  if (warp == 1 && num_stages > 1) {
    hash_stage(s_words + kWordsBuf, prm, k_begin + kBK, col_block, lane);
  }
  load_g<M>(staged, prm, b0, rows_valid, k_begin, k_len, 0, tid);
  store_g<M>(staged, s_g, tid);
  __syncthreads();
  expand_stage(s_words, s_p, kOnePair, tid);
  __syncthreads();

  // Buffer s & 1 holds stage s (words, P tile, G tile). Iteration s reads buffer cur; writes
  // buffer nxt (stage s+1, whose words were hashed one iteration earlier) and the words of stage
  // s+2 into words buffer cur, which no one reads again until after the barrier.
  for (int s = 0; s < num_stages; ++s) {
    const int cur = s & 1;
    const int nxt = cur ^ 1;
    const bool has_next = s + 1 < num_stages;
    if (has_next) load_g<M>(staged, prm, b0, rows_valid, k_begin, k_len, s + 1, tid);
    if (s + 2 < num_stages && warp == s % kWarps) {
      hash_stage(s_words + cur * kWordsBuf, prm, k_begin + static_cast<int64_t>(s + 2) * kBK,
                 col_block, lane);
    }
    if (warp_active) {
      compute_stage<M>(acc, s_p + cur * kPBuf, s_g + cur * kGBuf, lane, m_base, n_base,
                       rows_valid);
      if ((s + 1) % kFlushStages == 0 || !has_next) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              total[mt][nt][i] += acc[mt][nt][i];
              acc[mt][nt][i] = 0.0f;
            }
          }
        }
      }
    }
    if (has_next) {
      store_g<M>(staged, s_g + nxt * kGBuf, tid);
      expand_stage(s_words + nxt * kWordsBuf, s_p + nxt * kPBuf, kOnePair, tid);
    }
    __syncthreads();
  }

  if (!warp_active) return;
  // Accumulator i of tile (mt, nt): column m_base + 16·mt + gid + 8·(i >> 1) of the block,
  // batch row n_base + 8·nt + 2·tq + (i & 1).
  const int gid = lane >> 2;
  const int tq = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m_base + mt * 16 + gid + ((i >> 1) << 3);
        const int nrow = n_base + nt * 8 + 2 * tq + (i & 1);
        if (m < cols_valid && nrow < rows_valid) {
          const int64_t j = static_cast<int64_t>(col_block) * kBP + m;
          const int64_t b = b0 + nrow;
          if (prm.direct) {
            prm.y[b * prm.ld_y + j] += total[mt][nt][i];
          } else {
            prm.ws[(static_cast<int64_t>(blockIdx.y) * prm.B + b) * prm.p + j] = total[mt][nt][i];
          }
        }
      }
    }
  }
}

// Y[b, j] += ws[0][b][j] + ws[1][b][j] + … in split order: the fixed order that makes split-K
// deterministic (and the same whatever number of splits each launch covers).
__global__ void reduce_splits_kernel(float* y, int64_t ld_y, const float* ws, int64_t B,
                                     int64_t p, int64_t splits) {
  const int64_t total = B * p;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t b = idx / p;
    const int64_t j = idx - b * p;
    float v = y[b * ld_y + j];
    for (int64_t s = 0; s < splits; ++s) v += ws[s * total + idx];
    y[b * ld_y + j] = v;
  }
}

}  // namespace trak_proj
