// libFuzzer target for SafetensorsFile: any input either parses or throws flashattn::Error, every
// entry either loads or throws Error, and every loaded tensor survives a write/read round trip.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashattn::io;
  std::unique_ptr<SafetensorsFile> file;
  try {
    file = std::make_unique<SafetensorsFile>(data, size);
  } catch (const flashattn::Error&) {
    return 0;
  }
  for (const auto& [name, entry] : file->entries()) {
    HostTensor t;
    try {
      t = file->get(name);
    } catch (const flashattn::Error&) {
      continue;
    }
    // Outside the try: a valid tensor must always serialize and read back unchanged.
    const std::vector<uint8_t> bytes = write_safetensors({{name, &t}});
    const SafetensorsFile again(bytes.data(), bytes.size());
    const HostTensor r = again.get(name);
    if (r.dtype != t.dtype || r.shape != t.shape || r.data != t.data) __builtin_trap();
  }
  return 0;
}
