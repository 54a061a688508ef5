// flashattn: exact attention computed the FlashAttention way.
//
// Forward (Dao et al. 2022, "FlashAttention", Alg. 1; Dao 2023, "FlashAttention-2", Alg. 1):
//   S   = softmax_scale · Q Kᵀ                                  [seqlen_q, seqlen_k] per (batch, head)
//   S   = softcap · tanh(S / softcap)             if softcap > 0 (Gemma-2 style logit capping)
//   S   = S − slope_h · |i + offset − j|                         if alibi_slopes (Press et al. 2022;
//                                        FlashAttention-2's convention: offset = seqlen_k − seqlen_q for
//                                        causal_align bottom_right (the default), 0 for top_left, the
//                                        mask's own offset, so that its diagonal gets bias 0)
//   S   = −inf where the mask hides key j from query i           (causal / sliding window, below)
//   lse = log Σ_j exp(S_ij)                                       natural log, float32
//   O   = exp(S − lse) V
// The seqlen_q × seqlen_k matrix is never materialized: keys are visited in tiles and an
// online softmax (running max m and sum l) rescales the partial output (FA-2 Alg. 1 lines 8–10).
//
// Backward (FA-2 Alg. 2): with P = exp(S − lse), D_i = Σ_d dO_id · O_id,
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),  dQ = softmax_scale · dS' K,  dK = softmax_scale · dS'ᵀ Q
// where dS' is dS times the derivative of softcap (1 − tanh²) when softcap > 0.
//
// Masks. Query row i (0-based within its sequence) may see key j when
//   j ≥ i + offset − window_size_left   (unless window_size_left < 0: unbounded)
//   j ≤ i + offset + window_size_right  (unless window_size_right < 0: unbounded)
// with offset = seqlen_k − seqlen_q for CausalAlign::bottom_right (FlashAttention ≥ 2.1) and
// offset = 0 for CausalAlign::top_left (PyTorch's is_causal). causal = true is window_size_right = 0.
// A query row that sees no key gets out = 0 and lse = −inf; its gradients are 0.
// Range: the scores are computed in float32, so softmax_scale · q·k and the ALiBi terms must stay
// below float32's 3.4e38 in magnitude; beyond it (e.g. softmax_scale = 1e38) the rows that overflow
// come out NaN, as in FlashAttention and PyTorch SDPA. Nothing checks it (the scores are not known
// before they are computed); validate() refuses non-finite scales, softcaps and host ALiBi slopes.
// Likewise out's float32 accumulator: P·V is summed before it is divided by the row sum (FA-2 Alg. 1),
// so the visible keys' sum of exp(s − max) · |v| must stay below 3.4e38 (e.g. |v| near 1e38 over 8
// keys gives inf where out itself is finite), as in FlashAttention and PyTorch SDPA.
// And lse, float32 too: the backward recomputes P = exp(s − lse) (FA-2 Alg. 2), which needs lse =
// max + log(row sum) to keep its log term. Where the row's largest score is so large that the
// term is lost in rounding (scores above ~1e7 with many tied near the maximum; partly from ~1e5),
// P sums to more than 1 and the gradients come out too large, without a warning; out is not
// affected. FlashAttention and PyTorch SDPA's flash backend store lse in float32 alike.
// Non-finite values inside q, k, v or dout are not checked either: like FlashAttention's, the
// kernels multiply whole tiles, so a NaN or inf in a key that the mask hides from a row can still
// reach that row's out or gradients (0 · NaN) when the row sees other keys of the same tile; the
// float64 reference skips masked keys and stays finite there. (The CPU backend leaves keys that no
// query sees out of every product, e.g. the tail of a key cache under a top-left causal mask.)
//
// Layouts (strides in elements, the last dimension contiguous):
//   batched: q [batch, seqlen_q, num_heads, head_dim]      k [batch, seqlen_k, num_heads_k, head_dim]
//            v [batch, seqlen_k, num_heads_k, head_dim_v]  out [batch, seqlen_q, num_heads, head_dim_v]
//            lse [batch, num_heads, seqlen_q] float32
//   varlen:  q [total_q, num_heads, head_dim], k/v [total_k, num_heads_k, ...], out [total_q, ...],
//            cu_seqlens_q / cu_seqlens_k int32 [batch + 1], lse [num_heads, total_q] float32
//   dout, dq, dk, dv have the shapes of out, q, k, v.
//   alibi_slopes float32 [num_heads] or [batch, num_heads], finite (checked for host slopes).
// Every data pointer is aligned to its element size (the CUDA backend: 16 bytes for q, k, v, out and
// the gradients). cu_seqlens end at the packed row count (checked on both backends, on CUDA by one
// device-to-host copy per call, skipped under stream capture). Outputs share no byte with an input
// and no element with each other (packed dq/dk/dv views of one buffer are fine: element sets are
// compared exactly), and each output's strides are nested (each at least the span of the dims
// with smaller strides, so that no element is reached twice).
// GQA/MQA: num_heads must be a multiple of num_heads_k; query head h reads KV head h / (num_heads / num_heads_k),
// and dk/dv of a KV head are sums over its query heads.
//
// FP8 forward (FlashAttention-3, Shah et al. 2024, Sec. 3.3): q, k, v in DType::e4m3 with float32
// dequantization factors q_descale, k_descale, v_descale (per tensor, or per (batch, KV head)):
//   S = softmax_scale · (q_descale·Q)(k_descale·K)ᵀ   (then softcap, ALiBi and the masks as above)
//   O = softmax(S) · (v_descale·V)                    out in bf16, lse float32 as above
// where query head h uses the descales of KV head h / (num_heads / num_heads_k). Forward only, batched
// layout only, head_dim = head_dim_v = 128 only, on the CUDA backend (sm_90) only; every other case is
// refused by name (plan() gives the reason, forward() and backward() throw it); seqlen_k = 0 too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace flashattn {

/// Every error the library reports. The message names the argument, what was expected and what came,
/// e.g. "q: expected dtype bf16 (same as k), got fp16". CUDA failures carry CUDA's own message.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime call failed (an illegal address, out of memory, a launch error, ...): what() gives
/// the call, CUDA's error name and its message. The C API returns FA_STATUS_CUDA for it.
class CudaError : public Error {
 public:
  using Error::Error;
};

// e4m3: OCP float8 e4m3fn (PyTorch's torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7) and 3
// mantissa bits, no infinities, 0x7F / 0xFF = NaN, largest finite 448, subnormals down to 2^-9.
// Only q, k and v of the FP8 forward take it (see the header comment).
enum class DType : int32_t { f32 = 0, f16 = 1, bf16 = 2, i32 = 3, e4m3 = 4 };
enum class Device : int32_t { cpu = 0, cuda = 1 };
/// The largest head_dim and head_dim_v a call may have, on every backend (1 <= head_dim <= 256, as in
/// FlashAttention; larger ones get an Error naming q's or v's last dimension).
inline constexpr int64_t kMaxHeadDim = 256;
enum class CausalAlign : int32_t { bottom_right = 0, top_left = 1 };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

/// A non-owning view of a strided tensor. An empty view (data == nullptr, ndim == 0) means "not given".
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int32_t device_index = 0;
  int32_t ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};  // in elements

  bool defined() const { return ndim > 0; }
  int64_t numel() const;
};

/// A contiguous (row-major) view over `data` with the given shape.
TensorView make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device = Device::cpu, int32_t device_index = 0);

/// Everything one attention call needs, shared by forward and backward (as FlashAttention-3's
/// hopper/flash.h). Forward reads q, k, v and writes out (and lse when given). Backward reads
/// q, k, v, out, lse, dout and writes dq, dk, dv.
struct AttentionParams {
  TensorView q, k, v, out, lse;
  TensorView dout, dq, dk, dv;

  // Variable-length batch: both given or neither. max_seqlen_* are optional hints (0 = derive).
  TensorView cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;

  // 0 = 1/sqrt(head_dim); else |softmax_scale| >= FLT_MIN (denormals are refused).
  float softmax_scale = 0.0f;
  bool causal = false;
  CausalAlign causal_align = CausalAlign::bottom_right;
  int64_t window_size_left = -1;   // -1 = unbounded
  int64_t window_size_right = -1;  // -1 = unbounded (0 when causal)
  // 0 = off; else finite, >= FLT_MIN with a finite reciprocal, and softmax_scale / softcap a
  // normal float32 (the scores are scaled by that ratio before tanh).
  float softcap = 0.0f;
  TensorView alibi_slopes;         // float32 [num_heads] or [batch, num_heads]

  bool deterministic = false;  // backward: bitwise-repeatable results (no atomics on the GPU)
  // CPU: 0 = all hardware threads. The backward runs fewer when its per-thread dQ buffers (each a
  // whole (batch, KV head) group of fp32 rows) would take more than half the available memory, and
  // throws Error when even one does not fit.
  int num_threads = 0;
  void* stream = nullptr;      // CUDA: cudaStream_t, nullptr = default stream

  // FP8 forward only (q, k, v e4m3; FlashAttention-3's q_descale / k_descale / v_descale, Sec. 3.3):
  // float32 dequantization factors, on q's device, each either [batch, num_heads_k] (any strides,
  // 0 broadcasts) or a single value for the whole tensor (rank 0 with data, or rank 1 of size 1).
  // Not given (data == nullptr, ndim == 0) = 1. Query head h uses KV head h / (num_heads / num_heads_k).
  // Given with q not e4m3: Error naming the argument. The values are read by the kernel, not on the
  // host (that would synchronize every call, as FlashAttention-3 and cuDNN do not either): a (batch,
  // kv head) whose descales are not finite and > 0, or whose softmax_scale · q_descale · k_descale
  // (and it / softcap when softcap is on) is not a normal float32 of magnitude <= FLT_MAX / log2(e),
  // gets NaN in every out and lse element of its query heads; no finite result is computed from
  // them. The call also takes a workspace of batch · num_heads_k · 128 · round_up(seqlen_k, 128)
  // bytes (Vᵀ: FP8 wgmma reads both operands K-major) with cudaMallocAsync on the stream; Error
  // naming v when it cannot, or when that passes 2^48 bytes.
  TensorView q_descale, k_descale, v_descale;
};

/// Which kernel would run a call, or why none can. Dispatch, the CLI, the bindings and the tests all
/// ask this, so "supported" and "runs" never disagree.
struct Plan {
  bool ok = false;
  std::string kernel;  // e.g. "cpu_fwd_tiled_bm512_bn128", "cuda_bwd_sm90_dsplit_hdim256"
  std::string reason;  // when !ok: the argument, what was expected and what came
};

enum class Pass : int32_t { forward = 0, backward = 1 };

/// Validates `params` for `pass` and names the kernel that would run. Never throws for bad input.
Plan plan(const AttentionParams& params, Pass pass);

/// Forward pass: writes out (and lse when defined). Throws flashattn::Error on bad input; on error
/// nothing is written to the outputs. CUDA calls are asynchronous on params.stream, except that a
/// varlen call first reads cu_seqlens back with one synchronizing copy (not under stream capture);
/// a kernel fault surfaces as flashattn::CudaError from a later call, as with any CUDA work.
/// CUDA graphs: calls may be captured in any capture mode, and calls on a stream that is not being
/// captured may run while another stream is (the library's own allocations, copies and
/// synchronizations run in a relaxed capture mode, so that they do not invalidate that capture;
/// CUDA's own rules still apply: the legacy default stream cannot run beside the capture of a
/// blocking stream).
void forward(const AttentionParams& params);

/// Backward pass: writes dq, dk, dv. lse must be the forward's. Throws flashattn::Error. Streams,
/// synchronization and CUDA graphs as for forward() (its workspace is stream-ordered memory).
void backward(const AttentionParams& params);

/// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();

/// Version string, e.g. "0.1.0".
const char* version();

}  // namespace flashattn
