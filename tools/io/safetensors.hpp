// safetensors files (Hugging Face's format): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}} (possibly padded with spaces), then the data buffer; offsets are relative
// to the buffer. Supported element types for reading tensors: F32, F16, BF16, I32; entries of other
// dtypes are validated (offsets; sizes where the dtype is known) and refused only when requested.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/host_tensor.hpp"

namespace flashattn::io {

// Whether bytes start as a safetensors file does: a header length within the 100 MB cap, then the
// JSON header's '{' (a cheap test on a file's first bytes; SafetensorsFile validates the rest).
bool starts_like_safetensors(const uint8_t* bytes, std::size_t size);
// The byte size of the whole .safetensors file that bytes[0, size) begins, from its header: nullopt
// while the header is incomplete, 0 when it is malformed (SafetensorsFile says how).
std::optional<uint64_t> safetensors_file_size(const uint8_t* bytes, std::size_t size);

class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;  // safetensors spelling, e.g. "BF16"
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets in the data buffer
  };

  // Parses and validates the header: its length within the file, valid JSON object, each entry's
  // shape non-negative and not overflowing, offsets in range, sized to the shape (known dtypes) and
  // not overlapping. Throws flashattn::Error.
  SafetensorsFile(const uint8_t* bytes, std::size_t size);

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  // The named tensor; throws when it is missing (listing the names present) or of an unsupported dtype.
  HostTensor get(const std::string& name) const;

 private:
  const uint8_t* data_ = nullptr;  // the data buffer; the caller keeps the file bytes alive
  std::map<std::string, Entry> entries_;
};

// Serializes named tensors (in the given order in the data buffer). Names must be unique and not
// "__metadata__".
std::vector<uint8_t> write_safetensors(const std::vector<std::pair<std::string, const HostTensor*>>& tensors);

}  // namespace flashattn::io
