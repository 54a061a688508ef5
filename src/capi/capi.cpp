// The C API: converts fa_params to flashattn::AttentionParams and exceptions to status codes.
#include "flashattn/flashattn.h"

#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "flashattn/flashattn.hpp"

namespace {

thread_local std::string g_last_error;

flashattn::TensorView to_view(const fa_tensor& t) {
  flashattn::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<flashattn::DType>(t.dtype);
  v.device = static_cast<flashattn::Device>(t.device);
  v.device_index = t.device_index;
  v.ndim = t.ndim;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

flashattn::AttentionParams to_params(const fa_params& c) {
  flashattn::AttentionParams p;
  p.q = to_view(c.q);
  p.k = to_view(c.k);
  p.v = to_view(c.v);
  p.out = to_view(c.out);
  p.lse = to_view(c.lse);
  p.dout = to_view(c.dout);
  p.dq = to_view(c.dq);
  p.dk = to_view(c.dk);
  p.dv = to_view(c.dv);
  p.cu_seqlens_q = to_view(c.cu_seqlens_q);
  p.cu_seqlens_k = to_view(c.cu_seqlens_k);
  p.max_seqlen_q = c.max_seqlen_q;
  p.max_seqlen_k = c.max_seqlen_k;
  p.softmax_scale = c.softmax_scale;
  p.causal = c.causal != 0;
  p.causal_align = static_cast<flashattn::CausalAlign>(c.causal_align);
  p.window_size_left = c.window_size_left;
  p.window_size_right = c.window_size_right;
  p.softcap = c.softcap;
  p.alibi_slopes = to_view(c.alibi_slopes);
  p.deterministic = c.deterministic != 0;
  p.num_threads = c.num_threads;
  p.stream = c.stream;
  p.q_descale = to_view(c.q_descale);
  p.k_descale = to_view(c.k_descale);
  p.v_descale = to_view(c.v_descale);
  return p;
}

// Enum fields arrive as raw integers from other languages: reject values outside the enums before
// they are cast, so validation messages stay meaningful. Only the tensors the pass reads or writes
// are checked: the forward ignores dout, dq, dk and dv (as the C++ API does), so garbage left in
// them must not fail it.
void check_enums(const fa_params& c, flashattn::Pass pass) {
  struct Named {
    const char* name;
    const fa_tensor* tensor;
    bool backward_only;
    bool may_be_scalar;  // ndim 0 with data is one value (the descales), not "not given"
  };
  const Named tensors[] = {{"q", &c.q, false, false},
                           {"k", &c.k, false, false},
                           {"v", &c.v, false, false},
                           {"out", &c.out, false, false},
                           {"lse", &c.lse, false, false},
                           {"dout", &c.dout, true, false},
                           {"dq", &c.dq, true, false},
                           {"dk", &c.dk, true, false},
                           {"dv", &c.dv, true, false},
                           {"cu_seqlens_q", &c.cu_seqlens_q, false, false},
                           {"cu_seqlens_k", &c.cu_seqlens_k, false, false},
                           {"alibi_slopes", &c.alibi_slopes, false, false},
                           {"q_descale", &c.q_descale, false, true},
                           {"k_descale", &c.k_descale, false, true},
                           {"v_descale", &c.v_descale, false, true}};
  for (const Named& n : tensors) {
    const fa_tensor& t = *n.tensor;
    const bool given = t.ndim != 0 || (n.may_be_scalar && t.data != nullptr);
    if (!given || (n.backward_only && pass != flashattn::Pass::backward)) continue;
    if (t.dtype < FA_DTYPE_F32 || t.dtype > FA_DTYPE_E4M3)
      throw flashattn::Error(std::string(n.name) + ": expected dtype code 0..4, got " + std::to_string(t.dtype));
    if (t.device != FA_DEVICE_CPU && t.device != FA_DEVICE_CUDA)
      throw flashattn::Error(std::string(n.name) + ": expected device code 0 (cpu) or 1 (cuda), got " +
                             std::to_string(t.device));
  }
  // The flags are documented as 0 or 1; anything else is more likely stale memory than "true".
  for (const auto& [name, value] : {std::pair<const char*, int32_t>{"causal", c.causal},
                                    std::pair<const char*, int32_t>{"deterministic", c.deterministic}})
    if (value != 0 && value != 1)
      throw flashattn::Error(std::string(name) + ": expected 0 or 1, got " + std::to_string(value));
  if (c.causal_align != FA_ALIGN_BOTTOM_RIGHT && c.causal_align != FA_ALIGN_TOP_LEFT)
    throw flashattn::Error("causal_align: expected 0 (bottom_right) or 1 (top_left), got " +
                           std::to_string(c.causal_align));
}

template <class F>
int guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return FA_STATUS_OK;
  } catch (const flashattn::CudaError& e) {
    g_last_error = e.what();
    return FA_STATUS_CUDA;
  } catch (const flashattn::Error& e) {
    g_last_error = e.what();
    return FA_STATUS_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return FA_STATUS_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return FA_STATUS_INTERNAL;
  }
}

}  // namespace

extern "C" {

void fa_params_init(fa_params* params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->window_size_left = -1;
  params->window_size_right = -1;
}

int fa_forward(const fa_params* params) {
  return guarded([&] {
    if (!params) throw flashattn::Error("params: expected a non-null fa_params*, got NULL");
    check_enums(*params, flashattn::Pass::forward);
    flashattn::forward(to_params(*params));
  });
}

int fa_backward(const fa_params* params) {
  return guarded([&] {
    if (!params) throw flashattn::Error("params: expected a non-null fa_params*, got NULL");
    check_enums(*params, flashattn::Pass::backward);
    flashattn::backward(to_params(*params));
  });
}

int fa_plan(const fa_params* params, int32_t pass, char* kernel, int32_t kernel_len) {
  int ok = 0;
  const int status = guarded([&] {
    if (!params) throw flashattn::Error("params: expected a non-null fa_params*, got NULL");
    if (pass != 0 && pass != 1) throw flashattn::Error("pass: expected 0 (forward) or 1 (backward), got " + std::to_string(pass));
    check_enums(*params, static_cast<flashattn::Pass>(pass));
    const flashattn::Plan pl = flashattn::plan(to_params(*params), static_cast<flashattn::Pass>(pass));
    if (!pl.ok) throw flashattn::Error(pl.reason);
    if (kernel && kernel_len > 0) {
      std::strncpy(kernel, pl.kernel.c_str(), static_cast<size_t>(kernel_len) - 1);
      kernel[kernel_len - 1] = '\0';
    }
    ok = 1;
  });
  return status == FA_STATUS_OK ? ok : 0;
}

const char* fa_last_error(void) { return g_last_error.c_str(); }
int fa_cuda_available(void) { return flashattn::cuda_available() ? 1 : 0; }
const char* fa_version(void) { return flashattn::version(); }
int64_t fa_params_size(void) { return static_cast<int64_t>(sizeof(fa_params)); }

}  // extern "C"
