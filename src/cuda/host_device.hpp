// FLASHATTN_HOST_DEVICE: helpers that the kernels call and that the CPU-run tests check on the
// host (grid_order.hpp, fwd_traits.hpp) are compiled for both sides under nvcc.
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__
#else
#define FLASHATTN_HOST_DEVICE
#endif
