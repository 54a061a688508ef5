// The single answer to "can this call run, and on which kernel?" (../shared/STYLE.md), and the entry points
// that act on it.
#include <cstdlib>

#include "common/backends.hpp"
#include "common/params.hpp"

namespace flashattn {

Plan plan(const AttentionParams& params, Pass pass) {
  Plan result;
  try {
    const detail::Params p = detail::validate(params, pass);
    if (p.device == Device::cuda) return cuda::plan(p, pass);
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
