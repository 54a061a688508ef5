// The CPU backend's vector layer: a 16-lane fp32 vector V16 (one AVX-512 register when the
// compiler targets AVX-512, as FLASHATTN_NATIVE does on this machine; a GCC/Clang generic vector
// otherwise, which the compiler lowers to AVX2/SSE), exp2 (the hot non-GEMM op), and fp16/bf16
// <-> fp32 row conversions. Every tile layout of the backend pads its vector dimension to a
// multiple of 16, so no operation here needs a tail mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/half.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::cpu::simd {

inline constexpr int kLanes = 16;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kPosInf = std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// exp2 of arguments below -126 returns exactly 0: no denormal ever enters a product (denormal
// operands take a microcode assist on x86, ~100x slower), and exp2(-inf) = 0 for masked scores.
// NaN stays NaN: a NaN score (NaN in q or k, or an inf - inf from overflowing scores) must reach
// the row's out and lse instead of vanishing like a masked key. Callers keep -inf - -inf out of
// it (the forward's row max of an empty row is replaced by 0 before subtracting).
inline constexpr float kExp2Min = -126.0f;

// Taylor coefficients of 2^r = e^(r ln2), ln2^k / k!. On |r| <= 1/2 the degree-7 truncation error
// is below 6e-9 relative, under one fp32 ulp.
inline constexpr float kExp2C[8] = {1.0f,
                                    0.693147180559945f,
                                    0.240226506959101f,
                                    0.0555041086648216f,
                                    0.00961812910762848f,
                                    0.00133335581464284f,
                                    0.000154035303933816f,
                                    1.52527338040598e-05f};

#if defined(__AVX512F__)
using V16 = __m512;
inline V16 load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V16 x) { _mm512_storeu_ps(p, x); }
inline V16 bcast(float s) { return _mm512_set1_ps(s); }
inline V16 zero() { return _mm512_setzero_ps(); }
inline V16 fmadd(V16 a, V16 b, V16 c) { return _mm512_fmadd_ps(a, b, c); }
inline V16 add(V16 a, V16 b) { return _mm512_add_ps(a, b); }
inline V16 sub(V16 a, V16 b) { return _mm512_sub_ps(a, b); }
inline V16 mul(V16 a, V16 b) { return _mm512_mul_ps(a, b); }
// max and min return b where either operand is NaN (the x86 MAXPS/MINPS rule); the portable
// versions below follow it, so a NaN passes through exactly when it is the second operand.
inline V16 max(V16 a, V16 b) { return _mm512_max_ps(a, b); }
inline V16 min(V16 a, V16 b) { return _mm512_min_ps(a, b); }
// Lanes equal to -inf replaced by r.
inline V16 replace_neg_inf(V16 x, V16 r) {
  return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ), r);
}

inline V16 exp2(V16 x) {
  // keep: x >= kExp2Min or NaN (not-less-than, unordered true).
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExp2Min), _CMP_NLT_UQ);
  x = _mm512_min_ps(_mm512_set1_ps(128.0f), x);  // NaN is the second operand: it stays NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(kExp2C[7]);
  for (int c = 6; c >= 0; --c) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExp2C[c]));
  return _mm512_maskz_scalef_ps(keep, y, n);  // y * 2^n, 0 where x < kExp2Min
}
#else
// 64-byte vectors without AVX-512 are passed in memory; all these functions are inlined, so the
// ABI note GCC and Clang print (-Wpsabi) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float V16 __attribute__((vector_size(64)));
inline V16 load(const float* p) { V16 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, V16 x) { std::memcpy(p, &x, sizeof x); }
// (V16{} + s turns -0 into +0, harmless here. In the AVX2 clone it compiles to 16 scalar stores,
// but the form in braces, one vbroadcastss there, made the AVX-512 clone 8x slower: perf-notes,
// CPU section, session 31.)
inline V16 bcast(float s) { return V16{} + s; }
inline V16 zero() { return V16{}; }
inline V16 fmadd(V16 a, V16 b, V16 c) { return a * b + c; }
inline V16 add(V16 a, V16 b) { return a + b; }
inline V16 sub(V16 a, V16 b) { return a - b; }
inline V16 mul(V16 a, V16 b) { return a * b; }
// (Whole-vector operations, so that each target the hot functions are cloned for (FLASHATTN_CPU_CLONES)
// compiles them to its own vector instructions; a per-lane loop stayed scalar.)
typedef int32_t I16 __attribute__((vector_size(64)));
inline V16 max(V16 a, V16 b) { return a > b ? a : b; }
inline V16 min(V16 a, V16 b) { return a < b ? a : b; }
inline V16 replace_neg_inf(V16 x, V16 r) { return x == bcast(kNegInf) ? r : x; }
// The AVX-512 version's arithmetic: the same polynomial, n rounded to nearest even by adding and
// subtracting 1.5 · 2^23, and y · 2^n as scalef computes it: by two exact power-of-two factors
// 2^⌊n/2⌋ · 2^⌈n/2⌉, both normal for n in [-127, 128] (a single 2^128 would be inf, and x in
// (127.5, 128) has a finite result); the product overflows to inf from x = 128 on.
inline V16 exp2(V16 x) {
  const I16 keep = ~(x < bcast(kExp2Min));        // x >= kExp2Min or NaN
  x = x > bcast(128.0f) ? bcast(128.0f) : x;       // NaN fails both compares and stays NaN
  x = x < bcast(-127.0f) ? bcast(-127.0f) : x;     // (those lanes are zeroed; n stays an int32)
  const V16 n = (x + 12582912.0f) - 12582912.0f;
  const V16 r = x - n;
  V16 y = bcast(kExp2C[7]);
  for (int c = 6; c >= 0; --c) y = y * r + kExp2C[c];
  // (NaN lanes convert 0: a NaN float to int conversion is undefined; y carries the NaN.)
  const I16 ni = __builtin_convertvector(n == n ? n : zero(), I16), lo = ni >> 1;
  const I16 bits_lo = (lo + 127) << 23, bits_hi = (ni - lo + 127) << 23;
  V16 p_lo, p_hi;
  std::memcpy(&p_lo, &bits_lo, sizeof p_lo);
  std::memcpy(&p_hi, &bits_hi, sizeof p_hi);
  return keep ? (y * p_lo) * p_hi : zero();
}
#endif

// Hot per-item functions of a portable build (FLASHATTN_NATIVE=OFF, so not compiled for AVX-512)
// are cloned for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2 + FMA) next to the baseline and picked
// at load time by the CPU (GCC's target_clones); flatten inlines the products and the softmax
// into each clone. A portable build ran the forward at 2-5 GFLOP/s on this AVX-512 machine (the
// 16-accumulator product on SSE registers), the native one at ~200. Clang (no target_clones
// with flatten), GCC before 12 (no arch=x86-64-vN there), native builds and unoptimized ones
// compile one version: at -O0 flatten inlines nothing, and the AVX-512 clone then called the
// baseline-compiled V16 helpers, which take and return 64-byte vectors in memory where the clone
// passes them in zmm registers (a review found the backward crashing there; -Wpsabi, silenced
// above, is the warning for it).
// FLASHATTN_CPU_NO_CLONES (testing: CI builds the CPU tests for x86-64-v3 with it) compiles one
// version for the -march given, so that a machine with AVX-512 runs the AVX2 code too.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && !defined(__AVX512F__) && \
    defined(__OPTIMIZE__) && !defined(FLASHATTN_CPU_NO_CLONES)
#define FLASHATTN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#define FLASHATTN_CPU_CLONED 1  // (avx2::use() below)
#else
#define FLASHATTN_CPU_CLONES
#endif

// AVX2 + FMA versions of the hot loops for CPUs without AVX-512, in intrinsics under a target
// attribute (gemm_kernel.hpp's products, the softmax rows of fwd_cpu_tiled.cpp and
// bwd_cpu_tiled.cpp), chosen at run time by avx2::use(): the generic vector code's clones kept
// their vectors in memory there (GCC: 64-byte and even 32-byte generic vectors of a baseline
// translation unit, inlined into an x86-64-v3 clone; perf-notes, CPU section, session 31), and the
// AVX2 backend ran at 3.5 GFLOP/s on 2 threads.
#if !defined(__AVX512F__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_CPU_AVX2 1
}  // namespace flashattn::cpu::simd
#include <immintrin.h>
namespace flashattn::cpu::simd::avx2 {

#define FLASHATTN_AVX2 __attribute__((target("avx2,fma")))

// The generic exp2 above, 8 lanes: the same clamps, rounding, polynomial and two-factor scaling.
FLASHATTN_AVX2 inline __m256 exp2(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kExp2Min), _CMP_NLT_UQ);  // x >= kExp2Min or NaN
  x = _mm256_min_ps(_mm256_set1_ps(128.0f), x);    // NaN is the second operand: it stays NaN
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);   // (those lanes are zeroed)
  const __m256 big = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(x, big), big);
  const __m256 r = _mm256_sub_ps(x, n);
  __m256 y = _mm256_set1_ps(kExp2C[7]);
  for (int c = 6; c >= 0; --c) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExp2C[c]));
  const __m256 n0 = _mm256_and_ps(n, _mm256_cmp_ps(n, n, _CMP_ORD_Q));  // NaN lanes convert 0
  const __m256i ni = _mm256_cvttps_epi32(n0), lo = _mm256_srai_epi32(ni, 1);
  const __m256i e = _mm256_set1_epi32(127);
  const __m256 p_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(lo, e), 23));
  const __m256 p_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, lo), e), 23));
  return _mm256_and_ps(keep, _mm256_mul_ps(_mm256_mul_ps(y, p_lo), p_hi));
}

// Whether this CPU takes the AVX2 versions: AVX2 and FMA, and, where the per-item functions are
// cloned (FLASHATTN_CPU_CLONED above), no AVX-512, whose clone runs the generic 16-lane code well.
// A build of one version (FLASHATTN_CPU_NO_CLONES, Clang, older GCC, -O0) takes them wherever the
// CPU has AVX2 and FMA.
inline bool use() {
  static const bool yes = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#ifdef FLASHATTN_CPU_CLONED
    return avx2 && !__builtin_cpu_supports("avx512f");
#else
    return avx2;
#endif
  }();
  return yes;
}

}  // namespace flashattn::cpu::simd::avx2
namespace flashattn::cpu::simd {
#endif


// dst[j] = mult * float(src[j]) for a row of n elements of dtype dt.
inline void load_row(DType dt, const void* src, float* dst, int64_t n, float mult) {
  if (dt == DType::f32) {
    const float* s = static_cast<const float*>(src);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = s[j] * mult;
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
      // bf16 round to nearest even: (bits + 0x7fff + lsb) >> 16; NaN stays a quiet NaN.
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
