// Shared test toolkit (header-only): host tensors of any dtype with contiguous or strided (padded,
// head-major) layouts, NaN poisoning, random inputs with a fresh seed per run, conversion to
// float64, and the project's accuracy criterion (check_close).
//
// Criterion (../shared/STYLE.md "Tests"): against the float64 reference,
//   max|ours − ref64| ≤ 2 · max|naive − ref64| + floor(dtype) · max|ref64|
// where naive is the same formula with every intermediate rounded to the input dtype
// (reference::Precision::input). The floor is one unit in the last place at the largest
// reference magnitude for fp16 (2^-10 ≈ 1e-3) and bf16 (2^-7 ≈ 8e-3): a correct kernel must round
// its output once (up to half an ulp), and the naive error can be smaller than that by luck (e.g.
// a row with one visible key is exact in any precision). fp32 uses 1e-5, the usual budget for a
// float32-accumulated softmax over a few thousand keys. NaN or ±inf where the reference is finite
// never passes; −inf (lse of a row that sees no key) must match −inf exactly.
// The floor scales with max(max|ref64|, magnitude): gradients pass magnitude = the largest |ref|
// over dq, dk and dv of the call, because a gradient can cancel to exactly 0 (every row seeing a
// single key has dS = P (dP − D) = 0) while ours carries the rounding noise of dP − D, whose terms
// are as large as the sibling gradients; both naive and max|ref64| are 0 there.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing {

// ---------------------------------------------------------------------------------------------
// Seeds: fresh every run; FLASHATTN_TEST_SEED=<n> replays one. Put seed_note(seed) in a
// SCOPED_TRACE so that every failure prints the seed.

inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

inline std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay with FLASHATTN_TEST_SEED=" + std::to_string(seed) + ")";
}

// ---------------------------------------------------------------------------------------------
// Scalar conversions and the poison pattern: quiet NaNs with a recognizable payload, so that a
// padding element still holding it was provably never written.

// Storage offsets of a strided tensor's logical elements, in row-major logical order (shared by
// the host tensors here and the device tensors of tests/cuda).
inline std::vector<int64_t> strided_offsets(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int64_t> offs;
  offs.reserve(static_cast<size_t>(n));
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * stride[d];
    offs.push_back(off);
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return offs;
}

inline double to_double(DType dtype, const void* base, int64_t offset) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[offset];
    case DType::f16: return detail::fp16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::bf16: return detail::bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::i32: return static_cast<const int32_t*>(base)[offset];
    case DType::e4m3: return detail::e4m3_to_float(static_cast<const uint8_t*>(base)[offset]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

inline void from_double(DType dtype, void* base, int64_t offset, double x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[offset] = static_cast<float>(x); break;
    case DType::f16: static_cast<uint16_t*>(base)[offset] = detail::float_to_fp16(static_cast<float>(x)); break;
    case DType::bf16: static_cast<uint16_t*>(base)[offset] = detail::float_to_bf16(static_cast<float>(x)); break;
    case DType::i32: static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(x); break;
    // Round to nearest even, saturating to ±448 (as the quantizers that feed FP8 attention do).
    case DType::e4m3: static_cast<uint8_t*>(base)[offset] = detail::float_to_e4m3(static_cast<float>(x)); break;
  }
}

// x rounded to dtype (what storing it in a tensor of that dtype keeps).
inline double round_to(DType dtype, double x) {
  unsigned char buf[4];
  from_double(dtype, buf, 0, x);
  return to_double(dtype, buf, 0);
}

inline void write_poison(DType dtype, void* base, int64_t offset) {
  switch (dtype) {
    case DType::f32: { const uint32_t v = 0x7fe5a5a5u; std::memcpy(static_cast<uint32_t*>(base) + offset, &v, 4); break; }
    case DType::f16: static_cast<uint16_t*>(base)[offset] = 0x7e5au; break;
    case DType::bf16: static_cast<uint16_t*>(base)[offset] = 0x7fe5u; break;
    case DType::i32: static_cast<int32_t*>(base)[offset] = 0x5a5a5a5a; break;
    case DType::e4m3: static_cast<uint8_t*>(base)[offset] = 0x7fu; break;  // e4m3's only positive NaN
  }
}

inline bool is_poison(DType dtype, const void* base, int64_t offset) {
  unsigned char expect[4];
  write_poison(dtype, expect, 0);
  const size_t size = dtype_size(dtype);
  return std::memcmp(static_cast<const unsigned char*>(base) + offset * size, expect, size) == 0;
}

// ---------------------------------------------------------------------------------------------
// Host tensors.

enum class Layout {
  contiguous,  // row-major
  padded,      // row-major with odd gaps after every row of every non-last dim (misaligned rows)
  head_major,  // dims r-3 and r-2 swapped in memory (e.g. q stored [batch, heads, seqlen, dim]), padded
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::padded: return "padded";
    case Layout::head_major: return "headmajor";
  }
  return "?";
}

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout = Layout::contiguous)
      : dtype_(dtype), shape_(std::move(shape)), stride_(shape_.size(), 1) {
    const int r = static_cast<int>(shape_.size());
    std::vector<int> order(r);  // memory order, innermost first
    for (int d = 0; d < r; ++d) order[d] = r - 1 - d;
    if (layout == Layout::head_major && r >= 3) std::swap(order[1], order[2]);
    const int64_t pads[4] = {0, 3, 5, 7};
    int64_t running = 1;
    for (int x = 0; x < r; ++x) {
      stride_[order[x]] = running;
      running = running * std::max<int64_t>(shape_[order[x]], 1) + (layout == Layout::contiguous ? 0 : pads[x]);
    }
    storage_numel_ = running;
    bytes_.assign(static_cast<size_t>(storage_numel_) * dtype_size(dtype_), 0);
    poison();
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& stride() const { return stride_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int64_t storage_numel() const { return storage_numel_; }
  bool defined() const { return !shape_.empty(); }

  // A view for AttentionParams. The tensor must outlive the call.
  TensorView view() {
    TensorView t;
    if (!defined()) return t;
    t.data = bytes_.data();
    t.dtype = dtype_;
    t.ndim = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      t.shape[d] = shape_[d];
      t.stride[d] = stride_[d];
    }
    return t;
  }

  // Storage offsets of the logical elements, in row-major logical order.
  std::vector<int64_t> logical_offsets() const { return strided_offsets(shape_, stride_); }

  void poison() {
    for (int64_t i = 0; i < storage_numel_; ++i) write_poison(dtype_, bytes_.data(), i);
  }

  // Logical elements ~ N(0, 1), rounded to the dtype; padding keeps the poison (so a kernel
  // reading outside the view gets NaN and fails).
  void fill_normal(std::mt19937_64& rng, double stddev = 1.0) {
    std::normal_distribution<double> dist(0.0, stddev);
    for (int64_t off : logical_offsets()) from_double(dtype_, bytes_.data(), off, dist(rng));
  }

  void set(const std::vector<double>& values) {
    const std::vector<int64_t> offs = logical_offsets();
    for (size_t i = 0; i < offs.size(); ++i) from_double(dtype_, bytes_.data(), offs[i], values[i]);
  }

  // Logical elements as float64, row-major.
  std::vector<double> to_dense() const {
    std::vector<double> out;
    for (int64_t off : logical_offsets()) out.push_back(to_double(dtype_, bytes_.data(), off));
    return out;
  }

  // Every storage element outside the view still holds the poison: nothing was written there.
  ::testing::AssertionResult padding_intact(const std::string& name) const {
    std::vector<char> logical(static_cast<size_t>(storage_numel_), 0);
    for (int64_t off : logical_offsets()) logical[static_cast<size_t>(off)] = 1;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < storage_numel_; ++i) {
      if (!logical[static_cast<size_t>(i)] && !is_poison(dtype_, bytes_.data(), i)) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << name << ": " << bad << " storage elements outside the view were written"
                                         << " (first at storage offset " << first << ")";
  }

  // Every logical element was overwritten (none still holds the poison).
  ::testing::AssertionResult all_written(const std::string& name) const {
    int64_t bad = 0, first = -1, e = 0;
    for (int64_t off : logical_offsets()) {
      if (is_poison(dtype_, bytes_.data(), off)) {
        if (first < 0) first = e;
        ++bad;
      }
      ++e;
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << name << ": " << bad << " of " << numel()
                                         << " elements never written (first at logical index " << first << ")";
  }

  // Bitwise equality of the whole storage (padding included).
  bool bitwise_equal(const HostTensor& other) const { return bytes_ == other.bytes_; }

 private:
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, stride_;
  int64_t storage_numel_ = 0;
  std::vector<unsigned char> bytes_;
};

// ---------------------------------------------------------------------------------------------
// The accuracy criterion.

inline double floor_rel(DType dtype) {
  switch (dtype) {
    case DType::f16: return 1e-3;   // 2^-10: one fp16 ulp at magnitude 1
    case DType::bf16: return 8e-3;  // 2^-7: one bf16 ulp at magnitude 1
    default: return 1e-5;
  }
}

// ours, ref64 and naive are the same elements in the same order. Passes iff every element where
// ref64 is finite has a finite `ours`, −inf in ref64 is −inf in ours, and
// max|ours − ref64| ≤ 2·max|naive − ref64| + floor_rel(dtype)·max(max|ref64|, magnitude).
// The criterion with the floor given as floor_of(max|ref64|), described by floor_text (check_close's
// floor is floor_rel(dtype)·max(max|ref64|, magnitude); the FP8 forward's is an absolute term).
template <class FloorOf>
::testing::AssertionResult check_close_with_floor(const std::string& name, const std::vector<double>& ours,
                                                  const std::vector<double>& ref64, const std::vector<double>& naive,
                                                  const std::string& naive_name, FloorOf floor_of,
                                                  const std::string& floor_text) {
  if (ours.size() != ref64.size() || naive.size() != ref64.size()) {
    return ::testing::AssertionFailure() << name << ": size mismatch (ours " << ours.size() << ", ref "
                                         << ref64.size() << ", naive " << naive.size() << ")";
  }
  double max_ref = 0.0, err = 0.0, naive_err = 0.0;
  size_t worst = 0;
  int64_t nonfinite = 0, inf_mismatch = 0;
  size_t first_bad = ref64.size();
  for (size_t i = 0; i < ref64.size(); ++i) {
    const double r = ref64[i], o = ours[i];
    if (std::isinf(r) && r < 0) {
      if (!(std::isinf(o) && o < 0)) {
        ++inf_mismatch;
        if (first_bad == ref64.size()) first_bad = i;
      }
      continue;
    }
    if (!std::isfinite(o)) {
      ++nonfinite;
      if (first_bad == ref64.size()) first_bad = i;
      continue;
    }
    max_ref = std::max(max_ref, std::fabs(r));
    const double e = std::fabs(o - r);
    if (e > err) {
      err = e;
      worst = i;
    }
    if (std::isfinite(naive[i])) naive_err = std::max(naive_err, std::fabs(naive[i] - r));
  }
  const double floor = floor_of(max_ref);
  const double allowed = 2.0 * naive_err + floor;
  std::ostringstream msg;
  msg << name << " (" << naive_name << ", " << ref64.size() << " elements): max|ours - ref| = " << err;
  if (!ref64.empty()) msg << " at index " << worst << " (ours " << ours[worst] << ", ref " << ref64[worst] << ")";
  msg << ", relative to max|ref| = " << max_ref << ": " << (max_ref > 0 ? err / max_ref : 0.0)
      << "; naive " << naive_name << " error " << naive_err << "; allowed 2*naive + " << floor_text << " = "
      << allowed;
  if (nonfinite || inf_mismatch) {
    msg << "; " << nonfinite << " NaN/inf where the reference is finite, " << inf_mismatch
        << " not -inf where the reference is -inf (first at index " << first_bad << ", ours " << ours[first_bad]
        << ", ref " << ref64[first_bad] << ")";
    return ::testing::AssertionFailure() << msg.str();
  }
  if (err > allowed) return ::testing::AssertionFailure() << msg.str();
  return ::testing::AssertionSuccess() << msg.str();
}

inline ::testing::AssertionResult check_close(const std::string& name, const std::vector<double>& ours,
                                              const std::vector<double>& ref64, const std::vector<double>& naive,
                                              DType dtype, double magnitude = 0.0) {
  std::ostringstream floor_text;
  floor_text << floor_rel(dtype) << "*max(max|ref|, magnitude " << magnitude << ")";
  return check_close_with_floor(
      name, ours, ref64, naive, dtype_name(dtype),
      [&](double max_ref) { return floor_rel(dtype) * std::max(max_ref, magnitude); }, floor_text.str());
}

// Largest |x| over several dense arrays (the `magnitude` of check_close for gradients).
inline double max_abs(std::initializer_list<const std::vector<double>*> arrays) {
  double m = 0.0;
  for (const std::vector<double>* a : arrays)
    for (double x : *a)
      if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// Bitwise equality of two tensors' storage, with a message naming the first difference.
inline ::testing::AssertionResult bitwise_equal(const std::string& name, const HostTensor& a, const HostTensor& b) {
  if (a.bitwise_equal(b)) return ::testing::AssertionSuccess();
  const std::vector<double> da = a.to_dense(), db = b.to_dense();
  int64_t diff = 0;
  size_t first = da.size();
  for (size_t i = 0; i < da.size(); ++i) {
    if (std::memcmp(&da[i], &db[i], sizeof(double)) != 0) {
      if (first == da.size()) first = i;
      ++diff;
    }
  }
  auto f = ::testing::AssertionFailure() << name << ": not bitwise equal, " << diff << " elements differ";
  if (first < da.size()) f << " (first at index " << first << ": " << da[first] << " vs " << db[first] << ")";
  return f;
}

}  // namespace flashattn::testing
