// How much memory the CPU backward may plan for. Linux overcommits: an allocation past what the
// machine (or the process's cgroup) can back is not refused with std::bad_alloc but ends, once the
// pages are touched, in the OOM killer. So the backward sizes its per-thread dQ buffers against
// what is available before allocating, and raises an Error when even the smallest plan cannot fit.
#pragma once

#include <cstdint>

namespace flashattn::cpu {

// Bytes this process can still get: /proc/meminfo's MemAvailable (else the free physical pages),
// lowered to what the process's own cgroup and each of its ancestors still allow where they set a
// limit (limit minus usage, inactive file cache not counted as used: v2 memory.max /
// memory.current, v1 memory.limit_in_bytes / memory.usage_in_bytes), and to the address-space
// limit (RLIMIT_AS) minus the current virtual size; INT64_MAX when none of them can be read. The
// backward's dQ plan and the CLI's output-size check (tools/commands/common.cpp) both ask it.
int64_t available_memory_bytes();

// Threads and dQ lists for the backward (results depend on `lists`: each list's dQ partial sum is
// added in list order). The preferred plan is 2 lists per thread (load balance); when bytes(lists)
// exceeds budget it falls back to 1 list per thread, then halves the threads, down to 1 and 1.
struct ListPlan {
  int threads, lists;
};
inline ListPlan preferred_dq_lists(int threads) { return {threads, threads == 1 ? 1 : 2 * threads}; }
template <typename Bytes>
ListPlan fit_dq_lists(int threads, int64_t budget, Bytes&& bytes) {
  ListPlan plan = preferred_dq_lists(threads);
  while (plan.lists > 1 && bytes(plan.lists) > budget) {
    if (plan.lists > plan.threads) {
      plan.lists = plan.threads;
    } else {
      plan.threads = plan.threads / 2 > 0 ? plan.threads / 2 : 1;
      plan.lists = plan.threads;
    }
  }
  return plan;
}

}  // namespace flashattn::cpu
