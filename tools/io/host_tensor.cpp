#include "io/host_tensor.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <system_error>

#include "io/npy.hpp"
#include "io/safetensors.hpp"

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
  // The readers refuse shapes whose product overflows (checked_byte_size), but a HostTensor can be
  // filled by hand: never let the product wrap around.
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) {
      throw Error("tensor: shape " + shape_string(shape) + " has more elements than int64 can index");
    }
  }
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
  // Strides are products of trailing dimensions, which can overflow even when a zero dimension
  // makes the tensor empty (shape [0, 2^60, 2^60, 8]).
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = stride;
    if (shape[d] < 0 || (d > 0 && __builtin_mul_overflow(stride, shape[d], &stride))) {
      throw Error("tensor: shape " + shape_string(shape) + " has more elements than int64 can index");
    }
  }
  return t;
}

uint64_t checked_byte_size(const std::vector<int64_t>& shape, std::size_t elem_size, const std::string& what) {
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  for (int64_t s : shape) {
    if (s < 0) throw Error(what + ": shape " + shape_string(shape) + " has a negative dimension");
  }
  // The product of the non-zero dimensions is bounded even when a zero dimension makes the tensor
  // empty: strides (products of trailing dimensions) are computed from the shape either way.
  uint64_t bytes = elem_size;
  bool zero = false;
  for (int64_t s : shape) {
    if (s == 0) {
      zero = true;
      continue;
    }
    const uint64_t u = static_cast<uint64_t>(s);
    if (bytes > kLimit / u) {
      throw Error(what + ": shape " + shape_string(shape) +
                  " has more elements than int64 can index (its byte size overflows)");
    }
    bytes *= u;
  }
  return zero ? 0 : bytes;
}

int64_t count_non_finite(const HostTensor& t) {
  // All exponent bits set is NaN or ±inf in each of the three formats.
  auto count = [&](auto word, uint64_t exponent) {
    using Word = decltype(word);
    int64_t n = 0;
    for (std::size_t i = 0; i + sizeof(Word) <= t.data.size(); i += sizeof(Word)) {
      Word w;
      std::memcpy(&w, t.data.data() + i, sizeof(Word));
      n += (uint64_t(w) & exponent) == exponent;
    }
    return n;
  };
  switch (t.dtype) {
    case DType::f32: return count(uint32_t{}, 0x7F800000u);
    case DType::f16: return count(uint16_t{}, 0x7C00u);
    case DType::bf16: return count(uint16_t{}, 0x7F80u);
    default: return 0;
  }
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  auto too_big = [&](const std::string& what) {
    std::fclose(f);
    return Error("cannot read '" + path + "': " + what + " more than the " + std::to_string(max_bytes) +
                 " bytes of memory available");
  };
  std::vector<uint8_t> bytes;
  struct stat st {};
  const bool stream = !(::fstat(::fileno(f), &st) == 0 && S_ISREG(st.st_mode));
  if (!stream) {
    if (static_cast<uint64_t>(st.st_size) > max_bytes) throw too_big("its " + std::to_string(st.st_size) + " bytes are");
    bytes.reserve(static_cast<std::size_t>(st.st_size));
  }
  uint8_t buf[1 << 16];
  std::size_t n;
  std::optional<uint64_t> total;  // a stream's size from its header, once that is complete
  try {
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
      if (bytes.size() + n > max_bytes) throw too_big(stream ? "not a regular file, and it gave" : "it grew to");
      bytes.insert(bytes.end(), buf, buf + n);
      // A stream (a pipe, /dev/zero) that starts as neither format could go on forever: its first
      // chunk (fread returns a whole buffer unless the stream ends) is enough for the parser to say
      // what is wrong with it. One that starts as either is read no further than the chunk that
      // passes the size its header gives (the parser then reports the wrong length), not until
      // memory runs out.
      if (stream) {
        const bool npy = has_npy_magic(bytes.data(), bytes.size());
        if (!npy && !starts_like_safetensors(bytes.data(), bytes.size())) break;
        if (!total) {
          total = npy ? npy_file_size(bytes.data(), bytes.size()) : safetensors_file_size(bytes.data(), bytes.size());
        }
        if (total && bytes.size() > *total) break;
      }
    }
  } catch (const std::bad_alloc&) {
    std::fclose(f);
    throw Error("cannot read '" + path + "': out of memory after " + std::to_string(bytes.size()) + " bytes");
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) throw Error("cannot read '" + path + "': " + std::strerror(err));
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  OutputFiles files;
  files.add(path, bytes);
  files.commit();
}

OutputFiles::~OutputFiles() {
  for (const auto& [tmp, path] : pending_) ::unlink(tmp.c_str());
}

void OutputFiles::add(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  pending_.emplace_back(tmp, path);  // removed by the destructor unless committed
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw Error("cannot write '" + path + "': " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  // mkstemp creates the file 0600; give it the permissions a plain fopen would (0666 & ~umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0 || ::close(fd) != 0) {
    throw Error("cannot write '" + path + "': " + std::strerror(errno));
  }
}

void OutputFiles::commit() {
  while (!pending_.empty()) {
    const auto [tmp, path] = pending_.front();
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error("cannot write '" + path + "': " + std::strerror(errno));
    }
    pending_.erase(pending_.begin());
  }
}

void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) throw Error("cannot write '': empty path");
  if (fs::is_directory(fs::path(path), ec)) throw Error("cannot write '" + path + "': it is a directory");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::exists(dir, ec)) throw Error("cannot write '" + path + "': directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw Error("cannot write '" + path + "': '" + dir.string() + "' is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error("cannot write '" + path + "': directory '" + dir.string() + "': " + std::strerror(errno));
  }
}

bool is_safetensors_path(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace flashattn::io
