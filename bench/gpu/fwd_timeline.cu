// Diagnostic: where a Hopper forward tile's time goes. Builds the sm90 forward kernel with
// FLASHATTN_FWD_TRACE (clock64() at chosen points of each warpgroup's tiles, fwd_sm90_tma_wgmma.cuh)
// and without it, times both on one shape, and writes the trace of one launch for
// bench/gpu/fwd_timeline.py to read. Not part of the library or its tests.
//
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -cudart static \
//        -Iinclude -Isrc -DFLASHATTN_FWD_TRACE bench/gpu/fwd_timeline.cu -o fwd_timeline_trace
//   ./fwd_timeline_trace batch seqlen heads head_dim causal out.bin   (bf16, q/k/v [b, s, h, d])
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "cuda/fwd_sm90_tma_wgmma.cuh"

using namespace flashattn::cuda;

namespace {

int run(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s batch seqlen heads head_dim(64|128) causal(0|1) [trace.bin]\n", argv[0]);
    return 2;
  }
  const int b = std::atoi(argv[1]), s = std::atoi(argv[2]), h = std::atoi(argv[3]), d = std::atoi(argv[4]);
  const bool causal = std::atoi(argv[5]) != 0;
  const size_t n = size_t(b) * s * h * d;
  std::vector<__nv_bfloat16> host(n);
  uint32_t x = 12345u;
  for (auto& e : host) {
    x = x * 1664525u + 1013904223u;
    e = __float2bfloat16(float(int(x >> 9) % 2001 - 1000) / 1000.f);
  }
  void *q, *k, *v, *o;
  float* lse;
  FA_CUDA_CHECK(cudaMalloc(&q, n * 2));
  FA_CUDA_CHECK(cudaMalloc(&k, n * 2));
  FA_CUDA_CHECK(cudaMalloc(&v, n * 2));
  FA_CUDA_CHECK(cudaMalloc(&o, n * 2));
  FA_CUDA_CHECK(cudaMalloc(&lse, size_t(b) * h * s * 4));
  FA_CUDA_CHECK(cudaMemcpy(q, host.data(), n * 2, cudaMemcpyHostToDevice));
  FA_CUDA_CHECK(cudaMemcpy(k, host.data(), n * 2, cudaMemcpyHostToDevice));
  FA_CUDA_CHECK(cudaMemcpy(v, host.data(), n * 2, cudaMemcpyHostToDevice));

  FwdParams p{};
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
  const int64_t row = int64_t(h) * d, batch = int64_t(s) * row;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.lse_batch_stride = int64_t(h) * s, p.lse_head_stride = s, p.lse_row_stride = 1;
  p.seqlen_q = p.seqlen_k = s;
  p.num_heads = h, p.head_ratio = 1;
  p.head_dim = p.head_dim_v = d;
  p.softmax_scale = 1.f / std::sqrt(float(d));
  p.window_size_left = -1;
  p.window_size_right = causal ? 0 : -1;
  p.align_bottom_right = true;

  auto launch = [&] {
    if (d == 64)
      launch_fwd_sm90<BF16, 64>(p, b, s, s, s, nullptr);
    else
      launch_fwd_sm90<BF16, 128>(p, b, s, s, s, nullptr);
  };
  for (int i = 0; i < 20; ++i) launch();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  FA_CUDA_CHECK(cudaEventCreate(&e0));
  FA_CUDA_CHECK(cudaEventCreate(&e1));
  constexpr int kIters = 50;
  FA_CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < kIters; ++i) launch();
  FA_CUDA_CHECK(cudaEventRecord(e1));
  FA_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0.f;
  FA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = 1000.0 * ms / kIters;
  const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  std::printf("b%d s%d h%d d%d causal %d: %.1f us per call, %.0f TFLOP/s\n", b, s, h, d, int(causal), us,
              flops / us * 1e-6);
#ifdef FLASHATTN_FWD_TRACE
  if (argc > 6) {
    void* sym = nullptr;
    FA_CUDA_CHECK(cudaGetSymbolAddress(&sym, g_fwd_trace));
    FA_CUDA_CHECK(cudaMemset(sym, 0, sizeof(g_fwd_trace)));
    launch();
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<long long> trace(sizeof(g_fwd_trace) / sizeof(long long));
    FA_CUDA_CHECK(cudaMemcpy(trace.data(), sym, sizeof(g_fwd_trace), cudaMemcpyDeviceToHost));
    FILE* f = std::fopen(argv[6], "wb");
    if (f == nullptr || std::fwrite(trace.data(), sizeof(long long), trace.size(), f) != trace.size()) {
      std::fprintf(stderr, "fwd_timeline: cannot write the trace to %s\n", argv[6]);
      if (f != nullptr) std::fclose(f);
      return 1;
    }
    std::fclose(f);
    std::printf("trace [%d blocks][%d roles][%d tiles][%d events] -> %s\n", kTraceBlocks, kTraceRoles, kTraceTiles,
                kTraceEvents, argv[6]);
  }
#endif
  return 0;
}

}  // namespace

// CUDA and launch errors arrive as flashattn::Error (FA_CUDA_CHECK, the launch's own checks).
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fwd_timeline: %s\n", e.what());
    return 1;
  }
}
