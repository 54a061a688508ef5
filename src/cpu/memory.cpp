#include "cpu/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace flashattn::cpu {
namespace {

// The first integer in a file, or -1 (missing, unreadable, or "max").
int64_t read_integer(const std::string& path) {
  std::ifstream in(path);
  long long value = -1;
  if (!(in >> value)) return -1;
  return static_cast<int64_t>(value);
}

// A "key value" line's value in a file such as /proc/meminfo or memory.stat, or -1.
int64_t read_keyed(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string k;
    long long v = -1;
    if (words >> k >> v && k == key) return static_cast<int64_t>(v);
  }
  return -1;
}

// What the cgroup at root + rel and each of its ancestors up to root (their limits apply too) still
// let this process charge: limit − (usage − inactive file cache, which the kernel reclaims before
// it kills). INT64_MAX where no level has a limit.
int64_t cgroup_headroom(const std::string& root, std::string rel, const char* limit_file, const char* usage_file,
                        const char* inactive_key) {
  int64_t headroom = std::numeric_limits<int64_t>::max();
  while (true) {
    const std::string dir = root + rel;
    const int64_t limit = read_integer(dir + "/" + limit_file), usage = read_integer(dir + "/" + usage_file);
    if (limit >= 0 && usage >= 0) {
      const int64_t inactive = std::max<int64_t>(0, read_keyed(dir + "/memory.stat", inactive_key));
      headroom = std::min(headroom, std::max<int64_t>(0, limit - std::max<int64_t>(0, usage - inactive)));
    }
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.find_last_of('/');
    rel = slash == std::string::npos || slash == 0 ? std::string() : rel.substr(0, slash);
  }
  return headroom;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t avail = std::numeric_limits<int64_t>::max();
  const int64_t mem_kib = read_keyed("/proc/meminfo", "MemAvailable:");
  const long free_pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (mem_kib >= 0) {
    avail = mem_kib * 1024;
  } else if (free_pages > 0 && page > 0) {  // no MemAvailable (other systems, old kernels)
    avail = static_cast<int64_t>(free_pages) * page;
  }
  // This process's own cgroup (v2 "0::/path", v1 "N:...memory...:/path"), not just the root's: a
  // limit set by systemd-run, a child cgroup or a container without a cgroup namespace is there.
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      avail = std::min(avail, cgroup_headroom("/sys/fs/cgroup", path, "memory.max", "memory.current", "inactive_file"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      avail = std::min(avail, cgroup_headroom("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                              "memory.usage_in_bytes", "total_inactive_file"));
    }
  }
  // An address-space limit (ulimit -v / prlimit --as) makes allocations past it fail outright.
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const int64_t pages = read_integer("/proc/self/statm");  // first field: the virtual size in pages
    if (pages >= 0) {
      const int64_t used = pages * static_cast<int64_t>(page);
      avail = std::min(avail, std::max<int64_t>(0, static_cast<int64_t>(as.rlim_cur) - used));
    }
  }
  return avail;
}

}  // namespace flashattn::cpu
