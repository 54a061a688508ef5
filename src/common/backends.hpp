// The interface every backend implements over validated Params. dispatch.cpp is the only caller.
#pragma once

#include <string>

#include "common/params.hpp"

namespace flashattn::cpu {
// Name of the kernel that runs `pass` for p (the CPU backend supports every validated call).
std::string kernel_name(const detail::Params& p, Pass pass);
void forward(const detail::Params& p);
void backward(const detail::Params& p);
}  // namespace flashattn::cpu

namespace flashattn::cuda {
// Built into every library: when FLASHATTN_WITH_CUDA is off, plan() says so and the rest throw.
bool available();
// ok = false with a reason naming the argument for calls the CUDA kernels don't cover.
Plan plan(const detail::Params& p, Pass pass);
void forward(const detail::Params& p);
void backward(const detail::Params& p);
}  // namespace flashattn::cuda
