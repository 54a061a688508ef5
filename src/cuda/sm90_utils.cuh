// PTX helpers of the Hopper (sm_90a) kernels: mbarriers, TMA bulk tensor copies, wgmma and its
// shared-memory descriptors, setmaxnreg and named barriers. Each is one instruction, as in
// kernel_utils.cuh, so that the kernels read like FlashAttention-3 (Shah et al. 2024, Sec. 3)
// and the SASS stays predictable.
//
// Shared-memory tiles of the sm90 kernels use the 128-byte swizzle that TMA writes and wgmma
// reads (PTX ISA, "Shared Memory Matrix Layout", Swizzle<3,4,3>): a tile of R rows x C 16-bit
// columns is stored as C/64 column panels of R rows x 128 bytes, the 16-byte chunk c of row r at
// r * 128 + ((c ^ r) & 7) * 16, each panel 1024-byte aligned. One TMA box fills one panel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cudaTypedefs.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/kernel_utils.cuh"

namespace flashattn::cuda::sm90 {

// Compiled only in the sm_90a pass: wgmma and setmaxnreg do not exist elsewhere, and the kernels
// guard their bodies with this so that the sm_80 pass of the same translation unit compiles.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90_ENABLED 1
#endif

// ---- mbarriers (PTX ISA 9.7.13.15) --------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase with parity `parity` has completed. A fresh barrier counts the phase
// before its first as complete, so producers start waiting on "empty" barriers with parity 1.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA ------------------------------------------------------------------------------------------
// 4-d tile copy global -> shared (coordinates innermost first, in elements), completing `bytes`
// on `bar`. Elements outside the tensor's dims arrive as zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// 1-d bulk copy global -> shared of `bytes` (a multiple of 16, both addresses 16-byte aligned),
// completing on `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Bulk reduce-add shared -> global of `bytes` fp32 values (element-wise atomic with respect to
// other reductions), tracked by the issuing thread's bulk async-groups.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// 4-d tile copy shared -> global (the inverse of tma_load_4d), tracked by the issuing thread's bulk
// async-groups. Elements outside the tensor's dims are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the issuing thread's bulk groups are complete (their writes done, not only their reads).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Waits until the issuing thread's bulk groups but the newest kPending have finished reading
// shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Barrier `id` among `threads` threads that may reach it from different instructions (bar.sync is
// barrier.sync.aligned: every thread of the CTA at the same instruction, or undefined behaviour,
// which compute-sanitizer's synccheck reports as divergence).
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Named barrier `id` without waiting: counts `threads` toward the barrier (bar.arrive).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Byte offset of 16-byte chunk `chunk` (8 elements) of row `row` in a swizzled tile of kRows rows
// (the layout above): panel chunk / 8, row inside it, chunk XOR row within the row.
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_chunk(int row, int chunk) {
  return uint32_t((chunk >> 3) * kRows * 128 + row * 128 + (((chunk ^ row) & 7) << 4));
}

// A whole swizzled tile (sm90_utils.cuh's layout): kRows rows from `row` of (head, batch), all
// kPanels 64-column panels, one TMA box each, completing on `bar`.
// kPanelCols: elements per 128-byte panel row (64 of 16 bits, 128 of 8 bits).
template <int kPanels, int kRows, int kPanelCols = 64>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                              int batch) {
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn) tma_load_4d(dst + pn * kRows * 128, map, bar, pn * kPanelCols, row, head, batch);
}

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// stmatrix .x4: four 8 x 8 b16 matrices from the warp's mma-fragment registers (lane i holds row i / 4,
// columns 2·(i % 4) and + 1 of each), row r of matrix q written at the address lane 8q + r gives:
// one instruction for what takes four 4-byte stores.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// A flag between blocks (the backward's split tail): release store and acquire load at GPU scope.
__device__ __forceinline__ void st_release_gpu(int* ptr, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(ptr), "r"(value) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int* ptr) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

// Orders this thread's ordinary shared-memory writes before later async-proxy (wgmma, TMA) reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- warpgroup control ----------------------------------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Register split of the 384-thread warp-specialized kernels (one producer, two consumer
// warpgroups). Launched under __launch_bounds__(384, 1) every thread starts with 168 registers;
// setmaxnreg.inc blocks until the pool has the registers, so the producer must give back at least
// what the consumers take: 128 · (168 − 24) = 256 · (240 − 168). (A 32-register producer next to
// 240-register consumers left them waiting forever: a hang, seen on the H200. The persistent forward
// splits 32 / 232, which fits: fwd_traits.hpp.) scripts/gpu_check.sh build checks ptxas's
// report of every sm90 kernel for exactly kEntryRegs registers.
constexpr int kProducerRegs = 24, kConsumerRegs = 240, kEntryRegs = 168;
static_assert(128 * (kEntryRegs - kProducerRegs) >= 256 * (kConsumerRegs - kEntryRegs),
              "setmaxnreg: the consumers would wait for registers the producer never frees");

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// stmatrix .x4 .trans: as stmatrix_x4, each 8 x 8 matrix written transposed (row r at the address
// of lane 8q + r holds column r of the fragment).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- wgmma (PTX ISA 9.7.15) -----------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins a register between asynchronous wgmma regions: the compiler may not move reads or writes
// of `x` across this point (wgmma reads and writes its registers after the issuing instruction).
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address >> 4 in bits
// 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle mode in
// 62-63 (1 = 128-byte). For the 128-byte swizzle:
//   K-major (Q, K): SBO = 1024 (8 rows of 128 bytes); LBO unused (one k-step of 16 elements
//                   stays inside a row); the k-step within a panel adds 32 bytes to the start.
//   MN-major (V):   SBO = 1024 (8 key rows), LBO = distance between 64-column panels.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the same tile `bytes` further on (a multiple of 16): the start address is the
// low field, in 16-byte units, and shared-memory offsets stay below its 2^18-byte range. Built
// once per tile and advanced by a constant per k-step, a descriptor costs one add per wgmma; built
// from the address each time (make_desc) it cost ~13 instructions (mask, shift, or, moves to
// uniform registers), which at 32 wgmma per backward step was a third of the step's instructions.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  // The low word only (the start address never carries into the layout fields): a 32-bit add.
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

template <typename Elem, int N>
struct Wgmma;
#include "cuda/sm90_wgmma_ops.inc"

// ---- host: TMA tensor maps --------------------------------------------------------------------------
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
#else
    FA_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q));
#endif
    if (q != cudaDriverEntryPointSuccess || f == nullptr)
      throw Error("cuda: expected the driver to provide cuTensorMapEncodeTiled (CUDA >= 12), got none");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Whether a dimension of `extent` elements stepped by `stride` elements fits a TMA tensor map: one
// of a single element is never stepped through (make_tensor_map puts a valid stride in its place),
// the others need a stride in (0, 2^39) elements (strides are 40-bit byte counts; 2^40 bytes of
// 16 bits). api.cu asks it of q, k, v and dout; the forward launch of out.
inline bool tma_dim_fits(int64_t extent, int64_t stride) {
  return extent <= 1 || (stride > 0 && stride < (int64_t{1} << 39));
}

// A [batch, rows, heads, dim] tensor (strides in elements) as a 4-d TMA map with boxes of one
// 128-byte panel (64 columns of 16 bits, 128 of 8) x box_rows rows and the 128-byte swizzle. Strides of size-1 dims are never stepped
// through, so any valid value stands in for them (TMA wants multiples of 16 bytes).
template <typename Elem>
CUtensorMap make_tensor_map(const char* name, const void* ptr, int64_t dim, int64_t rows, int64_t heads,
                            int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                            int box_rows) {
  constexpr int64_t kBytes = sizeof(typename Elem::Storage);
  auto fix = [](int64_t n, int64_t stride) { return n > 1 ? stride : 16 / kBytes; };
  CUtensorMap map;
  const cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(fix(rows, row_stride) * kBytes),
                                 cuuint64_t(fix(heads, head_stride) * kBytes),
                                 cuuint64_t(fix(batch, batch_stride) * kBytes)};
  const cuuint32_t box[4] = {cuuint32_t(128 / kBytes), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<Elem, BF16>   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : std::is_same_v<Elem, F16> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult r = encode_tiled()(&map, type, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string(name) + ": cuTensorMapEncodeTiled refused the tensor (CUresult " + std::to_string(int(r)) +
                ") although the dispatch accepted its layout");
  return map;
}

}  // namespace flashattn::cuda::sm90
