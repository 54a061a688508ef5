// The CUDA backend's entry points over validated detail::Params: plan() says whether the kernels
// cover a call (and which one runs) or names the argument they don't cover; forward() and
// backward() launch on params.stream. validate() has already checked shapes, dtypes and devices
// agree; this file adds what only the GPU path needs: device pointers on the current device,
// 16-byte alignment and strides in whole 16-byte chunks (cp.async copies 8 elements at a time),
// fp16/bf16 only, head_dim a multiple of 8 up to 256, and the device-side cu_seqlens.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/backends.hpp"
#include "common/params.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/fwd_traits.hpp"
#include "cuda/kernel_utils.cuh"
#include "cuda/sm90_utils.cuh"

#ifdef FLASHATTN_CUDA_HAS_BWD  // defined by src/cuda/CMakeLists.txt when the backward is built
#include "cuda/bwd_launch.hpp"
#include "cuda/bwd_traits.hpp"
#endif

namespace flashattn::cuda {

#ifdef FLASHATTN_CUDA_FWD_SWEEP
bool launch_fwd_sweep(int variant, int head_dim, const FwdParams& p, int batch, int max_seqlen_q, void* stream);
#endif

namespace {

using LaunchFwd = void (*)(const FwdParams&, int, int, void*);

// The Hopper (sm_90a) forward: built for every row below when FLASHATTN_CUDA_ARCHS has 90a.
using LaunchFwdSm90 = void (*)(const FwdParams&, int, int, int64_t, int64_t, void*);
#ifdef FLASHATTN_CUDA_FWD_SM90
#define FA_FWD_SM90(T, D) &launch_fwd_sm90<T, D>
#else
#define FA_FWD_SM90(T, D) nullptr
#endif

struct FwdKernel {
  DType dtype;
  int head_dim;  // bucket: head_dim and head_dim_v <= this
  LaunchFwd launch;           // sm80 (mma.sync): any GPU
  LaunchFwdSm90 launch_sm90;  // sm90 (TMA + wgmma): sm_90 only; nullptr when not built
};

// The forward instantiations this build ships (src/cuda/CMakeLists.txt generates one translation
// unit per row and architecture and defines the matching macros).
constexpr FwdKernel kFwdKernels[] = {
#ifdef FLASHATTN_CUDA_FWD_F16_HDIM64
    {DType::f16, 64, &launch_fwd_sm80<F16, 64>, FA_FWD_SM90(F16, 64)},
#endif
#ifdef FLASHATTN_CUDA_FWD_F16_HDIM128
    {DType::f16, 128, &launch_fwd_sm80<F16, 128>, FA_FWD_SM90(F16, 128)},
#endif
#ifdef FLASHATTN_CUDA_FWD_F16_HDIM256
    {DType::f16, 256, &launch_fwd_sm80<F16, 256>, FA_FWD_SM90(F16, 256)},
#endif
#ifdef FLASHATTN_CUDA_FWD_BF16_HDIM64
    {DType::bf16, 64, &launch_fwd_sm80<BF16, 64>, FA_FWD_SM90(BF16, 64)},
#endif
#ifdef FLASHATTN_CUDA_FWD_BF16_HDIM128
    {DType::bf16, 128, &launch_fwd_sm80<BF16, 128>, FA_FWD_SM90(BF16, 128)},
#endif
#ifdef FLASHATTN_CUDA_FWD_BF16_HDIM256
    {DType::bf16, 256, &launch_fwd_sm80<BF16, 256>, FA_FWD_SM90(BF16, 256)},
#endif
    {DType::f32, 0, nullptr, nullptr},  // sentinel: keeps the array non-empty when everything is pruned
};
#undef FA_FWD_SM90

// Compute capability of the current device, cached per device (cudaGetDeviceProperties is slow).
int device_cc(int device) {
  static std::atomic<int> cache[64] = {};
  if (device < 0 || device >= 64) return 0;
  int cc = cache[device].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = major * 10 + minor;
    cache[device].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

// FLASHATTN_CUDA_FWD=sm80 / FLASHATTN_CUDA_BWD=sm80 force the sm80 kernels on a Hopper GPU (tests
// and benchmarks cover both paths on one machine).
bool forced_sm80(const char* env) { return env_is(env, "sm80"); }

// Whether the current device runs the sm_90a image (exactly compute capability 9.0).
bool on_sm90() {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  return device_cc(device) == 90;
}

// Why q, k, v (and dout in the backward) do not fit TMA maps, or nullopt when they do: at least one
// row each, strides of dims longer than 1 positive and below 2^39 elements (2^40 bytes of 16 bits),
// rows below 2^31 (TMA coordinates are int32). `context` goes after "expected ..." in the reason
// (the 16-bit kernels only ask whether they fit: they fall back to sm80; FP8 reports the reason).
std::optional<std::string> tma_misfit(const detail::Params& p, bool bwd, const char* context) {
  if (p.rows_q >= (int64_t{1} << 31) || p.rows_k >= (int64_t{1} << 31)) {
    return std::string("q: expected fewer than 2^31 rows") + context + " (TMA coordinates), got " +
           std::to_string(p.rows_q) + " query and " + std::to_string(p.rows_k) + " key rows";
  }
  // A tensor map needs every dim >= 1 (and a non-null base): empty q or k stay on the sm80 path,
  // whose kernels write out = 0, lse = -inf and zero gradients for them.
  if (p.rows_q < 1) return std::string("q: expected at least one query") + context + " (TMA maps), got seqlen_q 0";
  if (p.rows_k < 1) return std::string("k: expected at least one key") + context + " (TMA maps), got seqlen_k 0";
  const int64_t nb = p.is_varlen ? 1 : p.batch;
  struct Strided {
    const char* name;
    int64_t rows, heads, batch_stride, row_stride, head_stride;
  };
  const Strided tensors[] = {
      {"q", p.rows_q, p.num_heads, p.q_batch_stride, p.q_row_stride, p.q_head_stride},
      {"k", p.rows_k, p.num_heads_k, p.k_batch_stride, p.k_row_stride, p.k_head_stride},
      {"v", p.rows_k, p.num_heads_k, p.v_batch_stride, p.v_row_stride, p.v_head_stride},
      {"dout", bwd ? p.rows_q : 0, p.num_heads, p.do_batch_stride, p.do_row_stride, p.do_head_stride}};
  for (const Strided& t : tensors) {
    const std::pair<const char*, std::pair<int64_t, int64_t>> dims[] = {
        {"batch", {nb, t.batch_stride}}, {"row", {t.rows, t.row_stride}}, {"head", {t.heads, t.head_stride}}};
    for (const auto& [which, ns] : dims) {
      if (t.rows > 0 && !sm90::tma_dim_fits(ns.first, ns.second)) {
        return std::string(t.name) + ": expected the " + which + " stride in (0, 2^39) elements" + context +
               " (TMA maps; broadcast heads or rows need a copy), got " + std::to_string(ns.second);
      }
    }
  }
  return std::nullopt;
}

bool tma_fits(const detail::Params& p, bool bwd) { return !tma_misfit(p, bwd, ""); }

// Whether the chosen bucket's Hopper forward runs this call: the device is sm_90 (the sm_90a image
// needs exactly 9.0), it was built, the tensors fit TMA maps, and it is not forced off.
bool use_fwd_sm90(const FwdKernel& k, const detail::Params& p) {
  return k.launch_sm90 != nullptr && !forced_sm80("FLASHATTN_CUDA_FWD") && on_sm90() && tma_fits(p, false);
}


// The smallest shipped bucket that holds both head dims, or nullptr.
const FwdKernel* pick_fwd(const detail::Params& p) {
  const int64_t need = std::max(p.head_dim, p.head_dim_v);
  const FwdKernel* best = nullptr;
  for (const FwdKernel& k : kFwdKernels) {
    if (k.launch == nullptr || k.dtype != p.dtype || k.head_dim < need) continue;
    if (best == nullptr || k.head_dim < best->head_dim) best = &k;
  }
  return best;
}

std::string shipped_buckets(DType dtype) {
  std::string s;
  for (const FwdKernel& k : kFwdKernels) {
    if (k.launch == nullptr || k.dtype != dtype) continue;
    s += (s.empty() ? "" : ", ") + std::to_string(k.head_dim);
  }
  return s.empty() ? "none" : s;
}

std::string device_str(int index) { return "cuda:" + std::to_string(index); }

// Why `ptr` cannot be read by a kernel on `device`, or nullopt when it can.
std::optional<std::string> check_pointer(const char* name, const void* ptr, int device) {
  if (ptr == nullptr) return std::nullopt;  // validate() allows nullptr only for empty tensors
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so that later calls don't report it
    return std::string(name) + ": expected a device pointer on " + device_str(device) +
           ", got a pointer CUDA does not know (" + cudaGetErrorString(err) + ")";
  }
  if (attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost) {
    return std::string(name) + ": expected a device pointer (cudaMalloc or managed memory) on " +
           device_str(device) + ", got a host pointer" +
           (attr.type == cudaMemoryTypeHost ? " (pinned host memory)" : "");
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    return std::string(name) + ": expected a tensor on the current device " + device_str(device) + ", got memory on " +
           device_str(attr.device) + " (call cudaSetDevice first)";
  }
  return std::nullopt;
}

struct StridedTensor {
  const char* name;
  const void* ptr;
  int64_t batch_stride, row_stride, head_stride;
  int64_t heads;
  int64_t elem_bytes = 2;
};

// cp.async, TMA and the output stores move 16 bytes (8 elements of 16 bits, 16 of e4m3) at a time.
std::optional<std::string> check_layout(const StridedTensor& t, const detail::Params& p) {
  if (t.ptr == nullptr) return std::nullopt;
  const auto addr = reinterpret_cast<std::uintptr_t>(t.ptr);
  if (addr % 16 != 0) {
    return std::string(t.name) + ": expected a data pointer aligned to 16 bytes on cuda, got address " +
           std::to_string(addr) + " (" + std::to_string(addr % 16) + " bytes past a 16-byte boundary)";
  }
  const int64_t unit = 16 / t.elem_bytes;
  auto bad = [&](const char* which, int64_t stride) -> std::optional<std::string> {
    if (stride % unit == 0) return std::nullopt;
    return std::string(t.name) + ": expected the " + which + " stride to be a multiple of " + std::to_string(unit) +
           " elements (16 bytes) on cuda, got " + std::to_string(stride);
  };
  // Strides of size-1 dims are never stepped through (PyTorch leaves arbitrary ones there).
  if (!p.is_varlen && p.batch > 1)
    if (auto r = bad("batch", t.batch_stride)) return r;
  if (p.is_varlen || p.seqlen_q > 1 || p.seqlen_k > 1)
    if (auto r = bad("row", t.row_stride)) return r;
  if (t.heads > 1)
    if (auto r = bad("head", t.head_stride)) return r;
  return std::nullopt;
}

// Host copy of a device cu_seqlens array, checked as validate() checks host ones
// (detail::cu_seqlens_error: a prefix sum from 0 to the packed rows) and for every length <= bound
// (validate() sets seqlen to the max_seqlen hint, else the packed total). Returns the longest
// length or a reason.
struct SeqlenCheck {
  int64_t max_len = 0;
  std::string error;
};

SeqlenCheck check_device_cu_seqlens(const char* name, const int32_t* cu, int64_t batch, int64_t bound, int64_t total,
                                    const char* total_what, cudaStream_t stream) {
  SeqlenCheck r;
  std::vector<int32_t> host(static_cast<size_t>(batch + 1));
  FA_CUDA_CHECK(cudaMemcpyAsync(host.data(), cu, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  int64_t longest_at = 0;
  r.error = detail::cu_seqlens_error(name, host.data(), batch, total, total_what, r.max_len, longest_at);
  if (r.error.empty() && r.max_len > bound) {
    r.error = std::string(name) + ": expected every sequence length <= " + std::to_string(bound) +
              " (max_seqlen hint or total rows), got " + std::to_string(r.max_len) + " for sequence " +
              std::to_string(longest_at);
  }
  return r;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FA_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Actual longest q and k sequences of a varlen call, read from the device when allowed, or the
// validate() bounds. Under stream capture a synchronizing copy is illegal (it would invalidate
// the capture), so the device-side values are not checked there: the grid is then sized by the
// bound, which is safe (blocks past a sequence's end exit), and the caller is responsible for
// valid cu_seqlens, as with any captured kernel's inputs.
struct Lengths {
  int64_t max_q, max_k;
  std::string error;
};

Lengths varlen_lengths(const detail::Params& p) {
  Lengths l{p.seqlen_q, p.seqlen_k, ""};
  if (!p.is_varlen) return l;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (stream_capturing(stream)) return l;
  const RelaxedCaptureMode relaxed;  // (another stream may be under capture)
  SeqlenCheck q = check_device_cu_seqlens("cu_seqlens_q", p.cu_seqlens_q, p.batch, p.seqlen_q, p.rows_q,
                                          "total_q = q.shape[0]", stream);
  if (!q.error.empty()) return {0, 0, q.error};
  SeqlenCheck k = check_device_cu_seqlens("cu_seqlens_k", p.cu_seqlens_k, p.batch, p.seqlen_k, p.rows_k,
                                          "total_k = k.shape[0]", stream);
  if (!k.error.empty()) return {0, 0, k.error};
  return {q.max_len, k.max_len, ""};
}

// What the FP8 (e4m3) forward needs beyond validate()'s checks (which already refuse its backward,
// varlen, head_dims other than 128 and an out that is not bf16): this build's and this device's
// Hopper kernels, tensors that fit TMA maps. The descale values are not read on the host (a
// synchronizing copy per call): the kernel turns a head with bad ones into NaN (fwd_sm90_tma_wgmma.cuh).
std::optional<std::string> check_fp8(const detail::Params& p) {
#ifndef FLASHATTN_CUDA_FWD_SM90_FP8
  return std::string("q: expected a build with the sm_90a kernels for e4m3 (FLASHATTN_CUDA_ARCHS with 90a), got one "
                     "without");
#else
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  if (device_cc(device) != 90) {
    return "q: expected an sm_90 GPU for e4m3 (Hopper's FP8 tensor cores) on cuda, got compute capability " +
           std::to_string(device_cc(device) / 10) + "." + std::to_string(device_cc(device) % 10);
  }
  if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) return std::nullopt;  // nothing to compute or write
  // The Vᵀ workspace (fwd_sm90_fp8.cu) takes batch · num_heads_k · 128 · seqlen_k (rounded up to
  // the key tile) bytes. k and v may be views of far less memory (overlapping strides), so this
  // product is bounded by nothing else and could wrap size_t into a small allocation that the
  // pre-pass then writes past; no real call needs 2^48 bytes.
  const double workspace = double(p.batch) * double(p.num_heads_k) * 128.0 * double((p.seqlen_k + 127) / 128 * 128);
  if (workspace > 0x1p48) {
    char got[160];
    std::snprintf(got, sizeof got, "%.4g bytes (batch %lld, num_heads_k %lld, seqlen_k %lld)", workspace,
                  static_cast<long long>(p.batch), static_cast<long long>(p.num_heads_k),
                  static_cast<long long>(p.seqlen_k));
    return std::string("v: expected the FP8 forward's Vᵀ workspace (batch · num_heads_k · 128 · seqlen_k bytes) "
                       "below 2^48 bytes on cuda, got ") + got;
  }
  // The 16-bit kernels fall back to sm80 where the TMA maps do not fit; FP8 has no fallback.
  return tma_misfit(p, false, " for e4m3 on cuda");
#endif
}

std::optional<std::string> check_common(const detail::Params& p, Pass pass) {
  if (!available()) {
    return std::string("device: expected a CUDA device, got none (") +
           "cudaGetDeviceCount found no usable GPU)";
  }
  if (p.dtype != DType::f16 && p.dtype != DType::bf16 && p.dtype != DType::e4m3) {
    return std::string("q: expected fp16, bf16 or e4m3 on cuda, got ") + dtype_name(p.dtype) + " (convert first)";
  }
  // The kernels fold log2(e) into the scale (one FFMA per score, FA-2 Sec. 3.1): past FLT_MAX /
  // log2(e) that product is inf and every score NaN, though the scale is a float32 (the CPU takes it).
  if (std::fabs(p.softmax_scale) > kMaxSoftmaxScale) {
    char got[64];
    std::snprintf(got, sizeof got, "%.8g", double(p.softmax_scale));
    return std::string("softmax_scale: expected |softmax_scale| <= FLT_MAX / log2(e) = 2.3587e+38 on cuda (the "
                       "kernels fold log2(e) into it), got ") + got;
  }
  if (p.head_dim % 8 != 0 || p.head_dim > 256) {
    return "head_dim: expected a multiple of 8 up to 256 on cuda, got " + std::to_string(p.head_dim);
  }
  if (p.head_dim_v % 8 != 0 || p.head_dim_v > 256) {
    return "head_dim_v: expected a multiple of 8 up to 256 on cuda, got " + std::to_string(p.head_dim_v);
  }
  if (p.num_heads > 65535) return "q: expected num_heads <= 65535 on cuda (grid y), got " + std::to_string(p.num_heads);
  if (p.batch > 65535) return "q: expected batch <= 65535 on cuda (grid z), got " + std::to_string(p.batch);
  if (p.seqlen_q >= (int64_t{1} << 31) || p.seqlen_k >= (int64_t{1} << 31)) {
    return "q: expected seqlen_q and seqlen_k < 2^31 on cuda, got " + std::to_string(p.seqlen_q) + " and " +
           std::to_string(p.seqlen_k);
  }

  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  if (p.device_index != device) {
    return "q: expected tensors on the current CUDA device " + device_str(device) + ", got " +
           device_str(p.device_index) + " (call cudaSetDevice first)";
  }
  const bool bwd = pass == Pass::backward;
  struct Named {
    const char* name;
    const void* ptr;
  };
  const Named pointers[] = {{"q", p.q},
                            {"k", p.k},
                            {"v", p.v},
                            {"out", p.out},
                            {"lse", p.lse},
                            {"cu_seqlens_q", p.cu_seqlens_q},
                            {"cu_seqlens_k", p.cu_seqlens_k},
                            {"alibi_slopes", p.alibi_slopes},
                            {"q_descale", p.q_descale},
                            {"k_descale", p.k_descale},
                            {"v_descale", p.v_descale},
                            {"dout", bwd ? p.dout : nullptr},
                            {"dq", bwd ? p.dq : nullptr},
                            {"dk", bwd ? p.dk : nullptr},
                            {"dv", bwd ? p.dv : nullptr}};
  for (const Named& n : pointers)
    if (auto r = check_pointer(n.name, n.ptr, device)) return r;

  const auto in_bytes = static_cast<int64_t>(dtype_size(p.dtype));
  std::vector<StridedTensor> tensors = {
      {"q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.num_heads, in_bytes},
      {"k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.num_heads_k, in_bytes},
      {"v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.num_heads_k, in_bytes},
      {"out", p.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.num_heads,
       static_cast<int64_t>(dtype_size(p.out_dtype))}};
  if (bwd) {
    tensors.push_back({"dout", p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, p.num_heads});
    tensors.push_back({"dq", p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.num_heads});
    tensors.push_back({"dk", p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, p.num_heads_k});
    tensors.push_back({"dv", p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, p.num_heads_k});
  }
  for (const StridedTensor& t : tensors)
    if (auto r = check_layout(t, p)) return r;
  if (p.lse != nullptr && reinterpret_cast<std::uintptr_t>(p.lse) % 4 != 0) {
    return std::string("lse: expected a float32 pointer aligned to 4 bytes, got address ") +
           std::to_string(reinterpret_cast<std::uintptr_t>(p.lse));
  }
  // Last: its checks read the device (the current one, which the pointers above were checked on).
  if (p.dtype == DType::e4m3) return check_fp8(p);
  return std::nullopt;
}

FwdParams make_fwd_params(const detail::Params& p, int64_t max_q, int64_t max_k) {
  FwdParams f{};
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.out = p.out;
  f.lse = p.lse;
  f.q_batch_stride = p.q_batch_stride;
  f.q_row_stride = p.q_row_stride;
  f.q_head_stride = p.q_head_stride;
  f.k_batch_stride = p.k_batch_stride;
  f.k_row_stride = p.k_row_stride;
  f.k_head_stride = p.k_head_stride;
  f.v_batch_stride = p.v_batch_stride;
  f.v_row_stride = p.v_row_stride;
  f.v_head_stride = p.v_head_stride;
  f.o_batch_stride = p.o_batch_stride;
  f.o_row_stride = p.o_row_stride;
  f.o_head_stride = p.o_head_stride;
  f.lse_batch_stride = p.lse_batch_stride;
  f.lse_head_stride = p.lse_head_stride;
  f.lse_row_stride = p.lse_row_stride;
  f.cu_seqlens_q = p.is_varlen ? p.cu_seqlens_q : nullptr;
  f.cu_seqlens_k = p.is_varlen ? p.cu_seqlens_k : nullptr;
  f.seqlen_q = static_cast<int>(max_q);
  f.seqlen_k = static_cast<int>(max_k);
  f.num_heads = static_cast<int>(p.num_heads);
  f.head_ratio = static_cast<int>(p.num_heads / p.num_heads_k);
  f.head_dim = static_cast<int>(p.head_dim);
  f.head_dim_v = static_cast<int>(p.head_dim_v);
  f.softmax_scale = p.softmax_scale;
  f.softcap = p.softcap;
  f.window_size_left = p.window_size_left;
  f.window_size_right = p.window_size_right;
  f.align_bottom_right = p.align_bottom_right;
  f.alibi_slopes = p.alibi_slopes;
  f.alibi_batch_stride = p.alibi_batch_stride;
  f.q_descale = p.q_descale;
  f.k_descale = p.k_descale;
  f.v_descale = p.v_descale;
  f.q_descale_batch_stride = p.q_descale_batch_stride;
  f.q_descale_head_stride = p.q_descale_head_stride;
  f.k_descale_batch_stride = p.k_descale_batch_stride;
  f.k_descale_head_stride = p.k_descale_head_stride;
  f.v_descale_batch_stride = p.v_descale_batch_stride;
  f.v_descale_head_stride = p.v_descale_head_stride;
  return f;
}

#ifdef FLASHATTN_CUDA_HAS_BWD
// The Hopper dK/dV kernels: sm_90, not deterministic, TMA-able tensors.
// FLASHATTN_CUDA_BWD=sm80 forces the sm80 one.
bool use_bwd_sm90(const detail::Params& p) {
  return !forced_sm80("FLASHATTN_CUDA_BWD") && bwd_sm90_covers(p) && on_sm90() && tma_fits(p, true);
}

// The backward's working sizes: a varlen call's longest sequences as read from the device (the
// max_seqlen hints, or the packed totals without hints, only bound them; sizing the workspace by
// the totals grew it with batch²), or the hints under stream capture.
detail::Params bwd_sized(const detail::Params& p, const Lengths& l) {
  detail::Params sized = p;
  if (p.is_varlen && l.error.empty()) {
    sized.seqlen_q = l.max_q;
    sized.seqlen_k = l.max_k;
  }
  return sized;
}

// What the backward kernels cannot take, named: int mask arithmetic, the grid's y dimension
// (resident tiles of keys, or of queries in the deterministic dQ kernel), and the sm80 kernels'
// shared memory on devices with less than sm_90's 227 KB per block.
std::optional<std::string> bwd_limits(const detail::Params& p, bool sm90) {
  if (p.seqlen_q + p.seqlen_k >= (int64_t{1} << 31)) {
    return "q: expected seqlen_q + seqlen_k < 2^31 for the CUDA backward, got " + std::to_string(p.seqlen_q) + " + " +
           std::to_string(p.seqlen_k);
  }
  const int64_t rows = bwd_block_rows(p, sm90);
  const int64_t max_rows = 65535 * rows;
  if (p.seqlen_k > max_rows) {
    return "seqlen_k: expected at most " + std::to_string(max_rows) + " keys (65535 blocks of " + std::to_string(rows) +
           ") for the CUDA backward, got " + std::to_string(p.seqlen_k);
  }
  if (p.deterministic && p.seqlen_q > max_rows) {
    return "seqlen_q: expected at most " + std::to_string(max_rows) + " queries (65535 blocks of " +
           std::to_string(rows) + ") for the deterministic CUDA backward, got " + std::to_string(p.seqlen_q);
  }
  if (p.num_heads * p.batch >= (int64_t{1} << 31)) {
    return "q: expected num_heads * batch < 2^31 for the CUDA backward, got " + std::to_string(p.num_heads) + " * " +
           std::to_string(p.batch);
  }
  if (!sm90) {
    int device = 0, optin = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const int need = bwd_sm80_smem_bytes(p);
    if (need > optin) {
      return "head_dim: the CUDA backward for head_dim bucket " + std::to_string(bwd_sm80_head_dim_bucket(p)) +
             " needs " + std::to_string(need) + " bytes of shared memory per block, the device offers " +
             std::to_string(optin) + " (head_dim <= 64 fits every sm_80+ GPU)";
    }
  }
  return std::nullopt;
}
#endif

}  // namespace

bool available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

Plan plan(const detail::Params& p, Pass pass) {
  Plan result;
  try {
    if (auto reason = check_common(p, pass)) {
      result.reason = *reason;
      return result;
    }
    const Lengths l = varlen_lengths(p);  // one device read of cu_seqlens serves both uses below
    if (pass == Pass::forward && p.dtype == DType::e4m3) {
      result.kernel = "cuda_fwd_sm90_fp8_hdim128";
    } else if (pass == Pass::forward) {
      const FwdKernel* k = pick_fwd(p);
      if (k == nullptr) {
        result.reason = "head_dim: expected max(head_dim, head_dim_v) within a head_dim bucket this build ships for " +
                        std::string(dtype_name(p.dtype)) + " (" + shipped_buckets(p.dtype) + "), got " +
                        std::to_string(std::max(p.head_dim, p.head_dim_v)) +
                        " (configure FLASHATTN_CUDA_FWD_HEAD_DIMS)";
        return result;
      }
      result.kernel = std::string(use_fwd_sm90(*k, p) ? "cuda_fwd_sm90_tma_wgmma_hdim" : "cuda_fwd_sm80_mma_hdim") +
                      std::to_string(k->head_dim);
    } else {
#ifdef FLASHATTN_CUDA_HAS_BWD
      const detail::Params sized = bwd_sized(p, l);
      const bool sm90 = use_bwd_sm90(sized);
      if (auto reason = bwd_limits(sized, sm90)) {
        result.reason = *reason;
        return result;
      }
      const int bucket = bwd_sm80_head_dim_bucket(p);
      const char* family = !sm90                            ? "cuda_bwd_sm80_mma_hdim"
                           : bwd_sm90_dsplit_bucket(bucket) ? "cuda_bwd_sm90_dsplit_hdim"
                                                            : "cuda_bwd_sm90_tma_wgmma_hdim";
      result.kernel = std::string(family) + std::to_string(bucket);
#else
      result.reason = "backward: expected a build with the CUDA backward kernel, got one without it (not yet implemented)";
      return result;
#endif
    }
    if (!l.error.empty()) {
      result.reason = l.error;
      result.kernel.clear();
      return result;
    }
    result.ok = true;
  } catch (const Error& e) {
    result.ok = false;
    result.kernel.clear();
    result.reason = e.what();
  }
  return result;
}

void forward(const detail::Params& p) {
  if (auto reason = check_common(p, Pass::forward)) throw Error(*reason);
#ifdef FLASHATTN_CUDA_FWD_SM90_FP8
  if (p.dtype == DType::e4m3) {
    if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) return;
    launch_fwd_sm90_fp8(make_fwd_params(p, p.seqlen_q, p.seqlen_k), static_cast<int>(p.batch),
                        static_cast<int>(p.seqlen_q), p.rows_q, p.rows_k, p.stream);
    return;
  }
#endif
  const FwdKernel* k = pick_fwd(p);
  if (k == nullptr) throw Error(plan(p, Pass::forward).reason);
  const Lengths l = varlen_lengths(p);
  if (!l.error.empty()) throw Error(l.error);
  if (p.batch == 0 || l.max_q == 0 || p.num_heads == 0) return;
  const FwdParams f = make_fwd_params(p, l.max_q, l.max_k);
#ifdef FLASHATTN_CUDA_FWD_SWEEP
  if (const char* v = std::getenv("FLASHATTN_FWD_VARIANT"); v != nullptr && p.dtype == DType::bf16)
    if (launch_fwd_sweep(std::atoi(v), k->head_dim, f, static_cast<int>(p.batch), static_cast<int>(l.max_q), p.stream))
      return;
#endif
  if (use_fwd_sm90(*k, p)) {
    k->launch_sm90(f, static_cast<int>(p.batch), static_cast<int>(l.max_q), p.rows_q, p.rows_k, p.stream);
    return;
  }
  k->launch(f, static_cast<int>(p.batch), static_cast<int>(l.max_q), p.stream);
}

void backward(const detail::Params& p) {
#ifdef FLASHATTN_CUDA_HAS_BWD
  if (auto reason = check_common(p, Pass::backward)) throw Error(*reason);
  const Lengths l = varlen_lengths(p);
  if (!l.error.empty()) throw Error(l.error);
  const detail::Params sized = bwd_sized(p, l);
  const bool sm90 = use_bwd_sm90(sized);
  if (auto reason = bwd_limits(sized, sm90)) throw Error(*reason);
  run_bwd_sm80(sized, static_cast<cudaStream_t>(p.stream), sm90);
#else
  (void)p;
  throw Error("backward: expected a build with the CUDA backward kernel, got one without it (not yet implemented)");
#endif
}

}  // namespace flashattn::cuda
