// Issue rates of the instructions an online softmax is made of, per SM sub-partition (session 22,
// docs/perf-notes.md): each warp runs kIters x 8 independent ops, 1, 2 or 4 warps per
// sub-partition; cycles per warp instruction = clock64 cycles / (kIters * 8).
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -cudart static bench/gpu/instr_rates.cu -o instr_rates
// (no flashattn code; a device call runs the binary alone.)
#include <cstdio>
#include <cstdint>
constexpr int kIters = 4096;
template <int OP>
__global__ void tp(float* out, long long* cyc, float seed) {
  float v[8];
  uint32_t u[8];
  for (int i = 0; i < 8; ++i) { v[i] = seed * (threadIdx.x + i) * 1e-3f - 3.f; u[i] = __float_as_uint(v[i]); }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[i]));
      if constexpr (OP == 1) { asm volatile("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(u[i]) : "f"(v[i])); v[i] = __uint_as_float(u[i]); }
      if constexpr (OP == 2) { asm volatile("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(u[i]) : "f"(v[i])); v[i] = __uint_as_float(u[i]); }
      if constexpr (OP == 3) asm volatile("prmt.b32 %0, %0, %1, 0x7632;" : "+r"(u[i]) : "r"(u[(i + 3) & 7]));
      if constexpr (OP == 4) asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f3A000000;" : "+f"(v[i]));
      if constexpr (OP == 5) asm volatile("max.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(v[(i + 3) & 7]));
      if constexpr (OP == 6) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(u[i]));
      if constexpr (OP == 7) asm volatile("mul.f32 %0, %0, 0f3F7FFFFF;" : "+f"(v[i]));
    }
  }
  long long t1 = clock64();
  float acc = 0.f;
  for (int i = 0; i < 8; ++i) acc += v[i] + __uint_as_float(u[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
template <int OP>
void run(const char* name, int threads) {
  float* out;
  long long* cyc;
  cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 32 * 8);
  tp<OP><<<132, threads>>>(out, cyc, 1.f);
  tp<OP><<<132, threads>>>(out, cyc, 1.f);
  long long h[32];
  cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
  double mx = 0; for (int w = 0; w < threads / 32; ++w) mx = h[w] > mx ? h[w] : mx;
  printf("%-22s warps/SM %2d: %.2f cycles per warp-instruction per warp (%.2f per SMSP)\n", name, threads / 32,
         mx / (kIters * 8.0), mx / (kIters * 8.0) / (threads / 32 / 4));
  cudaFree(out); cudaFree(cyc);
}
int main() {
  for (int t : {128, 256, 512}) {
    run<0>("ex2.approx.f32", t); run<1>("cvt.rn.bf16x2.f32", t); run<2>("cvt.rn.f16x2.f32", t);
    run<3>("prmt", t); run<4>("ffma", t); run<5>("fmax", t); run<6>("ex2.approx.f16x2", t); run<7>("fmul", t);
  }
  cudaError_t e = cudaGetLastError(); printf("%s\n", cudaGetErrorString(e));
}
