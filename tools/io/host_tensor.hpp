// Host tensors as the CLI reads and writes them: a dtype, a shape and the raw little-endian bytes,
// row-major. The readers take (bytes, size) so that the fuzz targets can drive them directly;
// every malformed input becomes a flashattn::Error with a one-line message, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
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

// numel * elem_size for `shape`, or throws Error("<what>: shape ... has more elements than int64 can
// index (its byte size overflows)") when the byte count of its non-zero dimensions does not fit in
// 2^62 (shapes come from untrusted headers; an empty tensor's strides still multiply its dimensions).
uint64_t checked_byte_size(const std::vector<int64_t>& shape, std::size_t elem_size, const std::string& what);

std::string shape_string(const std::vector<int64_t>& shape);  // "[2, 128, 16, 64]"

// Elements of a float tensor (f32, f16, bf16; 0 for others) that are NaN or ±inf.
int64_t count_non_finite(const HostTensor& t);

// Whole-file reads and writes. write_file writes to a temporary file next to `path` and renames
// it, so a failed write never leaves a half-written output under the final name.
// The whole file. Error when it cannot be opened or read, or when more than max_bytes would come
// from it (a regular file by its size, before reading; anything else, a pipe or /dev/zero, once
// that much has been read), naming the path.
std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

// Several output files written all or nothing: add() writes each file's bytes to a new temporary
// file in the target's directory ("<path>.tmp.XXXXXX", created exclusively so that no existing
// file is touched); commit() renames them all into place once every write has succeeded. The
// temporaries not committed (an add() failed, or an exception skipped commit()) are removed.
// Throws Error("cannot write '<path>': <reason>").
class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles();
  void add(const std::string& path, const std::vector<uint8_t>& bytes);
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> pending_;  // (temporary, final path)
};

// Throws Error("cannot write '<path>': ...") unless `path` can be created or replaced: its
// directory exists and is writable, and `path` is not a directory. Checked before any work so that
// a typo in an output path fails at once (the final write can still fail, e.g. on a full disk).
void check_writable(const std::string& path);

// True when `path` ends in ".safetensors" (else it is taken as .npy).
bool is_safetensors_path(const std::string& path);

}  // namespace flashattn::io
