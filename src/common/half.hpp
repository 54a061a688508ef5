// Scalar fp16/bf16/e4m3 <-> float32 conversions for host code (CPU backend, reference, file I/O,
// tests). Round-to-nearest-even, NaN preserved; the vectorized CPU paths use their own SIMD converts.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashattn::detail {

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Portable bit-level IEEE binary16 conversions (clang 14 lacks _Float16 on x86-64).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;         // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {                              // normal half
    const uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u) - (112u << 23);
    return sign | static_cast<uint16_t>(r >> 13);
  }
  if (abs < 0x33000000u) return sign;                    // below half the smallest subnormal
  // subnormal half: shift the full mantissa, round to nearest even
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;                       // 14 + (112 - e) + 1 - 1
  const uint32_t half_ulp = 1u << (shift - 1);
  uint32_t v = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  if (rem > half_ulp || (rem == half_ulp && (v & 1u))) ++v;
  return sign | static_cast<uint16_t>(v);
}

// OCP float8 e4m3fn (DType::e4m3, PyTorch's float8_e4m3fn): sign, 4 exponent bits (bias 7), 3
// mantissa bits; exponent field 0 holds the subnormals m · 2^-9; 0x7F / 0xFF are NaN; no infinities.
inline float e4m3_to_float_slow(uint8_t x) {
  const float sign = (x & 0x80u) ? -1.0f : 1.0f;
  const int exp = (x >> 3) & 0xf, mant = x & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);
}
// A table of the 256 values: the float64 reference reads every element many times.
inline float e4m3_to_float(uint8_t x) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = e4m3_to_float_slow(static_cast<uint8_t>(i));
    return t;
  }();
  return table[x];
}

// Round to nearest even, saturating to ±448 (the largest finite e4m3, as CUDA's __NV_SATFINITE
// conversion does; PyTorch's .to(float8_e4m3fn) would give NaN past 464); NaN -> 0x7F.
inline uint8_t float_to_e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  if (std::isnan(f)) return 0x7fu;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 448.0) return sign | 0x7eu;
  if (a < 0.015625) {  // below 2^-6, the smallest normal: multiples of 2^-9 (8 of them reach 2^-6 = code 8)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  int e2 = 0;
  std::frexp(a, &e2);                       // a = frac · 2^e2, frac in [0.5, 1): exponent e2 − 1
  const double steps = std::nearbyint(std::ldexp(a, 4 - e2));  // 1.mmm in units of 2^-3: 8..16
  int exp = e2 - 1 + 7;
  int mant = static_cast<int>(steps) - 8;
  if (mant == 8) ++exp, mant = 0;           // rounded up to the next power of two
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

}  // namespace flashattn::detail
