// The hash that defines P (docs/projection.md) and the bit tricks the kernel builds on it.
//
// Everything here is __host__ __device__ and pure integer code, so the host test hooks in
// trak_proj.cu run exactly what the kernel runs and a CPU-only machine can check it bit for bit.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define TP_HD __host__ __device__ __forceinline__
#else
#define TP_HD inline
#endif

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace trak_proj {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

// Columns of one row whose signs one Philox call yields.
constexpr int kColsPerHash = 128;

// Bit patterns of 1.0 in both halves of a packed pair; -1.0 differs only in the sign bits.
constexpr uint32_t kOnePairBf16 = 0x3F803F80u;
constexpr uint32_t kOnePairF16 = 0x3C003C00u;

struct U32x4 {
  uint32_t x, y, z, w;
};

// The ten round keys, computed once on the host: the kernel reads them from the parameter bank
// instead of re-deriving them in every hash.
struct PhiloxKeys {
  uint32_t k0[kPhiloxRounds];
  uint32_t k1[kPhiloxRounds];
};

TP_HD PhiloxKeys philox_round_keys(uint64_t seed) {
  PhiloxKeys keys;
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    keys.k0[r] = k0;
    keys.k1[r] = k1;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return keys;
}

TP_HD U32x4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                          const PhiloxKeys& keys) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ keys.k0[r];
    c1 = lo1;
    c2 = hi0 ^ c3 ^ keys.k1[r];
    c3 = lo0;
  }
  return U32x4{c0, c1, c2, c3};
}

// Sign bits of P[row, 128·col_block … 128·col_block + 127]: word w holds columns 32w … 32w+31,
// least significant bit first; a set bit means −1.
TP_HD U32x4 rademacher_words(const PhiloxKeys& keys, uint32_t model_id, uint64_t row,
                             uint32_t col_block) {
  return philox4x32_10(static_cast<uint32_t>(row), static_cast<uint32_t>(row >> 32), col_block,
                       model_id, keys);
}

TP_HD uint32_t word_at(const U32x4& w, int i) {
  return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

// Eight signs (the bits of `byte`, least significant first) as four packed 16-bit ±1 pairs.
// Pair q holds bit 2q in its low half and bit 2q+1 in its high half, i.e. the element order in
// memory; only the sign bits (15 and 31) are taken from the hash, the rest is `one_pair`.
TP_HD void expand_byte(uint32_t byte, uint32_t one_pair, uint32_t out[4]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < 4; ++q) {
    out[q] = ((byte << (15 - 2 * q)) & 0x00008000u) | ((byte << (30 - 2 * q)) & 0x80000000u) |
             one_pair;
  }
}

// Columns 8c … 8c+7 (c < 16) of a 128-column hash block as four packed ±1 pairs: the unit of
// work of the kernel's shared-memory expansion (one 16-byte store).
TP_HD void expand_chunk(const U32x4& words, int c, uint32_t one_pair, uint32_t out[4]) {
  expand_byte((word_at(words, c >> 2) >> (8 * (c & 3))) & 0xFFu, one_pair, out);
}

// ---- fp32 → bf16 terms -------------------------------------------------------------------

TP_HD float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Round to nearest even, as cvt.rn.bf16.f32 does (NaN stays NaN).
TP_HD uint16_t float_to_bf16_bits_rn(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
#endif
}

// x = t[0] + … + t[kTerms-1] + residual. Each difference x − Σ is exact in fp32 (it is what is
// left below the previous term's rounding), and each rounding to bf16's 8 significant bits loses
// at most 2^-8 of what is left, so |residual| ≤ 2^(-8·kTerms) · |x|: 2^-16 for two terms, 2^-24
// (fp32's own input rounding) for three.
template <int kTerms>
TP_HD void split_f32(float x, uint16_t t[kTerms]) {
  float rest = x;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kTerms; ++i) {
    t[i] = float_to_bf16_bits_rn(rest);
    rest = rest - bf16_bits_to_float(t[i]);
  }
}

}  // namespace trak_proj
