// The CLI's only use of the CUDA runtime: device buffers for --device cuda. Compiled only when
// FLASHATTN_WITH_CUDA (tools/CMakeLists.txt); callers guard their use with the same macro.
#pragma once

#include <cstddef>

namespace flashattn::cli::cuda_copy {

void* allocate(std::size_t bytes);  // throws flashattn::Error carrying CUDA's message
void release(void* ptr) noexcept;
void to_device(void* dst, const void* src, std::size_t bytes);
void to_host(void* dst, const void* src, std::size_t bytes);
void synchronize();  // waits for the default stream; throws on a pending kernel error

}  // namespace flashattn::cli::cuda_copy
