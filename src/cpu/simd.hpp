// Vectorized row operations of the CPU backend that are not matrix products: exp2 over a score
// row (the hot non-GEMM op), row max, and fp16/bf16 <-> fp32 row conversions. AVX-512 paths
// when the compiler targets it (FLASHATTN_NATIVE on this machine), portable scalar loops otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/half.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::cpu::simd {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp2 of arguments below 2^-126 (FLT_MIN) returns exactly 0: no denormal ever enters the P·V
// product (denormal operands take a microcode assist on x86, ~100x slower), and masked scores
// (-inf) give exactly 0.
inline constexpr float kExp2Min = -126.0f;

// Taylor coefficients of 2^r = e^(r ln2): ln2^k / k!. On |r| <= 1/2 the degree-7 truncation error
// is below 6e-9, i.e. under one fp32 ulp.
inline constexpr float kExp2C[8] = {1.0f,
                                    0.693147180559945f,
                                    0.240226506959101f,
                                    0.0555041086648216f,
                                    0.00961812910762848f,
                                    0.00133335581464284f,
                                    0.000154035303933816f,
                                    1.52527338040598e-05f};

inline float exp2_scalar(float x) { return x >= kExp2Min ? std::exp2(x) : 0.0f; }

#if defined(__AVX512F__)
inline __m512 exp2_ps(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExp2Min), _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(128.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(kExp2C[7]);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[6]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[5]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[4]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[3]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[2]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[1]));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[0]));
  return _mm512_maskz_scalef_ps(keep, y, n);  // y * 2^n, 0 where x < kExp2Min or NaN
}

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
#endif

// max_j s[j] (-inf for n == 0).
inline float row_max(const float* s, int64_t n) {
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(kNegInf);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
  if (j < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), tail_mask(n - j), s + j));
  return _mm512_reduce_max_ps(m);
#else
  float m = kNegInf;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  return m;
#endif
}

// s[j] <- exp2(s[j] - shift) in place; returns the sum of the new values. shift must be finite.
inline float exp2_shift_sum(float* s, int64_t n, float shift) {
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vs));
    _mm512_storeu_ps(s + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (j < n) {
    const __mmask16 k = tail_mask(n - j);
    const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vs));
    _mm512_mask_storeu_ps(s + j, k, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
  }
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp2_scalar(s[j] - shift);
    acc += s[j];
  }
  return acc;
#endif
}

// s[j] <- exp2(s[j] - shift) in place, no sum (backward recompute of P).
inline void exp2_shift(float* s, int64_t n, float shift) {
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(shift);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(s + j, exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vs)));
  if (j < n) {
    const __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(s + j, k, exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vs)));
  }
#else
  for (int64_t j = 0; j < n; ++j) s[j] = exp2_scalar(s[j] - shift);
#endif
}

// dst[j] = mult * float(src[j]) for a row of n elements of dtype dt.
inline void load_row(DType dt, const void* src, float* dst, int64_t n, float mult) {
  if (dt == DType::f32) {
    const float* s = static_cast<const float*>(src);
    if (mult == 1.0f) {
      std::copy(s, s + n, dst);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) dst[j] = s[j] * mult;
    }
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(mult);
  for (; j + 16 <= n; j += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + j));
    const __m512 f = dt == DType::f16 ? _mm512_cvtph_ps(h)
                                      : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_storeu_ps(dst + j, _mm512_mul_ps(f, vm));
  }
#endif
  if (dt == DType::f16) {
    for (; j < n; ++j) dst[j] = detail::fp16_to_float(s[j]) * mult;
  } else {
    for (; j < n; ++j) dst[j] = detail::bf16_to_float(s[j]) * mult;
  }
}

// dst[j] = dtype(mult * src[j]), round to nearest even.
inline void store_row(DType dt, const float* src, void* dst, int64_t n, float mult) {
  if (dt == DType::f32) {
    float* d = static_cast<float*>(dst);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) d[j] = src[j] * mult;
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(mult);
  for (; j + 16 <= n; j += 16) {
    const __m512 f = _mm512_mul_ps(_mm512_loadu_ps(src + j), vm);
    __m256i h;
    if (dt == DType::f16) {
      h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      // bf16 round to nearest even: bits + 0x7fff + lsb, quiet NaN kept as NaN.
      const __m512i bits = _mm512_castps_si512(f);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
      const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
      r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
      h = _mm512_cvtepi32_epi16(r);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + j), h);
  }
#endif
  if (dt == DType::f16) {
    for (; j < n; ++j) d[j] = detail::float_to_fp16(src[j] * mult);
  } else {
    for (; j < n; ++j) d[j] = detail::float_to_bf16(src[j] * mult);
  }
}

}  // namespace flashattn::cpu::simd
