// CUDA runtime errors -> flashattn::Error carrying CUDA's own message and the failing call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw CudaError(std::string("cuda: ") + what + " failed: " + cudaGetErrorName(err) + ": " +
              cudaGetErrorString(err) + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace flashattn::cuda

// Evaluates a cudaError_t expression once and throws flashattn::Error unless it is cudaSuccess.
#define FA_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    const cudaError_t fa_cuda_err_ = (expr);                                             \
    if (fa_cuda_err_ != cudaSuccess)                                                     \
      ::flashattn::cuda::throw_cuda_error(fa_cuda_err_, #expr, __FILE__, __LINE__);      \
  } while (0)

namespace flashattn::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the current device, once per
// (kernel, device, bytes): the attribute stays set for the device's context, and setting it again
// on every call cost ~5 us of host time per launch (bench/gpu/host_overhead.py). After a
// cudaDeviceReset the launch fails with CUDA's "invalid argument" (reported as a library error).
inline void set_max_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device, bytes}) != 0) return;
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({kernel, device, bytes});
}

// Whether environment variable `name` is set to exactly `value` (the testing switches:
// FLASHATTN_CUDA_FWD / _BWD=sm80).
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// The count in environment variable `name` (at least 1), or 0 when it is unset (the testing caps
// FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS and its backward twin).
inline int64_t env_count(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::max<int64_t>(1, std::atoll(v)) : int64_t(0);
}

// The current device's multiprocessor count, read once per device (persistent grids are sized by it).
inline int multiprocessor_count() {
  static std::mutex mu;
  static std::map<int, int> counts;
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = counts.find(device);
  if (it != counts.end()) return it->second;
  int n = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  counts[device] = n;
  return n;
}

// Working memory taken with cudaMallocAsync on a stream: freed on the stream on every exit path
// (errors included).
struct StreamBuffer {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  ~StreamBuffer() {
    if (ptr != nullptr) cudaFreeAsync(ptr, stream);
  }
};

}  // namespace flashattn::cuda
