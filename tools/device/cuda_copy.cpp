#include "device/cuda_copy.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::cli::cuda_copy {

namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("--device cuda: ") + what + ": " + cudaGetErrorString(status));
}
}  // namespace

void* allocate(std::size_t bytes) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  check(cudaMalloc(&ptr, bytes), "cudaMalloc");
  return ptr;
}

void release(void* ptr) noexcept {
  if (ptr) cudaFree(ptr);
}

void to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to the GPU");
}

void to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy from the GPU");
}

void synchronize() { check(cudaDeviceSynchronize(), "kernel"); }

}  // namespace flashattn::cli::cuda_copy
