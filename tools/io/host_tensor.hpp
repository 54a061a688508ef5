// Host tensors as the CLI reads and writes them: a dtype, a shape and the raw little-endian bytes,
// row-major. The readers take (bytes, size) so that the fuzz targets can drive them directly;
// every malformed input becomes a flashattn::Error with a one-line message, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace flashattn::io {

struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel * element size bytes

  int64_t numel() const;
  TensorView view();  // contiguous CPU view; at most 4 dimensions (throws otherwise)
};

// Element size in bytes of a DType (the io library does not link libflashattn).
std::size_t element_size(DType dtype);
const char* dtype_label(DType dtype);  // "f32", "f16", "bf16", "i32"

// numel * elem_size for `shape`, or throws Error("<what>: shape ... overflows") when the byte
// count does not fit in 2^62 (shapes come from untrusted headers).
uint64_t checked_byte_size(const std::vector<int64_t>& shape, std::size_t elem_size, const std::string& what);

std::string shape_string(const std::vector<int64_t>& shape);  // "[2, 128, 16, 64]"

// Whole-file reads and writes. write_file writes to "<path>.tmp" and renames, so a failed write
// never leaves a half-written output under the final name.
std::vector<uint8_t> read_file(const std::string& path);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

// True when `path` ends in ".safetensors" (else it is taken as .npy).
bool is_safetensors_path(const std::string& path);

}  // namespace flashattn::io
