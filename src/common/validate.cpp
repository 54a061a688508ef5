// validate(): the one place that turns public AttentionParams into trusted detail::Params, or says
// why it cannot. Every message names the argument, what was expected and what came, so that
// plan(), the CLI and the bindings can show it unchanged. Nothing here writes to any tensor.
#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "common/params.hpp"

namespace flashattn::detail {

namespace {


[[noreturn]] void fail(const std::string& message) { throw Error(message); }

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << '[';
  for (int32_t d = 0; d < t.ndim && d < 4; ++d) os << (d ? ", " : "") << t.shape[d];
  os << ']';
  return os.str();
}

// Shortest text that reads back as the same float ("1e-45", "0.125", "-inf"): std::to_string
// would print a denormal as "0.000000" and hide what came.
std::string float_str(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

const char* device_name(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown";
}

std::string device_str(const TensorView& t) {
  return std::string(device_name(t.device)) + ":" + std::to_string(t.device_index);
}

bool valid_dtype(DType d) {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::i32 || d == DType::e4m3;
}

// Checks that hold for every given tensor on its own: rank, dtype and device enums, non-negative
// sizes, last dimension contiguous, non-negative strides, data present, and that the largest
// element offset (and its byte offset) reachable through shape and strides fits in int64, so that
// no backend's index arithmetic can overflow.
void check_tensor(const char* name, const TensorView& t, int32_t expected_ndim, const char* layout) {
  if (t.ndim != expected_ndim) {
    fail(std::string(name) + ": expected rank " + std::to_string(expected_ndim) + " " + layout + ", got rank " +
         std::to_string(t.ndim));
  }
  if (!valid_dtype(t.dtype)) {
    fail(std::string(name) + ": expected a dtype among fp32, fp16, bf16, int32, e4m3, got enum value " +
         std::to_string(static_cast<int32_t>(t.dtype)));
  }
  if (t.device != Device::cpu && t.device != Device::cuda) {
    fail(std::string(name) + ": expected device cpu or cuda, got enum value " +
         std::to_string(static_cast<int32_t>(t.device)));
  }
  if (t.device_index < 0) {
    fail(std::string(name) + ": expected device_index >= 0, got " + std::to_string(t.device_index));
  }
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) {
      fail(std::string(name) + ": expected shape[" + std::to_string(d) + "] >= 0, got " + std::to_string(t.shape[d]));
    }
  }
  const int32_t last = t.ndim - 1;
  // A size-1 last dimension is never stepped through, and an empty tensor addresses nothing, so
  // their last stride does not matter (PyTorch leaves arbitrary strides on size-1 dims, and hands
  // back expanded stride-0 gradients of empty outputs).
  bool empty = false;
  for (int32_t d = 0; d < t.ndim; ++d) empty |= t.shape[d] == 0;
  if (t.shape[last] > 1 && t.stride[last] != 1 && !empty) {
    fail(std::string(name) + ": expected stride[" + std::to_string(last) +
         "] = 1 (last dimension contiguous), got " + std::to_string(t.stride[last]));
  }
  for (int32_t d = 0; d < last; ++d) {
    if (t.stride[d] < 0) {
      fail(std::string(name) + ": expected stride[" + std::to_string(d) + "] >= 0, got " +
           std::to_string(t.stride[d]));
    }
  }
  int64_t numel = 1;
  int64_t max_offset = 0;
  bool overflow = false;
  for (int32_t d = 0; d < t.ndim; ++d) {
    overflow |= __builtin_mul_overflow(numel, t.shape[d], &numel);
    if (t.shape[d] > 1 && d != last) {
      int64_t span = 0;
      overflow |= __builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &span);
      overflow |= __builtin_add_overflow(max_offset, span, &max_offset);
    } else if (t.shape[d] > 1) {
      overflow |= __builtin_add_overflow(max_offset, t.shape[d] - 1, &max_offset);
    }
  }
  int64_t max_byte = 0;
  if (!overflow) {
    overflow |= __builtin_add_overflow(max_offset, int64_t{1}, &max_byte);
    overflow |= __builtin_mul_overflow(max_byte, static_cast<int64_t>(dtype_size(t.dtype)), &max_byte);
  }
  if (overflow) {
    fail(std::string(name) + ": expected shape " + shape_str(t) +
         " and strides to address at most 2^63 - 1 bytes, got an element offset that overflows int64");
  }
  if (numel > 0 && t.data == nullptr) {
    fail(std::string(name) + ": expected a data pointer for shape " + shape_str(t) + ", got nullptr");
  }
  // Every backend loads whole elements (and the CUDA one wider vectors, checked there): a pointer
  // off its element size is undefined behaviour on the CPU and a misaligned-address fault, which
  // leaves the CUDA context unusable, on the GPU.
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  if (numel > 0 && address % dtype_size(t.dtype) != 0) {
    fail(std::string(name) + ": expected a data pointer aligned to " + std::to_string(dtype_size(t.dtype)) +
         " bytes (the " + dtype_name(t.dtype) + " element size), got address " + std::to_string(address));
  }
}

void check_dtype(const char* name, const TensorView& t, DType expected, const char* why) {
  if (t.dtype != expected) {
    fail(std::string(name) + ": expected dtype " + dtype_name(expected) + " (" + why + "), got " +
         dtype_name(t.dtype));
  }
}

void check_dim(const char* name, const TensorView& t, int32_t d, const char* what, int64_t expected,
               const char* from) {
  if (t.shape[d] != expected) {
    fail(std::string(name) + ": expected shape[" + std::to_string(d) + "] (" + what + ") = " +
         std::to_string(expected) + " (" + from + "), got " + std::to_string(t.shape[d]) + " in shape " +
         shape_str(t));
  }
}

// Reads a host int32 cu_seqlens array and checks it is a valid prefix sum ending at `total`;
// returns the longest sequence.
int64_t check_cu_seqlens(const char* name, const TensorView& t, int64_t batch, int64_t total,
                         const char* total_what) {
  // Contiguous: check_tensor() requires stride 1 on the only (last) dimension when it has > 1 element.
  int64_t longest = 0, longest_at = 0;
  const std::string error =
      cu_seqlens_error(name, static_cast<const int32_t*>(t.data), batch, total, total_what, longest, longest_at);
  if (!error.empty()) fail(error);
  return longest;
}

// Byte range [lo, hi) that a view can touch; empty for a tensor with no elements. check_tensor()
// has already proven that the arithmetic fits in int64.
struct Extent {
  uintptr_t lo = 0, hi = 0;
};

// (A size-1 dim adds nothing whatever its stride; check_tensor() made a longer last dim's stride 1,
// and the FP8 descales may have any non-negative last stride.)
Extent extent(const TensorView& t) {
  Extent e;
  if (!t.defined() || t.numel() == 0) return e;
  int64_t max_offset = 0;
  for (int32_t d = 0; d < t.ndim; ++d) max_offset += (t.shape[d] - 1) * t.stride[d];
  e.lo = reinterpret_cast<uintptr_t>(t.data);
  e.hi = e.lo + static_cast<uintptr_t>(max_offset + 1) * dtype_size(t.dtype);
  return e;
}

// An output whose memory overlaps an input's would be read after being written (the backends
// stream through their inputs while writing).
void check_disjoint(const char* out_name, const Extent& a, const char* in_name, const Extent& b) {
  if (a.lo == a.hi || b.lo == b.hi) return;
  if (a.lo < b.hi && b.lo < a.hi) {
    fail(std::string(out_name) + ": expected memory disjoint from " + in_name +
         " (an output must not alias an input), got overlapping byte ranges");
  }
}

void check_no_alias(const char* out_name, const TensorView& out, const char* in_name, const TensorView& in) {
  check_disjoint(out_name, extent(out), in_name, extent(in));
}

// An output written through strides that reach one element from two indices would be written
// twice, by different threads/blocks in any order (a race, and results that depend on it). The
// usual test (PyTorch's "non-overlapping and dense" without the dense part): order the dims of
// size > 1 by stride; each stride must reach past everything the smaller-stride dims span. That is
// sufficient, not necessary (shape [2, 3] with strides [2, 3] never meets itself), so the message
// asks for nested strides rather than claiming an overlap.
// Ties are ordered by dim index so that the message blames the same dim every time.
void check_no_self_overlap(const char* name, const TensorView& t) {
  if (!t.defined() || t.numel() == 0) return;
  int32_t dims[4];
  int32_t n = 0;
  for (int32_t d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) dims[n++] = d;
  std::sort(dims, dims + n, [&](int32_t x, int32_t y) {
    return t.stride[x] != t.stride[y] ? t.stride[x] < t.stride[y] : x > y;
  });
  int64_t span = 1;  // elements spanned by the dims already visited (saturates: check_tensor bounds the rest)
  for (int32_t i = 0; i < n; ++i) {
    const int32_t d = dims[i];
    if (t.stride[d] < span) {
      std::string got = "stride[" + std::to_string(d) + "] = " + std::to_string(t.stride[d]) + " for shape[" +
                        std::to_string(d) + "] = " + std::to_string(t.shape[d]);
      if (t.stride[d] > 0) {
        got += ", inside the " + std::to_string(span) + " elements spanned by the dims with smaller strides";
      }
      fail(std::string(name) +
           ": expected nested strides, each at least the span of the dims with smaller strides (so that each "
           "element is written once), got " +
           got + " in shape " + shape_str(t));
    }
    if (__builtin_mul_overflow(t.stride[d], t.shape[d], &span)) span = INT64_MAX;
  }
}

// Two outputs that share elements would be written twice. Outputs may share a buffer (dq, dk, dv
// as interleaved views of one packed [batch, seqlen, 3, num_heads, head_dim] dqkv tensor: their
// byte ranges overlap, their elements do not), so byte ranges alone cannot decide; the element
// sets are compared exactly (views_share_element). The two common mistakes get messages of their
// own: the same data pointer, and one output starting inside the other's first row.
void check_distinct_outputs(const char* name, const TensorView& t, const char* other_name, const TensorView& other) {
  if (!t.defined() || !other.defined() || t.numel() == 0 || other.numel() == 0) return;
  if (t.data == other.data) {
    fail(std::string(name) + ": expected memory disjoint from " + other_name +
         " (each output written once), got the same data pointer");
  }
  auto starts_inside_first_row = [](const TensorView& a, const TensorView& b) {
    const auto lo = reinterpret_cast<std::uintptr_t>(a.data), start = reinterpret_cast<std::uintptr_t>(b.data);
    const auto row_bytes = static_cast<std::uintptr_t>(a.shape[a.ndim - 1]) * dtype_size(a.dtype);
    return start > lo && start - lo < row_bytes;
  };
  const bool t_in_other = starts_inside_first_row(other, t);
  if (t_in_other || starts_inside_first_row(t, other)) {
    const auto a = reinterpret_cast<std::uintptr_t>(t.data), b = reinterpret_cast<std::uintptr_t>(other.data);
    fail(std::string(name) + ": expected memory disjoint from " + other_name +
         " (each output written once), got a data pointer " + std::to_string(t_in_other ? a - b : b - a) +
         " bytes " + (t_in_other ? "after " : "before ") + other_name + "'s, inside the first row of " +
         (t_in_other ? std::string(other_name) : std::string(name)));
  }
  const Extent a = extent(t), b = extent(other);
  if (!(a.lo < b.hi && b.lo < a.hi)) return;  // disjoint byte ranges
  const std::string where =
      std::string(name) + " starts " +
      std::to_string(reinterpret_cast<std::intptr_t>(t.data) - reinterpret_cast<std::intptr_t>(other.data)) +
      " bytes from " + other_name;
  const SharedElements shared = t.dtype == other.dtype ? views_share_element(t, other) : SharedElements::unknown;
  if (shared == SharedElements::yes) {
    fail(std::string(name) + ": expected memory disjoint from " + other_name +
         " (each output written once), got views that share elements (" + where + ")");
  }
  if (shared == SharedElements::unknown) {
    fail(std::string(name) + ": expected memory disjoint from " + other_name +
         " (each output written once), got overlapping byte ranges with strides too unrelated to prove their "
         "elements distinct (" + where + "); pass each output in its own buffer or as views of one packed tensor");
  }
}

// A dequantization factor of the FP8 forward (q_descale, k_descale, v_descale; FlashAttention-3
// Sec. 3.3): given when it has data or a rank (rank 0 with data is one value, unlike the other
// tensors, where ndim 0 means "not given"). float32 on q's device, rank 0, rank 1 of size 1 (per
// tensor) or [batch, num_heads_k] with any non-negative strides (0 broadcasts), as FA-3 takes them.
bool descale_given(const TensorView& t) { return t.ndim != 0 || t.data != nullptr; }

void check_descale(const char* name, const TensorView& t, const TensorView& q, int64_t batch, int64_t num_heads_k) {
  if (!descale_given(t)) return;
  if (q.dtype != DType::e4m3) {
    fail(std::string(name) + ": expected none (descales apply to e4m3 inputs only, FlashAttention-3's FP8 "
         "forward), got a tensor with q in " + dtype_name(q.dtype));
  }
  if (t.ndim < 0 || t.ndim > 2 || (t.ndim == 1 && t.shape[0] != 1)) {
    const std::string got = t.ndim < 0 || t.ndim > 4 ? "ndim " + std::to_string(t.ndim) : "shape " + shape_str(t);
    fail(std::string(name) + ": expected one value (rank 0, or shape [1]) or shape [batch, num_heads_k] = [" +
         std::to_string(batch) + ", " + std::to_string(num_heads_k) + "], got " + got);
  }
  check_dtype(name, t, DType::f32, "float32 dequantization factors");
  if (t.device != q.device || t.device_index != q.device_index) {
    fail(std::string(name) + ": expected device " + device_str(q) + " (same as q), got " +
         (t.device == Device::cpu || t.device == Device::cuda ? device_str(t)
                                                            : "enum value " + std::to_string(static_cast<int32_t>(t.device))));
  }
  if (t.ndim == 2) {
    check_dim(name, t, 0, "batch", batch, "from q");
    check_dim(name, t, 1, "num_heads_k", num_heads_k, "from k");
  }
  int64_t max_offset = 0;
  bool overflow = false;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1) continue;
    if (t.stride[d] < 0) {
      fail(std::string(name) + ": expected stride[" + std::to_string(d) + "] >= 0 (0 broadcasts), got " +
           std::to_string(t.stride[d]));
    }
    int64_t span = 0;
    overflow |= __builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &span);
    overflow |= __builtin_add_overflow(max_offset, span, &max_offset);
  }
  if (overflow || max_offset > INT64_MAX / 4 - 1) {
    fail(std::string(name) + ": expected shape " + shape_str(t) +
         " and strides to address at most 2^63 - 1 bytes, got an element offset that overflows int64");
  }
  const bool empty = t.ndim == 2 && (t.shape[0] == 0 || t.shape[1] == 0);
  if (!empty && t.data == nullptr) {
    fail(std::string(name) + ": expected a data pointer for shape " + shape_str(t) + ", got nullptr");
  }
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  if (!empty && address % 4 != 0) {
    fail(std::string(name) + ": expected a data pointer aligned to 4 bytes (the fp32 element size), got address " +
         std::to_string(address));
  }
}

// Byte range of a checked descale: extent()'s, and one float for rank 0 with data (one value).
Extent descale_extent(const TensorView& t) {
  if (t.ndim != 0 || t.data == nullptr) return extent(t);
  const auto lo = reinterpret_cast<uintptr_t>(t.data);
  return {lo, lo + sizeof(float)};
}

void check_max_seqlen(const char* name, int64_t hint, int64_t real_max) {
  if (hint < 0) fail(std::string(name) + ": expected >= 0 (0 = derive), got " + std::to_string(hint));
  if (hint > 0 && hint < real_max) {
    fail(std::string(name) + ": expected 0 or >= the longest sequence (" + std::to_string(real_max) + "), got " +
         std::to_string(hint));
  }
}

}  // namespace

// Whether two views of one element size share an element, decided exactly: with element offsets
// x = Σ i_d·t.stride[d] and y = Σ j_d·other.stride[d], some x − y must put the two elements' bytes
// over each other, i.e. x − y = m for the one or two m with |data_t − data_other + m·es| < es.
// That is a bounded linear Diophantine problem over at most 8 terms; the strides are visited
// largest first (equal strides merged, so identical layouts, e.g. dq / dk / dv of one packed
// dqkv tensor, give differences k ∈ [−(n−1), n−1]) and each coefficient is limited to the values
// the smaller terms can still complete, which for nested strides (check_no_self_overlap) leaves
// at most three per term. A node budget bounds exotic mixes of unrelated strides: past it the
// answer is `unknown` and the caller refuses rather than risk a double write.
SharedElements views_share_element(const TensorView& t, const TensorView& other, int64_t budget) {
  using Shared = SharedElements;
  const int64_t es = dtype_size(t.dtype);
  struct Term {
    int64_t stride, lo, hi;  // coefficient range [lo, hi]
  };
  Term terms[8];
  int n = 0;
  auto add = [&](const TensorView& v, int sign) {
    for (int32_t d = 0; d < v.ndim; ++d) {
      if (v.shape[d] <= 1) continue;
      const int64_t stride = v.stride[d], c = v.shape[d] - 1;
      int k = 0;
      while (k < n && terms[k].stride != stride) ++k;
      if (k == n) terms[n++] = {stride, 0, 0};
      (sign > 0 ? terms[k].hi : terms[k].lo) += sign * c;
    }
  };
  add(t, 1);
  add(other, -1);
  for (int k = 0; k < n; ++k)
    if (terms[k].stride <= 0) return Shared::unknown;  // refused earlier for outputs; never guessed
  std::sort(terms, terms + n, [](const Term& a, const Term& b) { return a.stride > b.stride; });
  int64_t rest_lo[9] = {}, rest_hi[9] = {};  // what terms k.. can add up to
  for (int k = n - 1; k >= 0; --k) {
    rest_lo[k] = rest_lo[k + 1] + terms[k].lo * terms[k].stride;
    rest_hi[k] = rest_hi[k + 1] + terms[k].hi * terms[k].stride;
  }
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  auto ceil_div = [&](int64_t a, int64_t b) { return -floor_div(-a, b); };
  // Whether terms k.. can sum to rem exactly.
  auto reach = [&](auto&& self, int k, int64_t rem) -> Shared {
    if (--budget < 0) return Shared::unknown;
    if (rem < rest_lo[k] || rem > rest_hi[k]) return Shared::no;
    if (k == n) return rem == 0 ? Shared::yes : Shared::no;
    const Term& tm = terms[k];
    const int64_t c_lo = std::max(tm.lo, ceil_div(rem - rest_hi[k + 1], tm.stride));
    const int64_t c_hi = std::min(tm.hi, floor_div(rem - rest_lo[k + 1], tm.stride));
    bool unknown = false;
    for (int64_t c = c_lo; c <= c_hi; ++c) {
      const Shared r = self(self, k + 1, rem - c * tm.stride);
      if (r == Shared::yes) return r;
      if (r == Shared::unknown) {
        unknown = true;
        if (budget < 0) break;
      }
    }
    return unknown ? Shared::unknown : Shared::no;
  };
  // Bytes from other's data to t's: x·es + delta and y·es overlap iff |delta + (x − y)·es| < es.
  const int64_t delta =
      static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(t.data) - reinterpret_cast<std::uintptr_t>(other.data));
  const int64_t m_lo = floor_div(-delta, es), m_hi = ceil_div(-delta, es);
  Shared result = Shared::no;
  for (int64_t m = m_lo; m <= m_hi; ++m) {
    const Shared r = reach(reach, 0, m);
    if (r == Shared::yes) return r;
    if (r == Shared::unknown) result = r;
  }
  return result;
}

std::string cu_seqlens_error(const char* name, const int32_t* cu, int64_t batch, int64_t total,
                             const char* total_what, int64_t& longest, int64_t& longest_at) {
  longest = longest_at = 0;
  if (cu[0] != 0) return std::string(name) + ": expected element 0 = 0, got " + std::to_string(cu[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lo = cu[b], hi = cu[b + 1];
    if (hi < lo) {
      return std::string(name) + ": expected non-decreasing values, got element " + std::to_string(b + 1) + " = " +
             std::to_string(hi) + " < element " + std::to_string(b) + " = " + std::to_string(lo);
    }
    if (hi - lo > longest) longest = hi - lo, longest_at = b;
  }
  if (cu[batch] != total) {
    return std::string(name) + ": expected last element = " + std::to_string(total) + " (" + total_what +
           "), got " + std::to_string(cu[batch]);
  }
  return "";
}

Params validate(const AttentionParams& a, Pass pass) {
  if (pass != Pass::forward && pass != Pass::backward) {
    fail("pass: expected forward or backward, got enum value " + std::to_string(static_cast<int32_t>(pass)));
  }
  const bool bwd = pass == Pass::backward;
  const char* pass_name = bwd ? "backward" : "forward";

  // An empty view is ndim == 0; a pointer without a shape is almost certainly a caller's mistake.
  struct Named {
    const char* name;
    const TensorView* t;
  };
  const Named all[] = {{"q", &a.q},       {"k", &a.k},         {"v", &a.v},
                       {"out", &a.out},   {"lse", &a.lse},     {"dout", &a.dout},
                       {"dq", &a.dq},     {"dk", &a.dk},       {"dv", &a.dv},
                       {"cu_seqlens_q", &a.cu_seqlens_q},      {"cu_seqlens_k", &a.cu_seqlens_k},
                       {"alibi_slopes", &a.alibi_slopes}};
  // In the forward the backward tensors are ignored, so one AttentionParams can serve both passes.
  auto used = [&](const Named& n) {
    return bwd || !(n.t == &a.dout || n.t == &a.dq || n.t == &a.dk || n.t == &a.dv);
  };
  for (const Named& n : all) {
    if (!used(n)) continue;
    if (n.t->ndim < 0 || n.t->ndim > 4) {
      fail(std::string(n.name) + ": expected ndim in 0..4, got " + std::to_string(n.t->ndim));
    }
    if (n.t->ndim == 0 && n.t->data != nullptr) {
      fail(std::string(n.name) + ": expected ndim >= 1 for a tensor with data (ndim 0 means not given), got ndim 0");
    }
  }

  // Required tensors for the pass.
  const Named required_fwd[] = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}};
  const Named required_bwd[] = {{"lse", &a.lse}, {"dout", &a.dout}, {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}};
  for (const Named& n : required_fwd) {
    if (!n.t->defined()) fail(std::string(n.name) + ": expected a tensor (required by the " + pass_name + "), got none");
  }
  if (bwd) {
    for (const Named& n : required_bwd) {
      if (!n.t->defined()) fail(std::string(n.name) + ": expected a tensor (required by the backward), got none");
    }
  }

  if (a.cu_seqlens_q.defined() != a.cu_seqlens_k.defined()) {
    fail(a.cu_seqlens_q.defined() ? "cu_seqlens_k: expected a tensor (cu_seqlens_q is given), got none"
                                  : "cu_seqlens_q: expected a tensor (cu_seqlens_k is given), got none");
  }
  const bool varlen = a.cu_seqlens_q.defined();
  const int32_t rank = varlen ? 3 : 4;
  const char* q_layout = varlen ? "[total_q, num_heads, head_dim] (varlen)" : "[batch, seqlen_q, num_heads, head_dim]";
  const char* k_layout = varlen ? "[total_k, num_heads_k, head_dim] (varlen)" : "[batch, seqlen_k, num_heads_k, head_dim]";
  const char* v_layout =
      varlen ? "[total_k, num_heads_k, head_dim_v] (varlen)" : "[batch, seqlen_k, num_heads_k, head_dim_v]";
  const char* o_layout =
      varlen ? "[total_q, num_heads, head_dim_v] (varlen)" : "[batch, seqlen_q, num_heads, head_dim_v]";
  const char* lse_layout = varlen ? "[num_heads, total_q] (varlen)" : "[batch, num_heads, seqlen_q]";

  if (!varlen && a.q.ndim == 3) {
    fail("q: expected rank 4 [batch, seqlen_q, num_heads, head_dim] (rank 3 [total_q, num_heads, head_dim] needs "
         "cu_seqlens_q and cu_seqlens_k), got rank 3");
  }
  check_tensor("q", a.q, rank, q_layout);
  check_tensor("k", a.k, rank, k_layout);
  check_tensor("v", a.v, rank, v_layout);
  check_tensor("out", a.out, rank, o_layout);
  if (a.lse.defined()) check_tensor("lse", a.lse, rank - 1, lse_layout);
  if (bwd) {
    check_tensor("dout", a.dout, rank, o_layout);
    check_tensor("dq", a.dq, rank, q_layout);
    check_tensor("dk", a.dk, rank, k_layout);
    check_tensor("dv", a.dv, rank, v_layout);
  }
  if (varlen) {
    check_tensor("cu_seqlens_q", a.cu_seqlens_q, 1, "[batch + 1]");
    check_tensor("cu_seqlens_k", a.cu_seqlens_k, 1, "[batch + 1]");
    // Length 1 is batch 0 (legal, nothing to compute); neither of two different lengths is "the"
    // batch, so a mismatch names both.
    for (const Named& n : {Named{"cu_seqlens_q", &a.cu_seqlens_q}, Named{"cu_seqlens_k", &a.cu_seqlens_k}}) {
      if (n.t->shape[0] < 1) {
        fail(std::string(n.name) + ": expected shape [batch + 1] with at least 1 element, got " + shape_str(*n.t));
      }
    }
    if (a.cu_seqlens_q.shape[0] != a.cu_seqlens_k.shape[0]) {
      fail("cu_seqlens_q, cu_seqlens_k: expected the same length (batch + 1), got " +
           std::to_string(a.cu_seqlens_q.shape[0]) + " and " + std::to_string(a.cu_seqlens_k.shape[0]));
    }
  }
  if (a.alibi_slopes.defined()) {
    if (a.alibi_slopes.ndim != 1 && a.alibi_slopes.ndim != 2) {
      fail("alibi_slopes: expected rank 1 [num_heads] or rank 2 [batch, num_heads], got rank " +
           std::to_string(a.alibi_slopes.ndim));
    }
    check_tensor("alibi_slopes", a.alibi_slopes, a.alibi_slopes.ndim, "[num_heads] or [batch, num_heads]");
  }

  // Dtypes.
  const DType dt = a.q.dtype;
  if (dt != DType::f32 && dt != DType::f16 && dt != DType::bf16 && dt != DType::e4m3) {
    fail(std::string("q: expected dtype fp32, fp16, bf16 or e4m3, got ") + dtype_name(dt));
  }
  // FlashAttention-3's FP8 attention (Sec. 3.3) is a forward pass: its P and V are rounded to e4m3,
  // which a gradient cannot go through usefully, and FA-3 has no FP8 backward either.
  const bool fp8 = dt == DType::e4m3;
  if (fp8 && bwd) {
    fail("q: expected dtype fp32, fp16 or bf16 in the backward (e4m3 inputs have a forward pass only, as "
         "FlashAttention-3's FP8 attention), got e4m3");
  }
  if (fp8 && varlen) {
    fail("cu_seqlens_q: expected none with q in e4m3 (the FP8 forward runs batched only for now, no varlen), "
         "got cu_seqlens_q of shape " + shape_str(a.cu_seqlens_q));
  }
  check_dtype("k", a.k, dt, "same as q");
  check_dtype("v", a.v, dt, "same as q");
  // The FP8 forward writes bf16, as FlashAttention-3's does: e4m3's 3 mantissa bits would lose
  // most of what the fp32 accumulation kept.
  const DType out_dt = fp8 ? DType::bf16 : dt;
  check_dtype("out", a.out, out_dt, fp8 ? "the output of the e4m3 forward, as FlashAttention-3's" : "same as q");
  if (a.lse.defined()) check_dtype("lse", a.lse, DType::f32, "lse is always float32");
  if (bwd) {
    check_dtype("dout", a.dout, dt, "same as q");
    check_dtype("dq", a.dq, dt, "same as q");
    check_dtype("dk", a.dk, dt, "same as q");
    check_dtype("dv", a.dv, dt, "same as q");
  }
  if (varlen) {
    check_dtype("cu_seqlens_q", a.cu_seqlens_q, DType::i32, "prefix sums of sequence lengths");
    check_dtype("cu_seqlens_k", a.cu_seqlens_k, DType::i32, "prefix sums of sequence lengths");
  }
  if (a.alibi_slopes.defined()) check_dtype("alibi_slopes", a.alibi_slopes, DType::f32, "slopes are float32");

  // Devices: everything on q's device.
  for (const Named& n : all) {
    if (used(n) && n.t->defined() && (n.t->device != a.q.device || n.t->device_index != a.q.device_index)) {
      fail(std::string(n.name) + ": expected device " + device_str(a.q) + " (same as q), got " + device_str(*n.t));
    }
  }

  // Sizes. q defines batch, seqlen_q, num_heads, head_dim; k defines seqlen_k, num_heads_k; v
  // defines head_dim_v; everything else must agree.
  const int32_t o = varlen ? -1 : 0;  // dim index shift: varlen drops the batch dim
  const int64_t batch = varlen ? a.cu_seqlens_q.shape[0] - 1 : a.q.shape[0];
  const int64_t rows_q = a.q.shape[1 + o];   // seqlen_q, or total_q when varlen
  const int64_t rows_k = a.k.shape[1 + o];
  const int64_t num_heads = a.q.shape[2 + o], head_dim = a.q.shape[3 + o];
  const int64_t num_heads_k = a.k.shape[2 + o];
  const int64_t head_dim_v = a.v.shape[3 + o];
  const char* rows_q_name = varlen ? "total_q" : "seqlen_q";
  const char* rows_k_name = varlen ? "total_k" : "seqlen_k";

  if (num_heads < 1) fail("q: expected shape[" + std::to_string(2 + o) + "] (num_heads) >= 1, got " + std::to_string(num_heads));
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    fail("q: expected shape[" + std::to_string(3 + o) + "] (head_dim) in 1.." + std::to_string(kMaxHeadDim) +
         ", got " + std::to_string(head_dim));
  }
  if (!varlen) check_dim("k", a.k, 0, "batch", batch, "from q");
  check_dim("k", a.k, 3 + o, "head_dim", head_dim, "from q");
  if (num_heads_k < 1 || num_heads % num_heads_k != 0) {
    fail("k: expected shape[" + std::to_string(2 + o) + "] (num_heads_k) to divide num_heads = " +
         std::to_string(num_heads) + ", got " + std::to_string(num_heads_k));
  }
  if (!varlen) check_dim("v", a.v, 0, "batch", batch, "from q");
  check_dim("v", a.v, 1 + o, rows_k_name, rows_k, "from k");
  check_dim("v", a.v, 2 + o, "num_heads_k", num_heads_k, "from k");
  if (head_dim_v < 1 || head_dim_v > kMaxHeadDim) {
    fail("v: expected shape[" + std::to_string(3 + o) + "] (head_dim_v) in 1.." + std::to_string(kMaxHeadDim) +
         ", got " + std::to_string(head_dim_v));
  }
  // The FP8 kernel exists for one head size so far (FlashAttention-3's most common one).
  if (fp8 && head_dim != 128) {
    fail("q: expected shape[3] (head_dim) = 128 with e4m3 inputs (the only FP8 head_dim for now), got " +
         std::to_string(head_dim));
  }
  if (fp8 && head_dim_v != 128) {
    fail("v: expected shape[3] (head_dim_v) = 128 with e4m3 inputs (the only FP8 head_dim for now), got " +
         std::to_string(head_dim_v));
  }
  auto check_like = [&](const char* name, const TensorView& t, const TensorView& like, const char* like_name,
                        const char* rows_name, const char* heads_name, const char* dim_name) {
    std::string from = std::string("same as ") + like_name;
    if (!varlen) check_dim(name, t, 0, "batch", like.shape[0], from.c_str());
    check_dim(name, t, 1 + o, rows_name, like.shape[1 + o], from.c_str());
    check_dim(name, t, 2 + o, heads_name, like.shape[2 + o], from.c_str());
    check_dim(name, t, 3 + o, dim_name, like.shape[3 + o], from.c_str());
  };
  // out's expected shape mixes q (rows, heads) and v (head_dim_v).
  if (!varlen) check_dim("out", a.out, 0, "batch", batch, "from q");
  check_dim("out", a.out, 1 + o, rows_q_name, rows_q, "from q");
  check_dim("out", a.out, 2 + o, "num_heads", num_heads, "from q");
  check_dim("out", a.out, 3 + o, "head_dim_v", head_dim_v, "from v");
  if (a.lse.defined()) {
    if (varlen) {
      check_dim("lse", a.lse, 0, "num_heads", num_heads, "from q");
      check_dim("lse", a.lse, 1, "total_q", rows_q, "from q");
    } else {
      check_dim("lse", a.lse, 0, "batch", batch, "from q");
      check_dim("lse", a.lse, 1, "num_heads", num_heads, "from q");
      check_dim("lse", a.lse, 2, "seqlen_q", rows_q, "from q");
    }
  }
  if (bwd) {
    check_like("dout", a.dout, a.out, "out", rows_q_name, "num_heads", "head_dim_v");
    check_like("dq", a.dq, a.q, "q", rows_q_name, "num_heads", "head_dim");
    check_like("dk", a.dk, a.k, "k", rows_k_name, "num_heads_k", "head_dim");
    check_like("dv", a.dv, a.v, "v", rows_k_name, "num_heads_k", "head_dim_v");
  }

  check_descale("q_descale", a.q_descale, a.q, batch, num_heads_k);
  check_descale("k_descale", a.k_descale, a.q, batch, num_heads_k);
  check_descale("v_descale", a.v_descale, a.q, batch, num_heads_k);

  // Sequence lengths.
  int64_t seqlen_q = rows_q, seqlen_k = rows_k;
  if (varlen) {
    if (a.q.device == Device::cpu) {
      seqlen_q = check_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, batch, rows_q, "total_q = q.shape[0]");
      seqlen_k = check_cu_seqlens("cu_seqlens_k", a.cu_seqlens_k, batch, rows_k, "total_k = k.shape[0]");
      check_max_seqlen("max_seqlen_q", a.max_seqlen_q, seqlen_q);
      check_max_seqlen("max_seqlen_k", a.max_seqlen_k, seqlen_k);
    } else {
      // cu_seqlens live in device memory: reading them here would need a synchronizing copy.
      // The CUDA backend checks them on the device (its plan()/kernels), and uses the hints as
      // the grid size; without a hint the packed total bounds every sequence's length.
      check_max_seqlen("max_seqlen_q", a.max_seqlen_q, 0);
      check_max_seqlen("max_seqlen_k", a.max_seqlen_k, 0);
      seqlen_q = a.max_seqlen_q > 0 ? a.max_seqlen_q : rows_q;
      seqlen_k = a.max_seqlen_k > 0 ? a.max_seqlen_k : rows_k;
    }
  } else {
    check_max_seqlen("max_seqlen_q", a.max_seqlen_q, seqlen_q);
    check_max_seqlen("max_seqlen_k", a.max_seqlen_k, seqlen_k);
  }

  // Scalars.
  if (a.num_threads < 0) fail("num_threads: expected >= 0 (0 = all hardware threads), got " + std::to_string(a.num_threads));
  if (!std::isfinite(a.softmax_scale)) {
    fail("softmax_scale: expected a finite value (0 = 1/sqrt(head_dim)), got " + float_str(a.softmax_scale));
  }
  // A denormal scale flushes every score to 0 (or to denormal noise) before the softmax: the
  // output would be a plain mean of v, which no caller means.
  if (a.softmax_scale != 0.0f && std::fabs(a.softmax_scale) < FLT_MIN) {
    fail("softmax_scale: expected 0 (= 1/sqrt(head_dim)) or |softmax_scale| >= " + float_str(FLT_MIN) +
         " (FLT_MIN; smaller values are denormal), got " + float_str(a.softmax_scale));
  }
  if (!(a.softcap >= 0.0f) || !std::isfinite(a.softcap)) {
    fail("softcap: expected a finite value >= 0 (0 = off), got " + float_str(a.softcap));
  }
  // Scores go through tanh(s / softcap), which the backends fold into one multiplier (e.g.
  // softmax_scale / softcap on Q): below about 2.9e-39 that is inf, the scores become NaN or ±inf
  // and every row comes out masked.
  if (a.softcap > 0.0f && !std::isfinite(1.0f / a.softcap)) {
    fail("softcap: expected 0 (off) or a positive finite value with a finite reciprocal, got " + float_str(a.softcap));
  }
  if (a.window_size_left < -1) {
    fail("window_size_left: expected >= -1 (-1 = unbounded), got " + std::to_string(a.window_size_left));
  }
  if (a.window_size_right < -1) {
    fail("window_size_right: expected >= -1 (-1 = unbounded), got " + std::to_string(a.window_size_right));
  }
  if (a.causal && a.window_size_right > 0) {
    fail("window_size_right: expected -1 or 0 with causal = true (causal means window_size_right = 0), got " +
         std::to_string(a.window_size_right));
  }
  if (a.causal_align != CausalAlign::bottom_right && a.causal_align != CausalAlign::top_left) {
    fail("causal_align: expected bottom_right or top_left, got enum value " +
         std::to_string(static_cast<int32_t>(a.causal_align)));
  }
  if (a.alibi_slopes.defined()) {
    const TensorView& s = a.alibi_slopes;
    if (s.ndim == 1) {
      check_dim("alibi_slopes", s, 0, "num_heads", num_heads, "from q");
    } else {
      check_dim("alibi_slopes", s, 0, "batch", batch, "from q");
      check_dim("alibi_slopes", s, 1, "num_heads", num_heads, "from q");
    }
    // A NaN or infinite slope makes every score of its head NaN. Host slopes are read here (the
    // CUDA backend does not copy device slopes back for this: a synchronization per call).
    if (s.device == Device::cpu) {
      const float* slopes = static_cast<const float*>(s.data);
      const int64_t rows = s.ndim == 2 ? s.shape[0] : 1, cols = s.shape[s.ndim - 1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float x = slopes[r * (s.ndim == 2 ? s.stride[0] : 0) + c * s.stride[s.ndim - 1]];
          if (!std::isfinite(x)) {
            std::ostringstream got;
            got << x;
            fail("alibi_slopes: expected finite values, got " + got.str() + " at element " +
                 (s.ndim == 2 ? "[" + std::to_string(r) + ", " + std::to_string(c) + "]" : "[" + std::to_string(c) + "]"));
          }
        }
    }
  }

  // Each output element is written once: no output overlaps itself or another output.
  if (!bwd) {
    check_no_self_overlap("out", a.out);
    check_no_self_overlap("lse", a.lse);
    // lse is float32 and never part of a packed buffer with out, so any shared byte is an error.
    const Extent eo = extent(a.out), el = extent(a.lse);
    if (eo.lo != eo.hi && el.lo != el.hi && eo.lo < el.hi && el.lo < eo.hi) {
      fail("lse: expected memory disjoint from out (each output written once), got overlapping byte ranges");
    }
  } else {
    check_no_self_overlap("dq", a.dq);
    check_no_self_overlap("dk", a.dk);
    check_no_self_overlap("dv", a.dv);
    check_distinct_outputs("dk", a.dk, "dq", a.dq);
    check_distinct_outputs("dv", a.dv, "dq", a.dq);
    check_distinct_outputs("dv", a.dv, "dk", a.dk);
  }

  // Outputs must not overlap inputs.
  {
    const Named inputs_fwd[] = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"cu_seqlens_q", &a.cu_seqlens_q},
                                {"cu_seqlens_k", &a.cu_seqlens_k}, {"alibi_slopes", &a.alibi_slopes}};
    const Named inputs_bwd[] = {{"out", &a.out}, {"lse", &a.lse}, {"dout", &a.dout}};
    const Named outputs_fwd[] = {{"out", &a.out}, {"lse", &a.lse}};
    const Named outputs_bwd[] = {{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}};
    if (!bwd) {
      for (const Named& o : outputs_fwd) {
        for (const Named& i : inputs_fwd) check_no_alias(o.name, *o.t, i.name, *i.t);
        for (const Named& i : {Named{"q_descale", &a.q_descale}, Named{"k_descale", &a.k_descale},
                               Named{"v_descale", &a.v_descale}}) {
          check_disjoint(o.name, extent(*o.t), i.name, descale_extent(*i.t));
        }
      }
    } else {
      for (const Named& o : outputs_bwd) {
        for (const Named& i : inputs_fwd) check_no_alias(o.name, *o.t, i.name, *i.t);
        for (const Named& i : inputs_bwd) check_no_alias(o.name, *o.t, i.name, *i.t);
      }
    }
  }

  // Fill the backend-facing struct.
  Params p{};
  p.dtype = dt;
  p.out_dtype = out_dt;
  p.device = a.q.device;
  p.device_index = a.q.device_index;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.num_heads = num_heads;
  p.num_heads_k = num_heads_k;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.rows_q = rows_q;
  p.rows_k = rows_k;
  p.is_varlen = varlen;
  p.cu_seqlens_q = varlen ? static_cast<const int32_t*>(a.cu_seqlens_q.data) : nullptr;
  p.cu_seqlens_k = varlen ? static_cast<const int32_t*>(a.cu_seqlens_k.data) : nullptr;
  // Strides of a [batch, rows, heads, dim] (or varlen [rows, heads, dim]) tensor.
  auto strides3 = [&](const TensorView& t, int64_t& bs, int64_t& rs, int64_t& hs) {
    bs = varlen ? 0 : t.stride[0];
    rs = t.stride[1 + o];
    hs = t.stride[2 + o];
  };
  p.q = a.q.data;
  strides3(a.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  p.k = a.k.data;
  strides3(a.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  p.v = a.v.data;
  strides3(a.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  p.out = a.out.data;
  strides3(a.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = varlen ? 0 : a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1 + o];
    p.lse_row_stride = a.lse.stride[2 + o];
  }
  if (bwd) {
    p.dout = a.dout.data;
    strides3(a.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
    p.dq = a.dq.data;
    strides3(a.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
    p.dk = a.dk.data;
    strides3(a.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    p.dv = a.dv.data;
    strides3(a.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  }

  p.softmax_scale = a.softmax_scale != 0.0f ? a.softmax_scale
                                            : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  // The backends fold softmax_scale / softcap into one multiplier of Q·Kᵀ: an inf there makes
  // tanh(inf · 0) = NaN of scores that are far inside the float32 range; a denormal or zero one
  // loses Q's digits (or all of them), and the CPU backward, which divides dK by it, returned NaN
  // or inaccurate dK (a bad-input review, session 16).
  const float scale_over_cap = a.softcap > 0.0f ? p.softmax_scale / a.softcap : 1.0f;
  if (!std::isfinite(scale_over_cap)) {
    fail("softcap: expected softmax_scale / softcap finite in float32 (the scores are scaled by it before tanh), "
         "got softmax_scale = " + float_str(p.softmax_scale) + " and softcap = " + float_str(a.softcap));
  }
  if (std::fabs(scale_over_cap) < FLT_MIN) {
    fail("softcap: expected |softmax_scale / softcap| >= " + float_str(FLT_MIN) +
         " (FLT_MIN: the scores are scaled by it before tanh, and smaller values are denormal; softcap = 0 turns "
         "capping off), got softmax_scale = " + float_str(p.softmax_scale) + " and softcap = " + float_str(a.softcap));
  }
  p.softcap = a.softcap;
  // A window wider than every sequence is no window. Storing it as -1 (unbounded) keeps the mask
  // arithmetic of visible_keys() and the backends' block skipping (i + offset ± window) far from
  // int64 overflow: a window of INT64_MAX would otherwise wrap around and hide every key. Any
  // window > rows_q + rows_k (seqlen_q + seqlen_k, or total_q + total_k when varlen: bounds on
  // every len_q, len_k, row i and |offset|) already reaches past both ends of every row, so the
  // replacement changes no result.
  int64_t widest = 0;
  if (__builtin_add_overflow(rows_q, rows_k, &widest)) widest = INT64_MAX;
  auto resolve_window = [&](int64_t w) { return w > widest ? int64_t{-1} : w; };
  p.window_size_left = resolve_window(a.window_size_left);
  p.window_size_right = a.causal ? 0 : resolve_window(a.window_size_right);
  p.align_bottom_right = a.causal_align == CausalAlign::bottom_right;
  if (a.alibi_slopes.defined()) {
    p.alibi_slopes = static_cast<const float*>(a.alibi_slopes.data);
    if (a.alibi_slopes.ndim == 2) {
      p.alibi_batch_stride = a.alibi_slopes.stride[0];
    }
  }
  p.deterministic = a.deterministic;
  p.num_threads = a.num_threads;
  p.stream = a.stream;
  // Descales: nullptr when not given; one value gets strides 0; a size-1 dim's stride is never
  // stepped through (PyTorch leaves arbitrary strides there), so it becomes 0 as well.
  auto set_descale = [](const TensorView& t, const float*& ptr, int64_t& batch_stride, int64_t& head_stride) {
    ptr = descale_given(t) ? static_cast<const float*>(t.data) : nullptr;
    batch_stride = t.ndim == 2 && t.shape[0] > 1 ? t.stride[0] : 0;
    head_stride = t.ndim == 2 && t.shape[1] > 1 ? t.stride[1] : 0;
  };
  set_descale(a.q_descale, p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride);
  set_descale(a.k_descale, p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride);
  set_descale(a.v_descale, p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride);
  return p;
}

}  // namespace flashattn::detail
