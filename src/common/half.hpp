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

// GCC and clang on x86-64 provide _Float16 with correct IEEE rounding (F16C when available).
inline float fp16_to_float(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}

inline uint16_t float_to_fp16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

}  // namespace flashattn::detail
