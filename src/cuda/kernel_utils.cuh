// PTX helpers shared by the sm80 forward and backward kernels: tensor-core mma.sync m16n8k16 with
// fp32 accumulation, ldmatrix x4 (plain and transposed), cp.async 16-byte copies with zero-fill
// predication and their commit/wait groups, quad (4-lane) reductions, exp2 and fp32 -> f16/bf16
// packing. Every helper is a thin wrapper over one instruction so that the kernels read like the
// algorithm (FlashAttention-2, Dao 2023) and the SASS stays predictable.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = threadIdx.x % 32,
// g = lane / 4 (the "group"), t = lane % 4:
//   A (16x16, row-major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16x8, "col")       b0: (k 2t..2t+1, n g)                b1: (k 2t+8.., n g)
//   C/D (16x8, fp32)      c0,c1: (g, 2t..2t+1)                 c2,c3: (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "cuda/grid_order.hpp"

namespace flashattn::cuda {

// The kernels fold log2(e) into the softmax scale (one FFMA per score before exp2, FA-2 Sec. 3.1),
// so a scale above kMaxSoftmaxScale would make that product inf and every score NaN: api.cu refuses
// such a softmax_scale, and the FP8 forward treats such a descaled scale as bad descales.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kMaxSoftmaxScale = FLT_MAX / kLog2e;

// Programmatic dependent launch (CUDA programming guide, "Programmatic Dependent Launch and
// Synchronization"; PTX `griddepcontrol`, sm_90+). A grid launched with the programmatic
// stream-serialization attribute (launch_kernel(), cuda_check.hpp) may start its blocks before the
// grid ahead of it in the stream has finished: griddep_wait() blocks until that grid has completed
// and its writes are visible, so it must come before every read of what that grid writes and every
// write of what it reads. griddep_launch_dependents() lets the next such grid start its blocks once
// every block of this one has issued it or exited (the next grid's blocks then take the SMs this
// grid's last wave leaves free). Both are no-ops in a grid launched without the attribute and
// compile to nothing before sm_90.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// Element type tags: f16 and bf16 differ only in the mma opcode and the packing conversion.
struct F16 {
  using Storage = __half;
};
struct BF16 {
  using Storage = __nv_bfloat16;
};
// OCP float8 e4m3fn (FP8 forward only: q, k, v in it, out in bf16).
struct E4M3 {
  using Storage = uint8_t;
};

// The element type of out for inputs of type T: the same, but bf16 for e4m3 (FlashAttention-3's FP8
// forward writes bf16).
template <typename T>
struct OutElem {
  using type = T;
};
template <>
struct OutElem<E4M3> {
  using type = BF16;
};

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<F16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<BF16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Packs two floats into one register of two 16-bit values (lo = first), rounding to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<F16>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<BF16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Four floats as e4m3 (round to nearest even, saturating at ±448) in one register, b0 in the low byte.
__device__ __forceinline__ uint32_t pack4_e4m3(float b0, float b1, float b2, float b3) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(r)
      : "f"(b0), "f"(b1), "f"(b2), "f"(b3));
  return r;
}

// The two 16-bit values of one register (pack2's inverse, exact) as floats: lo in x, hi in y.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<F16>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

template <>
__device__ __forceinline__ float2 unpack2<BF16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global -> shared copy that bypasses L1 (.cg). When !pred the 16 bytes are zero-filled
// (src-size 0) and nothing is read, so out-of-range rows/columns become zeros without a branch;
// `src` must still be a valid address then (callers pass the tensor's base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Reductions over the 4 lanes of a quad (the lanes that share one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Sum over aligned groups of kLanes lanes (a power of two up to 32; xor offsets below kLanes stay
// inside the group). Every lane of the warp must take part: the shuffles name the full warp.
template <int kLanes>
__device__ __forceinline__ float lane_group_sum(float x) {
  static_assert(kLanes > 0 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32");
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// 2^x with the hardware approximation (ex2.approx.ftz: ~2 ulp, -inf -> +0), which is what the
// softmax needs once the scale and log2(e) are folded into one FFMA (FA-2 Sec. 3.1).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA pipe (FlashAttention-4's exponential emulation), for x <= 2^22: 2^x = 2^j · 2^f
// with j = floor(x) from one round-down add of 1.5 · 2^23 (whose low mantissa bits are then j), f =
// x − j in [0, 1), 2^f as 1 + f (c1 + f (c2 + f c3)) (fitted here for relative error, max 8.6e-5),
// and j added into the exponent field. x is clamped at −127, where the sum of the fields is +0
// exactly (so −inf gives 0, as ex2.approx does). A NaN x would come out of the integer add as a
// finite 3.4e38 (0x7FFFFFFF + 0x7FFFFFFF << 23): max.NaN keeps it in f, and the last FFMA (f · 0,
// +0 for every other x) puts it back into the result (CudaExp2Fma, CudaForwardMisc.NaNKeyGivesNaN).
__device__ __forceinline__ float exp2_fma(float x) {
  float xc, t;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(xc) : "f"(x), "f"(-127.f));
  asm("add.rm.f32 %0, %1, %2;\n" : "=f"(t) : "f"(xc), "f"(12582912.f));
  const float f = xc - (t - 12582912.f);
  const float pf = fmaf(fmaf(fmaf(0.07706641f, f, 0.22764570f), f, 0.69511664f), f, 1.f);
  return fmaf(f, 0.f, __int_as_float(__float_as_int(pf) + (__float_as_int(t) << 23)));
}

// Shared-memory tiles of rows x kCols 16-bit elements, stored as 16-byte chunks with the chunk
// index XORed by (row % 8): the 8 rows an ldmatrix phase reads at one logical chunk land in 8
// different 16-byte bank groups, and so do the cp.async stores of one row. Needs kCols >= 64.
template <int kCols>
__device__ __forceinline__ int swizzle_offset(int row, int chunk) {
  static_assert(kCols >= 64 && kCols % 64 == 0, "swizzle needs at least 8 chunks per row");
  return row * kCols + ((chunk ^ (row & 7)) << 3);
}

// The backward's block order (grid_order.hpp) read from this block's place in the launch order.
__device__ __forceinline__ PairTile grouped_block(int tail_pairs) {
  return grouped_block_at(int64_t(blockIdx.y) * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, tail_pairs);
}

}  // namespace flashattn::cuda
