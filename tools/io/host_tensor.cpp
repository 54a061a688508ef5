#include "io/host_tensor.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

namespace flashattn::io {

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

const char* dtype_label(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

TensorView HostTensor::view() {
  if (shape.empty() || shape.size() > 4) {
    throw Error("tensor: expected 1 to 4 dimensions, got " + std::to_string(shape.size()));
  }
  TensorView t;
  t.data = data.data();
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = stride;
    stride *= shape[d];
  }
  return t;
}

uint64_t checked_byte_size(const std::vector<int64_t>& shape, std::size_t elem_size, const std::string& what) {
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t bytes = elem_size;
  bool zero = false;
  for (int64_t s : shape) {
    if (s < 0) throw Error(what + ": shape " + shape_string(shape) + " has a negative dimension");
    if (s == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t s : shape) {
    const uint64_t u = static_cast<uint64_t>(s);
    if (bytes > kLimit / u) {
      throw Error(what + ": shape " + shape_string(shape) + " is too large (its byte size overflows)");
    }
    bytes *= u;
  }
  return bytes;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) throw Error("cannot read '" + path + "': " + std::strerror(err));
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw Error("cannot write '" + path + "': " + std::strerror(ok ? errno : err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(tmp.c_str());
    throw Error("cannot write '" + path + "': " + std::strerror(rerr));
  }
}

bool is_safetensors_path(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace flashattn::io
