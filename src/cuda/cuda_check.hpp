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
#include <utility>

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

// A value of the current device computed once per device (compute(device)), for attributes that do
// not change while the process runs.
template <typename T>
class PerDevice {
 public:
  template <typename F>
  T get(F&& compute) {
    int device = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = values_.find(device);
    if (it != values_.end()) return it->second;
    return values_[device] = compute(device);
  }

 private:
  std::mutex mu_;
  std::map<int, T> values_;
};

inline int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, device));
  return v;
}

// The current device's multiprocessor count (persistent grids are sized by it).
inline int multiprocessor_count() {
  static PerDevice<int> counts;
  return counts.get([](int device) { return device_attribute(cudaDevAttrMultiProcessorCount, device); });
}

// Whether kernels may be launched with programmatic dependent launch on the current device: compute
// capability 9.0 or later, unless FLASHATTN_CUDA_PDL=0 (read at every call, so that a benchmark can
// time both in one process). A kernel launched with it must call griddep_wait() (kernel_utils.cuh)
// before touching what the grid ahead of it reads or writes.
inline bool pdl_available() {
  if (env_is("FLASHATTN_CUDA_PDL", "0")) return false;
  static PerDevice<bool> ok;
  return ok.get([](int device) { return device_attribute(cudaDevAttrComputeCapabilityMajor, device) >= 9; });
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic stream-serialization
// attribute when `pdl` (see pdl_available()); launch errors become flashattn::Error.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  FA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// This thread's stream-capture mode relaxed for the scope's lifetime (push / pop with
// cudaThreadExchangeStreamCaptureMode), around the calls CUDA counts as unsafe while any capture
// runs in global mode (PyTorch's torch.cuda.graph): cudaMalloc, a copy to pageable host memory and
// its synchronize, and stream-ordered allocations on a stream other than the captured one. Such a
// call fails there, in this thread or another, and invalidates that capture. The library makes
// them only for a stream that is not being captured, except StreamBuffer's, which are recorded
// as graph memory nodes on a captured stream in every mode: relaxing hides no capture error.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
    if (!ok_) (void)cudaGetLastError();  // (the wrapped call then runs in the thread's own mode)
  }
  ~RelaxedCaptureMode() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

// Working memory taken with cudaMallocAsync on a stream: freed on the stream on every exit path
// (errors included). Both calls run in a relaxed capture mode: stream-ordered on this stream, they
// are captured with it when it is being captured, and CUDA would otherwise refuse them (and
// invalidate the capture) while another stream is captured in global mode (RelaxedCaptureMode).
struct StreamBuffer {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  StreamBuffer() = default;
  StreamBuffer(const StreamBuffer&) = delete;  // one owner frees it
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  // CUDA's error, ptr left null and the thread's last error cleared, on failure.
  cudaError_t allocate(size_t bytes, cudaStream_t on) {
    const RelaxedCaptureMode relaxed;
    stream = on;
    const cudaError_t err = cudaMallocAsync(&ptr, bytes, on);
    if (err != cudaSuccess) {
      ptr = nullptr;
      (void)cudaGetLastError();  // not sticky: later launches must not report it
    }
    return err;
  }
  ~StreamBuffer() {
    if (ptr == nullptr) return;
    const RelaxedCaptureMode relaxed;
    if (cudaFreeAsync(ptr, stream) != cudaSuccess) (void)cudaGetLastError();  // not the next launch's error
  }
};

}  // namespace flashattn::cuda
