// The CUDA backend's stand-in for builds without CUDA: every call says why it cannot run.
#include "common/backends.hpp"

namespace flashattn::cuda {

namespace {
constexpr const char* kReason =
    "device: expected a build with the CUDA backend (configure with -DFLASHATTN_CUDA=ON), got a CPU-only build";
}

bool available() { return false; }
Plan plan(const detail::Params&, Pass) { return Plan{false, "", kReason}; }
void forward(const detail::Params&) { throw Error(kReason); }
void backward(const detail::Params&) { throw Error(kReason); }

}  // namespace flashattn::cuda
