// The single answer to "can this call run, and on which kernel?" (../shared/STYLE.md), and the entry points
// that act on it.
#include <cstdlib>
#include <string>

#include "common/backends.hpp"
#include "common/params.hpp"

namespace flashattn {

namespace {

// The CPU backend has no FP8 kernel: FlashAttention-3's FP8 forward is a Hopper (sm_90) feature.
// Refused here rather than in validate(), which accepts host e4m3 tensors so that the float64
// reference can read them.
std::string cpu_refusal(const detail::Params& p) {
  if (p.dtype == DType::e4m3) {
    return "q: expected a CUDA tensor for e4m3 (the FP8 forward runs only on the CUDA backend, sm_90), got a CPU tensor";
  }
  return "";
}

}  // namespace

Plan plan(const AttentionParams& params, Pass pass) {
  Plan result;
  try {
    const detail::Params p = detail::validate(params, pass);
    if (p.device == Device::cuda) return cuda::plan(p, pass);
    if (std::string reason = cpu_refusal(p); !reason.empty()) throw Error(reason);
    result.ok = true;
    result.kernel = cpu::kernel_name(p, pass);
  } catch (const Error& e) {
    result.ok = false;
    result.reason = e.what();
  }
  return result;
}

void forward(const AttentionParams& params) {
  const detail::Params p = detail::validate(params, Pass::forward);
  if (p.device == Device::cuda) {
    cuda::forward(p);  // makes plan()'s checks itself: a second pass would read cu_seqlens twice
  } else {
    if (std::string reason = cpu_refusal(p); !reason.empty()) throw Error(reason);
    cpu::forward(p);
  }
}

void backward(const AttentionParams& params) {
  const detail::Params p = detail::validate(params, Pass::backward);
  if (p.device == Device::cuda) {
    cuda::backward(p);  // makes plan()'s checks itself: a second pass would read cu_seqlens twice
  } else {
    cpu::backward(p);
  }
}

bool cuda_available() { return cuda::available(); }

const char* version() { return FLASHATTN_VERSION; }

}  // namespace flashattn
