// libFuzzer target for read_npy: any input either parses or throws flashattn::Error (anything else,
// a crash or a sanitizer report is a bug), and whatever parses survives a write/read round trip.
#include <cstddef>
#include <cstdint>

#include "io/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashattn::io;
  HostTensor t;
  try {
    t = read_npy(data, size);
  } catch (const flashattn::Error&) {
    return 0;
  }
  const std::vector<uint8_t> bytes = write_npy(t);
  const HostTensor r = read_npy(bytes.data(), bytes.size());
  if (r.dtype != t.dtype || r.shape != t.shape || r.data != t.data) __builtin_trap();
  return 0;
}
