// Issue rates of the instructions an online softmax is made of, per SM sub-partition (session 22,
// docs/perf-notes.md): each warp runs kIters x 8 independent ops, 1, 2 or 4 warps per
// sub-partition; cycles per warp instruction = clock64 cycles / (kIters * 8).
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -cudart static bench/gpu/instr_rates.cu -o instr_rates
// (no flashattn code; a device call runs the binary alone.)
#include <cstdint>
#include <cstdio>
#include <cstdlib>

constexpr int kIters = 4096;

#define CHECK(call)                                                                               \
  do {                                                                                            \
    const cudaError_t e = (call);                                                                 \
    if (e != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "instr_rates: %s: %s\n", #call, cudaGetErrorString(e));                \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

template <int OP>
__global__ void rate(float* out, long long* cyc, float seed) {
  float v[8];
  uint32_t u[8];
  for (int i = 0; i < 8; ++i) {
    v[i] = seed * (threadIdx.x + i) * 1e-3f - 3.f;
    u[i] = __float_as_uint(v[i]);
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // The conversions write a fresh register from a changing input, so that none is hoisted.
      if constexpr (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[i]));
      if constexpr (OP == 1) {
        asm volatile("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(u[i]) : "f"(v[i]));
        v[i] = __uint_as_float(u[i]);
      }
      if constexpr (OP == 2) {
        asm volatile("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(u[i]) : "f"(v[i]));
        v[i] = __uint_as_float(u[i]);
      }
      if constexpr (OP == 3) asm volatile("prmt.b32 %0, %0, %1, 0x7632;" : "+r"(u[i]) : "r"(u[(i + 3) & 7]));
      if constexpr (OP == 4) asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f3A000000;" : "+f"(v[i]));
      if constexpr (OP == 5) asm volatile("max.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(v[(i + 3) & 7]));
      if constexpr (OP == 6) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(u[i]));
      if constexpr (OP == 7) asm volatile("mul.f32 %0, %0, 0f3F7FFFFF;" : "+f"(v[i]));
    }
  }
  const long long t1 = clock64();
  float acc = 0.f;
  for (int i = 0; i < 8; ++i) acc += v[i] + __uint_as_float(u[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}

template <int OP>
void run(const char* name, int threads) {
  float* out;
  long long* cyc;
  CHECK(cudaMalloc(&out, 132 * 1024 * sizeof(float)));
  CHECK(cudaMalloc(&cyc, 132 * 32 * sizeof(long long)));
  for (int warmup = 0; warmup < 2; ++warmup) rate<OP><<<132, threads>>>(out, cyc, 1.f);
  CHECK(cudaGetLastError());
  long long h[32];
  CHECK(cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost));
  double slowest = 0;  // block 0's slowest warp
  for (int w = 0; w < threads / 32; ++w) slowest = h[w] > slowest ? h[w] : slowest;
  const double per_warp = slowest / (kIters * 8.0);
  std::printf("%-22s warps/SM %2d: %.2f cycles per warp-instruction per warp (%.2f per SMSP)\n", name, threads / 32,
              per_warp, per_warp / (threads / 32 / 4));
  CHECK(cudaFree(out));
  CHECK(cudaFree(cyc));
}

int main() {
  for (int threads : {128, 256, 512}) {
    run<0>("ex2.approx.f32", threads);
    run<1>("cvt.rn.bf16x2.f32", threads);
    run<2>("cvt.rn.f16x2.f32", threads);
    run<3>("prmt", threads);
    run<4>("ffma", threads);
    run<5>("fmax", threads);
    run<6>("ex2.approx.f16x2", threads);
    run<7>("fmul", threads);
  }
}
