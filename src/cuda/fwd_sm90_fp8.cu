// The FP8 (e4m3) forward's launch: v transposed into a workspace, then the Hopper forward
// (fwd_sm90_tma_wgmma.cuh) with e4m3 tiles. Built when the build has sm_90a machine code.
#include "cuda/fwd_sm90_tma_wgmma.cuh"

namespace flashattn::cuda {

// ---- FP8 (e4m3) forward ------------------------------------------------------------------------
// FP8 wgmma reads both operands K-major, so O += P V needs Vᵀ (keys contiguous). A pre-pass writes
// it, and permutes the keys within each 32-key block so that the softmax's accumulator registers,
// packed four to a register, are already the 8-bit A fragment of P (FA-3 shuffles bytes instead):
// position c of a block holds key fp8_vt_key(c), the key whose score sits at byte c % 4 of the
// fragment register of thread (c % 16) / 4 (n8 tiles 2j, 2j+1 give keys 2t, 2t+1, 8+2t, 9+2t).
__host__ __device__ constexpr int fp8_vt_key(int c) {
  const int r = c % 16, i = r % 4;
  return 16 * (c / 16) + 2 * (r / 4) + (i & 1) + 8 * (i >> 1);
}

// The permutation, checked where it is defined: a bijection of the 32 keys, and thread t's fragment
// bytes 4t .. 4t+3 hold the keys of its accumulator columns 2t, 2t+1 of n8 tiles 0 and 1.
constexpr bool fp8_vt_key_is_the_fragment_order() {
  bool seen[32] = {};
  for (int c = 0; c < 32; ++c) {
    const int k = fp8_vt_key(c);
    if (k < 0 || k >= 32 || seen[k]) return false;
    seen[k] = true;
  }
  for (int t = 0; t < 4; ++t)
    for (int half = 0; half < 2; ++half) {
      const int c = 16 * half + 4 * t;
      const int n8 = 2 * half;  // the fragment register's two n8 tiles: 2 half and 2 half + 1
      if (fp8_vt_key(c) != 8 * n8 + 2 * t || fp8_vt_key(c + 1) != 8 * n8 + 2 * t + 1 ||
          fp8_vt_key(c + 2) != 8 * (n8 + 1) + 2 * t || fp8_vt_key(c + 3) != 8 * (n8 + 1) + 2 * t + 1)
        return false;
    }
  return true;
}
static_assert(fp8_vt_key_is_the_fragment_order(), "fp8_vt_key must match pack_p's register order");

// vt[b, hk, d, col] = v[b, key(col), hk, d], key(col) = 32 ⌊col / 32⌋ + fp8_vt_key(col % 32), and 0
// past seqlen_k. One block per (128 keys, kv head, batch), head_dim 128: v's rows into shared memory
// as 16-byte chunks, then each thread turns four 4-byte words (4 keys x 4 dims) into four (4 dims x
// 4 keys) with byte permutes, four times, and stores one 16-byte chunk into each of its 4 rows of vt.
// Shared memory is [key][32 words] with word w of key r at w ^ 4 (r / 16 % 8): the 32 lanes of a load
// (8 column chunks x 4 dims) hit 32 banks, and a chunk's 4 words stay together for the 16-byte store.
// (A first version read one byte per shared-memory load: 41 µs for 2 x 33.5 MB, 1.6 TB/s.)
template <int D>
__global__ void __launch_bounds__(256) fp8_transpose_v_kernel(const __grid_constant__ FwdParams p, uint8_t* vt) {
  static_assert(D == 128, "one 32-word shared-memory row per key, 8 warps of 4 dims x 8 chunks");
  __shared__ alignas(16) uint32_t tile[128][32];
  const int key0 = blockIdx.x * 128, hk = blockIdx.y, b = blockIdx.z;
  const int num_heads_k = p.num_heads / p.head_ratio;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride;
  auto swizzled = [](int key, int word) { return word ^ (4 * ((key / 16) % 8)); };
  for (int i = threadIdx.x; i < 128 * (D / 16); i += blockDim.x) {
    const int r = i / (D / 16), c = i % (D / 16);
    uint4 val = make_uint4(0, 0, 0, 0);
    if (key0 + r < p.seqlen_k) val = *reinterpret_cast<const uint4*>(v + (key0 + r) * p.v_row_stride + c * 16);
    *reinterpret_cast<uint4*>(&tile[r][swizzled(r, 4 * c)]) = val;
  }
  __syncthreads();
  // Thread: output columns 16 c16 .. +15 (keys 16 c16 + 0..15) of rows d = 4 dg .. 4 dg + 3.
  const int lane = threadIdx.x % 32, c16 = lane % 8, dg = 4 * (threadIdx.x / 32) + lane / 8;
  uint32_t rows[4][4];  // [d - 4 dg][word of the 16-byte chunk]
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // Word w holds columns 16 c16 + 4w .. +3: keys fp8_vt_key(16 (c16 % 2) + 4w + e) of the block.
    uint32_t x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 32 * (c16 / 2) + fp8_vt_key(16 * (c16 % 2) + 4 * w + e);
      x[e] = tile[key][swizzled(key, dg)];
    }
    const uint32_t lo01 = __byte_perm(x[0], x[1], 0x5140), hi01 = __byte_perm(x[0], x[1], 0x7362);
    const uint32_t lo23 = __byte_perm(x[2], x[3], 0x5140), hi23 = __byte_perm(x[2], x[3], 0x7362);
    rows[0][w] = __byte_perm(lo01, lo23, 0x5410);
    rows[1][w] = __byte_perm(lo01, lo23, 0x7632);
    rows[2][w] = __byte_perm(hi01, hi23, 0x5410);
    rows[3][w] = __byte_perm(hi01, hi23, 0x7632);
  }
  uint8_t* out = vt + ((int64_t(b) * num_heads_k + hk) * D + 4 * dg) * p.vt_cols + key0 + 16 * c16;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<uint4*>(out + int64_t(j) * p.vt_cols) = make_uint4(rows[j][0], rows[j][1], rows[j][2], rows[j][3]);
}

void launch_fwd_sm90_fp8(const FwdParams& p0, int batch, int max_seqlen_q, int64_t rows_q, int64_t rows_k,
                         void* stream) {
  using Cfg = FwdSm90Fp8Traits::Config;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int num_heads_k = p0.num_heads / p0.head_ratio;
  FwdParams p = p0;
  p.vt_cols = (int64_t(p.seqlen_k) + 127) / 128 * 128;
  StreamBuffer vt;
  const size_t bytes = size_t(batch) * num_heads_k * Cfg::kHeadDim * p.vt_cols;
  if (const cudaError_t err = vt.allocate(bytes, cuda_stream); err != cudaSuccess) {
    throw Error("v: the FP8 forward's transposed copy of v (its workspace) needs " + std::to_string(bytes) +
                " bytes of device memory, cudaMallocAsync failed: " + cudaGetErrorString(err));
  }
  fp8_transpose_v_kernel<Cfg::kHeadDim><<<dim3(unsigned(p.vt_cols / 128), unsigned(num_heads_k), unsigned(batch)), 256,
                                          0, cuda_stream>>>(p, static_cast<uint8_t*>(vt.ptr));
  FA_CUDA_CHECK(cudaGetLastError());
  p.vt = vt.ptr;
  launch_fwd_sm90_config<E4M3, Cfg>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
}

}  // namespace flashattn::cuda
