#include "cpu/memory.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>

namespace flashattn::cpu {
namespace {

// The first integer in a file, or -1 (missing, unreadable, or "max").
int64_t read_integer(const char* path) {
  std::ifstream in(path);
  long long value = -1;
  if (!(in >> value)) return -1;
  return static_cast<int64_t>(value);
}

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return static_cast<int64_t>(kib) * 1024;
  return -1;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t avail = std::numeric_limits<int64_t>::max();
  const int64_t mem = mem_available_bytes();
  if (mem >= 0) avail = mem;
  // cgroup v2, then v1 (a v1 "no limit" reads as a huge number, harmless here).
  const int64_t limits[2][2] = {{read_integer("/sys/fs/cgroup/memory.max"), read_integer("/sys/fs/cgroup/memory.current")},
                                {read_integer("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                                 read_integer("/sys/fs/cgroup/memory/memory.usage_in_bytes")}};
  for (const auto& l : limits)
    if (l[0] >= 0 && l[1] >= 0) avail = std::min(avail, std::max<int64_t>(0, l[0] - l[1]));
  return avail;
}

}  // namespace flashattn::cpu
