// DType helpers and TensorView construction (flashattn.hpp).
#include <cstdint>
#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn {

const char* dtype_name(DType dtype) {
  // The names used in every message ("q: expected dtype bf16 (same as k), got fp16").
  switch (dtype) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::i32: return "int32";
    case DType::e4m3: return "e4m3";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::e4m3: return 1;
  }
  return 0;  // an out-of-range enum value (e.g. from the C API); validate() rejects it by name
}

int64_t TensorView::numel() const {
  if (ndim <= 0) return 0;
  int64_t n = 1;
  for (int32_t d = 0; d < ndim && d < 4; ++d) {
    // Saturates instead of overflowing (undefined behaviour): validate() refuses such shapes by
    // name, and callers may ask before it ran.
    if (__builtin_mul_overflow(n, shape[d], &n)) return INT64_MAX;
  }
  return n;
}

TensorView make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
                       int32_t device_index) {
  if (shape.size() < 1 || shape.size() > 4) {
    throw Error("make_tensor: expected 1 to 4 dimensions, got " + std::to_string(shape.size()));
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = static_cast<int32_t>(shape.size());
  int32_t d = 0;
  for (int64_t s : shape) {
    if (s < 0) throw Error("make_tensor: expected shape[" + std::to_string(d) + "] >= 0, got " + std::to_string(s));
    t.shape[d++] = s;
  }
  int64_t stride = 1;
  for (int32_t i = t.ndim - 1; i >= 0; --i) {
    t.stride[i] = stride;
    if (i > 0 && __builtin_mul_overflow(stride, t.shape[i] > 0 ? t.shape[i] : 1, &stride)) {
      std::string dims;
      for (int64_t s : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(s);
      throw Error("make_tensor: expected a shape whose contiguous strides fit in int64, got [" + dims + "]");
    }
  }
  return t;
}

}  // namespace flashattn
