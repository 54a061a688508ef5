// Scalar fp16/bf16 <-> float32 conversions for host code (CPU backend, reference, file I/O).
// Round-to-nearest-even, NaN preserved; the vectorized CPU paths use their own SIMD converts.
#pragma once

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

}  // namespace flashattn::detail
