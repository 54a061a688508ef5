// CUDA runtime errors -> flashattn::Error carrying CUDA's own message and the failing call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(std::string("cuda: ") + what + " failed: " + cudaGetErrorName(err) + ": " +
              cudaGetErrorString(err) + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace flashattn::cuda

// Evaluates a cudaError_t expression once and throws flashattn::Error unless it is cudaSuccess.
#define FA_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    const cudaError_t fa_cuda_err_ = (expr);                                             \
    if (fa_cuda_err_ != cudaSuccess)                                                     \
      ::flashattn::cuda::throw_cuda_error(fa_cuda_err_, #expr, __FILE__, __LINE__);      \
  } while (0)
