// Device-side counterparts of tests/support: a DeviceTensor holds a strided copy of a HostTensor's
// logical elements in GPU memory (its own layout: contiguous, padded or head-major, with strides
// kept at multiples of 8 elements as the CUDA kernels require), every other storage element
// poisoned, and reads back to dense float64. GpuProblem uploads a testing::Problem and builds the
// AttentionParams over the device copies. Every test calls FLASHATTN_REQUIRE_GPU() first, so that a
// machine without a GPU reports each one SKIPPED with the reason.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn_problem.hpp"
#include "flashattn/flashattn.hpp"

#define FLASHATTN_REQUIRE_GPU()                                                                    \
  do {                                                                                             \
    if (!::flashattn::cuda_available())                                                            \
      GTEST_SKIP() << "no CUDA device on this machine (or a CPU-only build): GPU test skipped";    \
  } while (0)

// The FP8 (e4m3) forward is a Hopper kernel (FlashAttention-3): it needs an sm_90 device and a
// build with sm_90a code (FLASHATTN_TEST_CUDA_SM90, tests/cuda/CMakeLists.txt).
#ifdef FLASHATTN_TEST_CUDA_SM90
#define FLASHATTN_REQUIRE_SM90()                                                                   \
  do {                                                                                             \
    FLASHATTN_REQUIRE_GPU();                                                                       \
    const int cc_ = ::flashattn::testing::compute_capability();                                    \
    if (cc_ != 90) GTEST_SKIP() << "the GPU is sm_" << cc_ << ", not sm_90: FP8 test skipped";     \
  } while (0)
#else
#define FLASHATTN_REQUIRE_SM90()                                                                   \
  do {                                                                                             \
    FLASHATTN_REQUIRE_GPU();                                                                       \
    GTEST_SKIP() << "this build has no sm_90a code (FLASHATTN_CUDA_ARCHS): FP8 test skipped";      \
  } while (0)
#endif

#define FLASHATTN_ASSERT_CUDA(expr)                                                                \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                         \
  } while (0)

namespace flashattn::testing {

enum class GpuLayout { contiguous, padded, head_major };

inline const char* gpu_layout_name(GpuLayout l) {
  switch (l) {
    case GpuLayout::contiguous: return "contiguous";
    case GpuLayout::padded: return "padded8";
    case GpuLayout::head_major: return "headmajor8";
  }
  return "?";
}

inline int current_device() {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

// The current device's compute capability as major * 10 + minor (90 for an H100 / H200).
inline int compute_capability() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device());
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, current_device());
  return major * 10 + minor;
}

// Whether this build's Hopper kernels should run on the current device: it is sm_90, the build has
// sm_90a code (FLASHATTN_TEST_CUDA_SM90, tests/cuda/CMakeLists.txt), and `force_env` (the variable
// that forces the sm80 kernels, FLASHATTN_CUDA_FWD or FLASHATTN_CUDA_BWD) is not "sm80".
inline bool expect_sm90_kernels(const char* force_env) {
#ifdef FLASHATTN_TEST_CUDA_SM90
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device());
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, current_device());
  const char* force = std::getenv(force_env);
  return major * 10 + minor == 90 && !(force != nullptr && std::string(force) == "sm80");
#else
  (void)force_env;
  return false;
#endif
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

class DeviceTensor {
 public:
  DeviceTensor() = default;

  // Poisoned storage for `shape` in `layout`: padding of 8 elements after every row of every
  // non-last dimension (padded), plus dims r-3 and r-2 swapped in memory (head_major).
  DeviceTensor(DType dtype, std::vector<int64_t> shape, GpuLayout layout = GpuLayout::contiguous)
      : dtype_(dtype), shape_(std::move(shape)), stride_(shape_.size(), 1) {
    const int r = static_cast<int>(shape_.size());
    std::vector<int> order(r);
    for (int d = 0; d < r; ++d) order[d] = r - 1 - d;
    if (layout == GpuLayout::head_major && r >= 3) std::swap(order[1], order[2]);
    int64_t running = 1;
    for (int x = 0; x < r; ++x) {
      stride_[order[x]] = running;
      running = running * std::max<int64_t>(shape_[order[x]], 1) + (layout == GpuLayout::contiguous ? 0 : 8);
    }
    storage_numel_ = running;
    host_.assign(static_cast<size_t>(storage_numel_) * dtype_size(dtype_), 0);
    for (int64_t i = 0; i < storage_numel_; ++i) write_poison(dtype_, host_.data(), i);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(host_.size(), 16));
    if (err != cudaSuccess) throw Error(std::string("test: cudaMalloc failed: ") + cudaGetErrorString(err));
    dev_.reset(p, CudaFree{});
    upload();
  }

  // A device copy of h's logical elements in `layout`.
  static DeviceTensor copy_of(const HostTensor& h, GpuLayout layout = GpuLayout::contiguous) {
    DeviceTensor t(h.dtype(), h.shape(), layout);
    t.set(h.to_dense());
    return t;
  }

  bool defined() const { return !shape_.empty(); }
  void* data() const { return dev_.get(); }
  DType dtype() const { return dtype_; }

  void set(const std::vector<double>& values) {
    const std::vector<int64_t> offs = logical_offsets();
    for (size_t i = 0; i < offs.size(); ++i) from_double(dtype_, host_.data(), offs[i], values[i]);
    upload();
  }

  void poison() {
    for (int64_t i = 0; i < storage_numel_; ++i) write_poison(dtype_, host_.data(), i);
    upload();
  }

  TensorView view() const {
    TensorView t;
    if (!defined()) return t;
    t.data = dev_.get();
    t.dtype = dtype_;
    t.device = Device::cuda;
    t.device_index = current_device();
    t.ndim = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      t.shape[d] = shape_[d];
      t.stride[d] = stride_[d];
    }
    return t;
  }

  // Reads the device storage back (synchronizes the device first).
  void download() {
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) throw Error(std::string("test: kernel failed: ") + cudaGetErrorString(err));
    const cudaError_t err2 = cudaMemcpy(host_.data(), dev_.get(), host_.size(), cudaMemcpyDeviceToHost);
    if (err2 != cudaSuccess) throw Error(std::string("test: cudaMemcpy failed: ") + cudaGetErrorString(err2));
  }

  std::vector<double> to_dense() {
    download();
    std::vector<double> out;
    for (int64_t off : logical_offsets()) out.push_back(to_double(dtype_, host_.data(), off));
    return out;
  }

  // After download(): every logical element written, nothing outside the view touched.
  ::testing::AssertionResult all_written(const std::string& name) const {
    int64_t bad = 0, e = 0, first = -1;
    for (int64_t off : logical_offsets()) {
      if (is_poison(dtype_, host_.data(), off)) {
        if (first < 0) first = e;
        ++bad;
      }
      ++e;
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << name << ": " << bad << " elements never written (first at logical index "
                                         << first << ")";
  }

  ::testing::AssertionResult padding_intact(const std::string& name) const {
    std::vector<char> logical(static_cast<size_t>(storage_numel_), 0);
    for (int64_t off : logical_offsets()) logical[static_cast<size_t>(off)] = 1;
    int64_t bad = 0;
    for (int64_t i = 0; i < storage_numel_; ++i)
      if (!logical[static_cast<size_t>(i)] && !is_poison(dtype_, host_.data(), i)) ++bad;
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << name << ": " << bad << " storage elements outside the view were written";
  }

  ::testing::AssertionResult untouched(const std::string& name) const {
    for (int64_t i = 0; i < storage_numel_; ++i)
      if (!is_poison(dtype_, host_.data(), i))
        return ::testing::AssertionFailure() << name << ": written by a call that failed (storage offset " << i << ")";
    return ::testing::AssertionSuccess();
  }

  const std::vector<unsigned char>& bytes() const { return host_; }

 private:
  void upload() {
    const cudaError_t err = cudaMemcpy(dev_.get(), host_.data(), host_.size(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) throw Error(std::string("test: cudaMemcpy failed: ") + cudaGetErrorString(err));
  }

  std::vector<int64_t> logical_offsets() const { return strided_offsets(shape_, stride_); }

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, stride_;
  int64_t storage_numel_ = 0;
  std::vector<unsigned char> host_;
  std::shared_ptr<void> dev_;
};

// After a batched forward of `c` with contiguous out [batch, seqlen_q, num_heads, head_dim_v] and lse
// [batch, num_heads, seqlen_q] read back: the number of elements whose NaN-ness differs from
// nan_head(b, h), i.e. 0 when every element of the heads that must be NaN is and no other is.
inline int64_t nan_head_mismatches(const ProblemConfig& c, const std::vector<double>& out,
                                   const std::vector<double>& lse,
                                   const std::function<bool(int64_t b, int64_t h)>& nan_head) {
  const int64_t sq = c.seqlen_q, h = c.num_heads, dv = c.dv();
  int64_t wrong = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t hq = 0; hq < h; ++hq) {
      const bool want = nan_head(b, hq);
      for (int64_t r = 0; r < sq; ++r) {
        wrong += std::isnan(lse[(b * h + hq) * sq + r]) != want;
        for (int64_t x = 0; x < dv; ++x) wrong += std::isnan(out[((b * sq + r) * h + hq) * dv + x]) != want;
      }
    }
  return wrong;
}

// The case builder of the forward and backward suites: a batched problem of these sizes.
inline ProblemConfig base(DType dt, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d) {
  return ProblemConfig::batched(dt, b, sq, sk, h, hk, d);
}

// Varlen sequences spanning many query and key tiles, whose last tiles cross into the next
// sequence's rows (the kernels' tile loops and varlen row zeroing), head_dim 128.
inline ProblemConfig multi_tile_varlen(DType dt, int64_t h, int64_t hk) {
  ProblemConfig c = base(dt, 0, 0, 0, h, hk, 128);
  c.lens_q = {517, 300, 1, 260};
  c.lens_k = {300, 1029, 129, 70};
  return c;
}

// One call captured into a CUDA graph on a stream of its own (non-blocking; thread-local capture
// mode unless told otherwise: PyTorch's torch.cuda.graph captures in global mode), to be replayed:
// capture(fn) runs fn(stream) under capture and instantiates the graph; replay() launches it after
// the device's earlier work and waits for it. Use with ASSERT_NO_FATAL_FAILURE.
class GraphCapture {
 public:
  explicit GraphCapture(cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) : mode_(mode) {
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  ~GraphCapture() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  GraphCapture(const GraphCapture&) = delete;
  GraphCapture& operator=(const GraphCapture&) = delete;

  template <typename F>
  void capture(F&& fn) {
    ASSERT_NE(stream_, nullptr);
    FLASHATTN_ASSERT_CUDA(cudaStreamBeginCapture(stream_, mode_));
    // A throwing fn must still end the capture: an open global-mode one would fail the tests after.
    bool threw = false;
    std::string failure;
    try {
      fn(stream_);
    } catch (const std::exception& e) {
      threw = true;
      failure = e.what();
    } catch (...) {
      threw = true;
      failure = "(not a std::exception)";
    }
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph_);
    if (threw || end != cudaSuccess) (void)cudaGetLastError();  // (not the next test's)
    ASSERT_FALSE(threw) << "the captured call threw: " << failure;
    ASSERT_EQ(end, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(end);
    FLASHATTN_ASSERT_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  void replay() {
    ASSERT_NE(exec_, nullptr);
    FLASHATTN_ASSERT_CUDA(cudaDeviceSynchronize());
    FLASHATTN_ASSERT_CUDA(cudaGraphLaunch(exec_, stream_));
    FLASHATTN_ASSERT_CUDA(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStreamCaptureMode mode_;
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Throws, naming the call, once `cap`'s capture is no longer active (a call CUDA refuses beside a
// global-mode capture ends it).
inline void expect_still_capturing(cudaStream_t cap, const char* after) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(cap, &status);
  if (err != cudaSuccess || status != cudaStreamCaptureStatusActive)
    throw std::runtime_error(std::string("the capture was invalidated by ") + after + " (" + cudaGetErrorName(err) +
                             ")");
}

// For calls beside another stream's capture: a non-blocking stream of their own, and a scratch
// buffer whose memset is the captured stream's one operation (record()). set_up() with
// ASSERT_NO_FATAL_FAILURE.
struct EagerBesideCapture {
  cudaStream_t stream = nullptr;  // the eager calls'
  void* scratch = nullptr;        // what the capture records
  EagerBesideCapture() = default;
  EagerBesideCapture(const EagerBesideCapture&) = delete;
  EagerBesideCapture& operator=(const EagerBesideCapture&) = delete;
  ~EagerBesideCapture() {
    cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  void set_up() {
    FLASHATTN_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FLASHATTN_ASSERT_CUDA(cudaMalloc(&scratch, 64));
  }
  void record(cudaStream_t cap) const {
    if (const cudaError_t err = cudaMemsetAsync(scratch, 0, 64, cap); err != cudaSuccess)
      throw std::runtime_error(std::string("cudaMemsetAsync on the captured stream: ") + cudaGetErrorString(err));
  }
};

// The device copy of a Problem: inputs uploaded, outputs and gradients poisoned.
struct GpuProblem {
  GpuProblem(Problem& pr, GpuLayout layout) : problem(&pr) {
    q = DeviceTensor::copy_of(pr.q, layout);
    k = DeviceTensor::copy_of(pr.k, layout);
    v = DeviceTensor::copy_of(pr.v, layout);
    dout = DeviceTensor::copy_of(pr.dout, layout);
    out = DeviceTensor(pr.out.dtype(), pr.out.shape(), layout);
    lse = DeviceTensor(DType::f32, pr.lse.shape(), layout);
    dq = DeviceTensor(pr.dq.dtype(), pr.dq.shape(), layout);
    dk = DeviceTensor(pr.dk.dtype(), pr.dk.shape(), layout);
    dv = DeviceTensor(pr.dv.dtype(), pr.dv.shape(), layout);
    const AttentionParams host = pr.params();
    if (host.cu_seqlens_q.defined()) {
      cu_q = copy_view(host.cu_seqlens_q);
      cu_k = copy_view(host.cu_seqlens_k);
    }
    if (host.alibi_slopes.defined()) alibi = copy_view(host.alibi_slopes);
    // Descales (e4m3 problems): copied as [1] or [batch, num_heads_k]; params() keeps the host
    // view's rank (0 for one value given as a scalar).
    const TensorView* descales[3] = {&host.q_descale, &host.k_descale, &host.v_descale};
    for (int i = 0; i < 3; ++i) {
      if (descales[i]->data == nullptr) continue;
      TensorView t = *descales[i];
      if (t.ndim == 0) t.ndim = 1;  // HostTensor of shape [1] behind it
      descale[i] = copy_view(t);
      descale_ndim[i] = descales[i]->ndim;
    }
  }

  AttentionParams params() const {
    AttentionParams a = problem->params();
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = problem->config().with_lse ? lse.view() : TensorView{};
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    if (cu_q.defined()) {
      a.cu_seqlens_q = cu_q.view();
      a.cu_seqlens_k = cu_k.view();
    }
    if (alibi.defined()) a.alibi_slopes = alibi.view();
    TensorView* descales[3] = {&a.q_descale, &a.k_descale, &a.v_descale};
    for (int i = 0; i < 3; ++i) {
      if (!descale[i].defined()) continue;
      *descales[i] = descale[i].view();
      descales[i]->ndim = descale_ndim[i];
    }
    return a;
  }

  // lse in the reference's [num_heads, total_q] order.
  std::vector<double> lse_dense() {
    const std::vector<double> l = lse.to_dense();
    const ProblemConfig& cfg = problem->config();
    if (cfg.varlen()) return l;
    std::vector<double> r(l.size());
    const int64_t H = cfg.num_heads, S = cfg.seqlen_q, T = problem->total_q();
    for (int64_t b = 0; b < cfg.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; ++i)
          r[static_cast<size_t>(h * T + b * S + i)] = l[static_cast<size_t>((b * H + h) * S + i)];
    return r;
  }

  Problem* problem;
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, alibi;
  DeviceTensor descale[3];  // q_descale, k_descale, v_descale
  int32_t descale_ndim[3] = {0, 0, 0};

 private:
  static DeviceTensor copy_view(const TensorView& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    DeviceTensor d(t.dtype, shape);
    std::vector<double> vals;
    // Contiguous host views (Problem builds them so): read them element by element.
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    for (int64_t i = 0; i < n; ++i) vals.push_back(to_double(t.dtype, t.data, i));
    d.set(vals);
    return d;
  }
};

// out of g (after a forward) written everywhere and within the project's criterion of the float64
// reference.
inline void expect_out_matches(GpuProblem& g) {
  const std::vector<double> out = g.out.to_dense();
  EXPECT_TRUE(g.out.all_written("out"));
  const DenseResults& ref = g.problem->reference(reference::Precision::f64, false);
  const DenseResults& naive = g.problem->reference(reference::Precision::input, false);
  EXPECT_TRUE(check_close("out", out, ref.out, naive.out, g.problem->config().dtype));
}

}  // namespace flashattn::testing
