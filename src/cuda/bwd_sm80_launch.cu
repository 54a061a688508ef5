// Host side of the sm80 backward (FlashAttention-2, Dao 2023, Alg. 2): the preprocess
// (D = rowsum(dout ∘ out), lse in base 2), the dK/dV kernel, and either the dq postprocess (fp32
// atomic accumulator -> scaled dq, the fast default) or the deterministic dQ kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "cuda/bwd_launch.hpp"
#include "cuda/bwd_traits.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_utils.cuh"

namespace flashattn::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per block of the row-wise pre/postprocess

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// The pre/postprocess give each (row, head) kTpr consecutive threads, one 16-byte chunk (8
// elements) each per step: kTpr = head_dim bucket / 8, so each row of out / dout / dq is read or
// written in whole lines. Consecutive row units are consecutive rows i of one head, so that the
// 4-byte statistics (lse in, dsum and lse_log2 out, [batch, heads, rows]) and the dq accumulator's
// rows are contiguous across a warp too; with heads fastest, each went to a sector of its own.
// (One warp per row left 24 of 32 lanes idle at head_dim 64, and both kernels took twice FA-2's
// time: bench/gpu/kernel_times.py, perf-notes.)
template <int kTpr>
struct RowUnit {
  bool active;  // inside [0, stat_rows) x [0, num_heads) of the grid
  bool valid;   // and inside its sequence
  int sub;      // this thread's index among the row's kTpr threads
  int i, h;
  int64_t q_row;  // row of q/out/dout/dq in the tensors (sequence start + i)
  int64_t stat;   // index into dsum / lse_log2
};

// Sequence b's first row in q / out / dout / dq and its length (batched: row 0 and seqlen_q).
struct QuerySequence {
  int64_t start;
  int len;
};
__device__ __forceinline__ QuerySequence query_sequence(const BwdParams& p, int b) {
  if (p.cu_seqlens_q == nullptr) return {0, p.seqlen_q};
  return {p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]};
}

template <int kTpr>
__device__ __forceinline__ RowUnit<kTpr> row_unit(const BwdParams& p) {
  RowUnit<kTpr> r{};
  const int b = blockIdx.y;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / kTpr;
  r.sub = threadIdx.x % kTpr;
  r.active = w < static_cast<int64_t>(p.stat_rows) * p.num_heads;
  if (!r.active) return r;
  r.h = static_cast<int>(w / p.stat_rows);
  r.i = static_cast<int>(w % p.stat_rows);
  const QuerySequence seq = query_sequence(p, b);
  r.valid = r.i < seq.len;
  r.q_row = seq.start + r.i;
  r.stat = (static_cast<int64_t>(b) * p.num_heads + r.h) * p.stat_rows + r.i;
  return r;
}

// D_i = Σ_d dout_id · out_id (FA-2 Alg. 2 line 4) in fp32, and lse·log2(e) with −inf (a row that
// sees no key) turned into +inf so that the main kernels get P = exp2(s − (+inf)) = 0, never NaN.
// Also clears the dq accumulator (the atomic / bulk-reduce target of the main kernel) and the split
// tail's tickets, which saves a cudaMemsetAsync call and its kernel per backward.
template <typename Elem, int kTpr>
__global__ void __launch_bounds__(kRowThreads) bwd_preprocess_kernel(const __grid_constant__ BwdParams p) {
  using Storage = typename Elem::Storage;
  // The dK/dV kernel behind this one may take an SM as soon as every block here has started
  // (it waits for this grid's writes itself).
  griddep_launch_dependents();
  // Flat grid-stride sweeps over the dq accumulator (whatever its tile layout: 16-byte aligned, a
  // multiple of 8 floats per row) and the Hopper kernel's split-tail tickets and flags.
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * gridDim.y * kRowThreads;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kRowThreads + threadIdx.x;
  if (p.dq_accum != nullptr) {
    const int64_t n4 = static_cast<int64_t>(p.batch) * p.num_heads * p.stat_rows * dq_accum_row_floats(p) / 4;
    float4* acc = reinterpret_cast<float4*>(p.dq_accum);
    for (int64_t x = first; x < n4; x += nthreads) acc[x] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (p.split_sync != nullptr)
    for (int64_t x = first; x < p.split_sync_ints; x += nthreads) p.split_sync[x] = 0;
  const RowUnit<kTpr> r = row_unit<kTpr>(p);
  const int b = blockIdx.y;
  float acc = 0.f;
  if (r.active && r.valid) {
    const Storage* o = static_cast<const Storage*>(p.out) + b * p.o_batch_stride + r.q_row * p.o_row_stride +
                       r.h * p.o_head_stride;
    const Storage* d = static_cast<const Storage*>(p.dout) + b * p.do_batch_stride +
                       r.q_row * p.do_row_stride + r.h * p.do_head_stride;
    for (int c = r.sub * 8; c < p.head_dim_v; c += kTpr * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
      const Storage* oe = reinterpret_cast<const Storage*>(&ov);
      const Storage* de = reinterpret_cast<const Storage*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += to_float(oe[e]) * to_float(de[e]);
    }
  }
  acc = lane_group_sum<kTpr>(acc);  // a row's kTpr threads; every lane takes part
  if (!r.active || r.sub != 0) return;
  if (!r.valid) {
    p.dsum[r.stat] = 0.f;
    p.lse_log2[r.stat] = INFINITY;
    return;
  }
  p.dsum[r.stat] = acc;
  const float lse = p.lse[b * p.lse_batch_stride + r.h * p.lse_head_stride + r.q_row * p.lse_row_stride];
  p.lse_log2[r.stat] = lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// dq = softmax_scale · dq_accum, converted to the element type (FA-2 Alg. 2's final dQ write).
template <typename Elem, int kTpr>
__global__ void __launch_bounds__(kRowThreads) bwd_postprocess_kernel(const __grid_constant__ BwdParams p) {
  using Storage = typename Elem::Storage;
  griddep_wait();  // the dK/dV kernel's dq accumulator, when launched behind it (run_bwd_sm80)
  const RowUnit<kTpr> r = row_unit<kTpr>(p);
  if (!r.active || !r.valid) return;
  const int b = blockIdx.y;
  // Row i of (b, h): stat = (b * num_heads + h) * stat_rows + i. Eight consecutive columns
  // (c % 8 == 0) stay contiguous and 32-byte aligned in either accumulator layout.
  const int64_t head_base = (r.stat - r.i) * dq_accum_row_floats(p);
  Storage* dst = static_cast<Storage*>(p.dq) + b * p.dq_batch_stride + r.q_row * p.dq_row_stride +
                 r.h * p.dq_head_stride;
  const float s = p.softmax_scale;
  for (int c = r.sub * 8; c < p.head_dim; c += kTpr * 8) {
    const float* src = p.dq_accum + head_base + dq_accum_offset(p, r.i, c);
    const float4 x0 = *reinterpret_cast<const float4*>(src);
    const float4 x1 = *reinterpret_cast<const float4*>(src + 4);
    uint4 out;
    out.x = pack2<Elem>(x0.x * s, x0.y * s);
    out.y = pack2<Elem>(x0.z * s, x0.w * s);
    out.z = pack2<Elem>(x1.x * s, x1.y * s);
    out.w = pack2<Elem>(x1.z * s, x1.w * s);
    *reinterpret_cast<uint4*>(dst + c) = out;
  }
}

// The same for the 80-row blocks of BwdSm90Bm80Config's accumulator (BwdParams): one block of
// threads per (80-row tile, head, batch) reads the tile's 8 blocks of 80 x 16 floats as float4 (the
// layout's order), transposes them through shared memory and writes 16-byte row chunks of dq.
template <typename Elem>
__global__ void __launch_bounds__(kRowThreads) bwd_postprocess_bm80_kernel(const __grid_constant__ BwdParams p) {
  using Storage = typename Elem::Storage;
  constexpr int kRows = BwdSm90Bm80Config::kBlockM, kCols = 128, kLd = kCols + 4;  // +4: rows 4 banks apart
  __shared__ float tile[kRows * kLd];
  griddep_wait();
  const int b = blockIdx.y, h = static_cast<int>(blockIdx.x / (p.stat_rows / kRows));
  const int i0 = static_cast<int>(blockIdx.x % (p.stat_rows / kRows)) * kRows;
  const QuerySequence seq = query_sequence(p, b);
  if (i0 >= seq.len) return;
  const float4* src = reinterpret_cast<const float4*>(
      p.dq_accum + ((static_cast<int64_t>(b) * p.num_heads + h) * p.stat_rows + i0) * kCols);
  for (int v = threadIdx.x; v < kRows * kCols / 4; v += kRowThreads) {
    // float4 v: block v / 320 (16 columns), chunk of 8 rows (v % 320) / 32, column (v % 32) / 2,
    // rows 4·(v % 2) .. + 3 of the chunk.
    const float4 x = src[v];
    const int blk = v / 320, w = v % 320;
    const int r = (w / 32) * 8 + (w % 2) * 4, c = blk * 16 + (w % 32) / 2;
    tile[r * kLd + c] = x.x;
    tile[(r + 1) * kLd + c] = x.y;
    tile[(r + 2) * kLd + c] = x.z;
    tile[(r + 3) * kLd + c] = x.w;
  }
  __syncthreads();
  const float s = p.softmax_scale;
  for (int u = threadIdx.x; u < kRows * (kCols / 8); u += kRowThreads) {
    const int r = u / (kCols / 8), c = (u % (kCols / 8)) * 8;
    if (i0 + r >= seq.len || c >= p.head_dim) continue;
    const float* x = tile + r * kLd + c;
    uint4 out;
    out.x = pack2<Elem>(x[0] * s, x[1] * s);
    out.y = pack2<Elem>(x[2] * s, x[3] * s);
    out.z = pack2<Elem>(x[4] * s, x[5] * s);
    out.w = pack2<Elem>(x[6] * s, x[7] * s);
    Storage* dst = static_cast<Storage*>(p.dq) + b * p.dq_batch_stride + (seq.start + i0 + r) * p.dq_row_stride +
                   h * p.dq_head_stride;
    *reinterpret_cast<uint4*>(dst + c) = out;
  }
}

template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  if (dtype == DType::f16) {
    f(F16{});
  } else if (dtype == DType::bf16) {
    f(BF16{});
  } else {
    throw Error(std::string("q: expected dtype fp16 or bf16 for the CUDA backward, got ") + dtype_name(dtype));
  }
}

template <typename F>
void dispatch_head_dim(int bucket, F&& f) {
  switch (bucket) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}

BwdParams make_bwd_params(const detail::Params& p) {
  BwdParams bp{};
  bp.q = p.q;
  bp.k = p.k;
  bp.v = p.v;
  bp.out = p.out;
  bp.dout = p.dout;
  bp.dq = p.dq;
  bp.dk = p.dk;
  bp.dv = p.dv;
  bp.lse = p.lse;
  bp.q_batch_stride = p.q_batch_stride, bp.q_row_stride = p.q_row_stride, bp.q_head_stride = p.q_head_stride;
  bp.k_batch_stride = p.k_batch_stride, bp.k_row_stride = p.k_row_stride, bp.k_head_stride = p.k_head_stride;
  bp.v_batch_stride = p.v_batch_stride, bp.v_row_stride = p.v_row_stride, bp.v_head_stride = p.v_head_stride;
  bp.o_batch_stride = p.o_batch_stride, bp.o_row_stride = p.o_row_stride, bp.o_head_stride = p.o_head_stride;
  bp.do_batch_stride = p.do_batch_stride, bp.do_row_stride = p.do_row_stride,
  bp.do_head_stride = p.do_head_stride;
  bp.dq_batch_stride = p.dq_batch_stride, bp.dq_row_stride = p.dq_row_stride,
  bp.dq_head_stride = p.dq_head_stride;
  bp.dk_batch_stride = p.dk_batch_stride, bp.dk_row_stride = p.dk_row_stride,
  bp.dk_head_stride = p.dk_head_stride;
  bp.dv_batch_stride = p.dv_batch_stride, bp.dv_row_stride = p.dv_row_stride,
  bp.dv_head_stride = p.dv_head_stride;
  bp.lse_batch_stride = p.lse_batch_stride, bp.lse_head_stride = p.lse_head_stride,
  bp.lse_row_stride = p.lse_row_stride;
  bp.cu_seqlens_q = p.is_varlen ? p.cu_seqlens_q : nullptr;
  bp.cu_seqlens_k = p.is_varlen ? p.cu_seqlens_k : nullptr;
  bp.batch = static_cast<int>(p.batch);
  bp.seqlen_q = static_cast<int>(p.seqlen_q);
  bp.seqlen_k = static_cast<int>(p.seqlen_k);
  bp.num_heads = static_cast<int>(p.num_heads);
  bp.num_heads_k = static_cast<int>(p.num_heads_k);
  bp.head_ratio = static_cast<int>(p.num_heads / p.num_heads_k);
  bp.head_dim = static_cast<int>(p.head_dim);
  bp.head_dim_v = static_cast<int>(p.head_dim_v);
  bp.softmax_scale = p.softmax_scale;
  bp.softcap = p.softcap;
  // A window wider than both sequences is unbounded in effect; clamping keeps the kernels in int.
  const int64_t widest = p.seqlen_q + p.seqlen_k;
  bp.window_size_left = p.window_size_left < 0 ? -1 : static_cast<int>(std::min(p.window_size_left, widest));
  bp.window_size_right = p.window_size_right < 0 ? -1 : static_cast<int>(std::min(p.window_size_right, widest));
  bp.align_bottom_right = p.align_bottom_right;
  bp.alibi_slopes = p.alibi_slopes;
  bp.alibi_batch_stride = p.alibi_batch_stride;
  return bp;
}

}  // namespace

int bwd_sm80_head_dim_bucket(const detail::Params& p) {
  const int64_t d = std::max(p.head_dim, p.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

int bwd_sm80_smem_bytes(const detail::Params& p) {
  int bytes = 0;
  dispatch_head_dim(bwd_sm80_head_dim_bucket(p),
                    [&](auto hdim) { bytes = BwdShape<decltype(hdim)::value>::kSmemBytes; });
  return bytes;
}

int bwd_block_rows(const detail::Params& p, bool use_sm90) {
  if (use_sm90)
    return bwd_sm90_dsplit_bucket(bwd_sm80_head_dim_bucket(p)) ? BwdSm90SplitConfig<256>::kBlockN
                                                                : BwdSm90Config<128>::kBlockN;
  int rows = 0;
  dispatch_head_dim(bwd_sm80_head_dim_bucket(p), [&](auto hdim) { rows = BwdShape<decltype(hdim)::value>::kRes; });
  return rows;
}

// Whether launch_bwd_sm90 was instantiated for Elem (FLASHATTN_CUDA_DTYPES may leave one out).
template <typename Elem>
constexpr bool bwd_sm90_built() {
#if defined(FLASHATTN_CUDA_BWD_SM90_F16)
  if constexpr (std::is_same_v<Elem, F16>) return true;
#endif
#if defined(FLASHATTN_CUDA_BWD_SM90_BF16)
  if constexpr (std::is_same_v<Elem, BF16>) return true;
#endif
  return false;
}

bool bwd_sm90_covers(const detail::Params& p) {
#ifdef FLASHATTN_CUDA_BWD_SM90
  const bool built = p.dtype == DType::f16 ? bwd_sm90_built<F16>() : p.dtype == DType::bf16 && bwd_sm90_built<BF16>();
  return built && !p.deterministic;
#else
  (void)p;
  return false;
#endif
}

void run_bwd_sm80(const detail::Params& p, cudaStream_t stream, bool use_sm90) {
  BwdParams bp = make_bwd_params(p);
  if (bp.batch == 0) return;

  const int bucket = bwd_sm80_head_dim_bucket(p);
  // The Hopper kernel at head_dim 128 without softcap or ALiBi (their element-wise code spilled
  // next to 80-query tiles) steps 80 query rows at a time (BwdSm90Bm80Config, FA-3's tile without a
  // mask) where that was measured to pay: without a mask, and under a causal mask from seqlen_q
  // kBwdBm80MinCausalSeqlenQ (session 36, bf16 / fp16 against 64-row steps: +2-15 % from 4096,
  // +0.5-1.6 % at 2048, -2 % at 1024, -10 % at 512, where the diagonal's masked steps weigh
  // more). Other windows keep 64 (not measured). A varlen batch goes by its longest sequence (the
  // steps are one config per launch). FLASHATTN_CUDA_BWD_BM80=0 keeps 64 everywhere, =1 takes 80
  // wherever the kernel allows (testing); read at every call, for A/B runs in one process.
  const bool bm80_allowed = use_sm90 && bucket == 128 && bp.softcap == 0.f && bp.alibi_slopes == nullptr;
  const bool bm80_pays = (bp.window_size_left < 0 && bp.window_size_right < 0) ||
                         (bp.window_size_left < 0 && bp.window_size_right == 0 &&
                          bp.seqlen_q >= kBwdBm80MinCausalSeqlenQ);
  const bool bm80 = bm80_allowed && !env_is("FLASHATTN_CUDA_BWD_BM80", "0") &&
                    (bm80_pays || env_is("FLASHATTN_CUDA_BWD_BM80", "1"));
  bp.dq_accum_tile_rows = bm80 ? BwdSm90Bm80Config::kBlockM : 64;
  // Workspace: dsum and lse_log2 [batch, num_heads, stat_rows], then the dq accumulator. 80-row
  // steps read their statistics and add their dQ in whole 80-row tiles too.
  bp.stat_rows = (bp.seqlen_q + kStatRowAlign - 1) / kStatRowAlign * kStatRowAlign;
  constexpr int kBm80 = BwdSm90Bm80Config::kBlockM;
  if (bm80) bp.stat_rows = (bp.stat_rows + kBm80 - 1) / kBm80 * kBm80;
  const int64_t stat_count = static_cast<int64_t>(bp.batch) * bp.num_heads * bp.stat_rows;
  // The Hopper kernels' bulk reduce-adds want whole 64 x 64 tiles over the head_dim bucket (80 x
  // 16 blocks under bm80), or in the 256 bucket over the head-dim-split kernel's config (192
  // columns where head_dim and head_dim_v are both <= 192: tile_256; FLASHATTN_CUDA_BWD_D192=0
  // keeps the 256 config, read at every call for A/B runs). The launch takes the config from these
  // columns.
  bp.dq_accum_cols = !use_sm90                      ? 0
                     : !bwd_sm90_dsplit_bucket(bucket) ? bucket
                                                       : bwd_256_tile_cols(tile_256(
                                                             p.head_dim, p.head_dim_v,
                                                             !env_is("FLASHATTN_CUDA_BWD_D192", "0")));
  const int64_t accum_count = p.deterministic ? 0 : stat_count * dq_accum_row_floats(bp);
  // The Hopper dK/dV kernel's split tail (bwd_sm90_tma_wgmma.cuh, grid_order.hpp
  // bwd_split_tail_blocks): where every block costs the same (no mask, no varlen lengths), the last
  // partial wave's blocks run as kBwdSplitParts parts. FLASHATTN_CUDA_BWD_SPLIT_TAIL=0 never splits,
  // =1 (testing) splits every block, under any mask; read at every call, so that a benchmark can
  // time both in one process. Workspace per split block: each consumer warp's slot holds its parts'
  // summed dK and dV (32 lanes x bucket floats), and 4 ints of ticket and flags.
  const int64_t pairs = static_cast<int64_t>(bp.batch) * bp.num_heads_k;
  bp.split_first = std::numeric_limits<int64_t>::max();
  int64_t split_blocks = 0;
  if (use_sm90 && !bwd_sm90_dsplit_bucket(bucket) && bp.seqlen_k > 0 && bp.seqlen_q > 0 &&
      !env_is("FLASHATTN_CUDA_BWD_SPLIT_TAIL", "0")) {
    const int block_n = BwdSm90Config<128>::kBlockN;
    const int block_m = bucket <= 64 ? BwdSm90Config<64>::kBlockM
                        : bm80       ? BwdSm90Bm80Config::kBlockM
                                     : BwdSm90Config<128>::kBlockM;
    const int64_t tiles = (bp.seqlen_k + block_n - 1) / block_n, blocks = pairs * tiles;
    const bool uniform = bp.cu_seqlens_q == nullptr && bp.window_size_left < 0 && bp.window_size_right < 0;
    const int64_t rows = static_cast<int64_t>((bp.seqlen_q + block_m - 1) / block_m) * block_m * bp.head_ratio;
    split_blocks = env_is("FLASHATTN_CUDA_BWD_SPLIT_TAIL", "1") ? blocks
                   : uniform ? bwd_split_tail_blocks(blocks, multiprocessor_count(), rows, kBwdSplitParts)
                             : 0;
    // The grid's y dimension (rows of `pairs` blocks) stays within CUDA's 65535.
    if ((bwd_launch_blocks(blocks, blocks - split_blocks) + pairs - 1) / pairs > 65535) split_blocks = 0;
    if (split_blocks > 0) bp.split_first = blocks - split_blocks;
  }
  const int64_t split_ws_count = split_blocks * 8 * 32 * bucket;
  bp.split_sync_ints = split_blocks * 8 * 4;
  const size_t bytes =
      static_cast<size_t>(2 * stat_count + accum_count + split_ws_count + bp.split_sync_ints) * sizeof(float);
  StreamBuffer ws;
  if (bytes > 0)
    if (const cudaError_t err = ws.allocate(bytes, stream); err != cudaSuccess)
      throw_cuda_error(err, ("cudaMallocAsync of the backward's " + std::to_string(bytes) + "-byte workspace").c_str(),
                       __FILE__, __LINE__);
  float* base = static_cast<float*>(ws.ptr);
  bp.dsum = base;
  bp.lse_log2 = base + stat_count;
  // The postprocess reads dq_accum with float4 loads and the dK/dV kernel adds float2 pairs, so it
  // must start on a 16-byte boundary: 2 * stat_count floats is one because stat_rows is a multiple
  // of kStatRowAlign. (Unpadded, batch * num_heads * seqlen_q odd put it 8 bytes off: "misaligned
  // address" in the postprocess at seqlen_q = 1.)
  static_assert(kStatRowAlign % 2 == 0 && kBm80 % 2 == 0, "dq_accum must start 16-byte aligned");
  bp.dq_accum = p.deterministic || accum_count == 0 ? nullptr : base + 2 * stat_count;  // zeroed by the preprocess
  // (16-byte aligned after dq_accum: its floats are a multiple of 64 per row.)
  bp.split_ws = split_blocks > 0 ? base + 2 * stat_count + accum_count : nullptr;
  // (Zeroed by the preprocess.)
  bp.split_sync = split_blocks > 0 ? reinterpret_cast<int*>(bp.split_ws + split_ws_count) : nullptr;
  dispatch_dtype(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    dispatch_head_dim(bucket, [&](auto hdim) {
      constexpr int kHeadDim = decltype(hdim)::value;
      constexpr int kTpr = kHeadDim / 8;  // threads per (row, head) in the pre/postprocess
      const int64_t row_units = static_cast<int64_t>(bp.stat_rows) * bp.num_heads;
      const dim3 row_grid(static_cast<unsigned>((row_units * kTpr + kRowThreads - 1) / kRowThreads), bp.batch);
      if (row_grid.x > 0) {
        bwd_preprocess_kernel<Elem, kTpr><<<row_grid, kRowThreads, 0, stream>>>(bp);
        FA_CUDA_CHECK(cudaGetLastError());
      }
      // The Hopper dK/dV kernel (not the head_dim 256 one) starts behind the preprocess with
      // programmatic dependent launch, and the postprocess behind it: each grid's blocks take the SMs
      // its predecessor's last wave frees and run their set-up (and the dK/dV kernel its first K, V,
      // Q and dO loads, which read only inputs) before griddep_wait(). Only there: those kernels are
      // then built for sm_90a, where griddep_wait() is the instruction and not a no-op.
      if (bp.seqlen_k > 0) {
        bool launched = false;
#ifdef FLASHATTN_CUDA_BWD_SM90
        if constexpr (bwd_sm90_built<Elem>()) {
          if (use_sm90) {
            if constexpr (bwd_sm90_dsplit_bucket(kHeadDim)) {
              launch_bwd_sm90_dsplit<Elem, kHeadDim>(bp, p.rows_q, p.rows_k, stream);
            } else {
              bp.pdl = row_grid.x > 0 && pdl_available();
              launch_bwd_sm90<Elem, kHeadDim>(bp, p.rows_q, p.rows_k, stream);
            }
            launched = true;
          }
        }
#endif
        if (!launched) launch_bwd_sm80<Elem, kHeadDim, false>(bp, stream);
      }
      if (p.deterministic && bp.seqlen_q > 0) launch_bwd_sm80<Elem, kHeadDim, true>(bp, stream);
      if (!p.deterministic && row_grid.x > 0) {
        if constexpr (kHeadDim == 128) {
          if (bp.dq_accum_tile_rows == BwdSm90Bm80Config::kBlockM) {
            const dim3 tile_grid(static_cast<unsigned>(static_cast<int64_t>(bp.stat_rows / kBm80) * bp.num_heads),
                                 bp.batch);
            launch_kernel(bwd_postprocess_bm80_kernel<Elem>, tile_grid, dim3(kRowThreads), 0, stream, bp.pdl, bp);
            return;
          }
        }
        launch_kernel(bwd_postprocess_kernel<Elem, kTpr>, row_grid, dim3(kRowThreads), 0, stream, bp.pdl, bp);
      }
    });
  });
}

}  // namespace flashattn::cuda
