#include "commands/common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "common/half.hpp"
#include "common/params.hpp"
#include "cpu/memory.hpp"
#include "reference/reference.hpp"
#if FLASHATTN_WITH_CUDA
#include "device/cuda_copy.hpp"
#endif

namespace flashattn::cli {

namespace {

bool given(const HostTensor& t) { return !t.shape.empty(); }


TensorView view_of(const char* name, HostTensor& t) {
  if (!given(t)) return TensorView{};
  if (t.shape.size() > 4) {
    throw Error(std::string(name) + ": expected at most 4 dimensions, got shape " + io::shape_string(t.shape));
  }
  return t.view();
}

double load(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return detail::fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return detail::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::i32: return static_cast<const int32_t*>(base)[i];
  }
  return 0;
}

void store(void* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[i] = x; break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = detail::float_to_fp16(x); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(x); break;
    case DType::i32:  // NaN poison has no int32 form (an int q is refused by validate() anyway)
      static_cast<int32_t*>(base)[i] = std::isfinite(x) && std::fabs(x) < 2e9f ? static_cast<int32_t>(x) : INT32_MIN;
      break;
  }
}

HostTensor empty_tensor(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(io::checked_byte_size(t.shape, io::element_size(dtype), "output"));
  return t;
}

HostTensor nan_tensor(DType dtype, std::vector<int64_t> shape) {
  HostTensor t = empty_tensor(dtype, std::move(shape));
  const int64_t n = t.numel();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) store(t.data.data(), dtype, i, nan);
  return t;
}

HostTensor random_tensor(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  HostTensor t = empty_tensor(dtype, std::move(shape));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) store(t.data.data(), dtype, i, normal(rng));
  return t;
}

// Gathers a [rows, heads, dim] tensor of the call (out, dq: query rows; dk, dv: key rows) into the
// reference's dense float64 layout.
std::vector<double> gather_rows(const detail::Params& p, bool query_rows, const void* base, int64_t batch_stride,
                                int64_t row_stride, int64_t head_stride, int64_t heads, int64_t dim) {
  const int64_t total = query_rows ? reference::total_q(p) : reference::total_k(p);
  std::vector<double> dense(static_cast<std::size_t>(total * heads * dim));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t start = query_rows ? p.q_start(b) : p.k_start(b);
    const int64_t len = query_rows ? p.q_len(b) : p.k_len(b);
    const int64_t dense_start = p.is_varlen ? start : b * (query_rows ? p.seqlen_q : p.seqlen_k);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t src = b * batch_stride + (start + i) * row_stride;
      double* dst = dense.data() + (dense_start + i) * heads * dim;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) dst[h * dim + d] = load(base, p.dtype, src + h * head_stride + d);
      }
    }
  }
  return dense;
}

std::vector<double> gather_lse(const detail::Params& p) {
  const int64_t total = reference::total_q(p);
  std::vector<double> dense(static_cast<std::size_t>(total * p.num_heads));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t dense_start = p.is_varlen ? p.q_start(b) : b * p.seqlen_q;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      for (int64_t i = 0; i < p.q_len(b); ++i) {
        dense[h * total + dense_start + i] =
            p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + (p.q_start(b) + i) * p.lse_row_stride];
      }
    }
  }
  return dense;
}

double floor_scale(DType dtype) {
  switch (dtype) {
    case DType::f16: return std::ldexp(1.0, -10);
    case DType::bf16: return std::ldexp(1.0, -7);
    default: return 1e-5;
  }
}

ErrorRow compare(const std::string& name, const std::vector<double>& ours, const std::vector<double>& ref,
                 const std::vector<double>& naive, double floor_c) {
  ErrorRow row;
  row.name = name;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i];
    if (!std::isfinite(r)) {
      // Only −inf is expected (lse of a row that sees no key): ours must match it exactly.
      if (!(ours[i] == r)) ++row.bad;
      continue;
    }
    row.max_ref = std::max(row.max_ref, std::fabs(r));
    if (!std::isfinite(ours[i])) {
      ++row.bad;
    } else {
      row.max_abs = std::max(row.max_abs, std::fabs(ours[i] - r));
    }
    if (std::isfinite(naive[i])) row.naive_abs = std::max(row.naive_abs, std::fabs(naive[i] - r));
  }
  row.bound = 2.0 * row.naive_abs + floor_c * std::max(1.0, row.max_ref);
  row.pass = row.bad == 0 && row.max_abs <= row.bound;
  return row;
}

// Shapes of the outputs as the CLI allocates them: out [.., head_dim_v] like q with v's last
// dimension, lse [batch, num_heads, seqlen_q] (varlen [num_heads, total_q]), dq like q, dk like k,
// dv like v.
struct OutputShapes {
  std::vector<int64_t> out, lse, dq, dk, dv;
};

OutputShapes output_shapes(const Tensors& t, bool backward) {
  const std::size_t rank = t.q.shape.size();
  if (rank != 4 && rank != 3) {
    throw Error("q: expected shape [batch, seqlen_q, num_heads, head_dim] or [total_q, num_heads, head_dim] "
                "(varlen), got " + io::shape_string(t.q.shape));
  }
  OutputShapes s;
  s.out = t.q.shape;
  if (given(t.v)) s.out.back() = t.v.shape.back();
  if (rank == 4) {
    s.lse = {t.q.shape[0], t.q.shape[2], t.q.shape[1]};
  } else {
    s.lse = {t.q.shape[1], t.q.shape[0]};
  }
  if (backward) {
    s.dq = t.q.shape;
    s.dk = t.k.shape;
    s.dv = t.v.shape;
  }
  return s;
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / double(uint64_t{1} << 30));
  return text;
}

uint64_t add_saturating(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

// Throws "<what> need <total>, more than the <available> of memory available" when `total` bytes
// do not fit in what available_memory() says (which is INT64_MAX when nothing says).
void require_memory(uint64_t total, const std::string& what, const std::string& detail = "") {
  const uint64_t available = available_memory();
  if (total > available) {
    throw Error(what + " need " + gib(total) + detail + ", more than the " + gib(available) + " of memory available");
  }
}

// Refuses outputs that could not be allocated (their sizes come from untrusted file headers), with
// their byte count and the memory available, rather than a bare "out of memory" or swapping.
void check_memory(const OutputShapes& s, DType dtype) {
  const std::size_t elem = io::element_size(dtype);
  uint64_t total = 0;
  std::string names;
  const std::pair<const char*, const std::vector<int64_t>*> all[] = {
      {"out", &s.out}, {"lse", &s.lse}, {"dq", &s.dq}, {"dk", &s.dk}, {"dv", &s.dv}};
  for (const auto& [name, shape] : all) {
    if (shape->empty()) continue;
    const uint64_t bytes = io::checked_byte_size(*shape, shape == &s.lse ? sizeof(float) : elem, name);
    total = add_saturating(total, bytes);
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  require_memory(total, "outputs: " + names, " (out " + io::shape_string(s.out) + ")");
}

}  // namespace

AttentionParams make_params(Tensors& t, const CallOptions& o) {
  AttentionParams a;
  a.q = view_of("q", t.q);
  a.k = view_of("k", t.k);
  a.v = view_of("v", t.v);
  a.out = view_of("out", t.out);
  a.lse = view_of("lse", t.lse);
  a.dout = view_of("dout", t.dout);
  a.dq = view_of("dq", t.dq);
  a.dk = view_of("dk", t.dk);
  a.dv = view_of("dv", t.dv);
  a.cu_seqlens_q = view_of("cu_seqlens_q", t.cu_seqlens_q);
  a.cu_seqlens_k = view_of("cu_seqlens_k", t.cu_seqlens_k);
  a.alibi_slopes = view_of("alibi_slopes", t.alibi_slopes);
  a.softmax_scale = o.softmax_scale;
  a.causal = o.causal;
  a.causal_align = o.causal_align;
  a.window_size_left = o.window_size_left;
  a.window_size_right = o.window_size_right;
  a.softcap = o.softcap;
  a.deterministic = o.deterministic;
  a.num_threads = o.num_threads;
  return a;
}

void allocate_outputs(Tensors& t, bool backward) {
  const OutputShapes shapes = output_shapes(t, backward);
  // The output shapes come from untrusted headers, and validate() needs the outputs to exist: check
  // first the rules that bound their size by the inputs' (validate()'s rules, in its words). With
  // 1 <= head_dim, head_dim_v <= 256, out has at most 256x q's elements, lse at most q's rows x
  // heads, dq, dk, dv as many as q, k, v; then the total must fit in memory.
  const std::size_t rank = t.q.shape.size();
  const int64_t num_heads = t.q.shape[rank - 2], head_dim = t.q.shape[rank - 1];
  if (num_heads < 1) {
    throw Error("q: expected shape[" + std::to_string(rank - 2) + "] (num_heads) >= 1, got " + std::to_string(num_heads));
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    throw Error("q: expected shape[" + std::to_string(rank - 1) + "] (head_dim) in 1.." + std::to_string(kMaxHeadDim) +
                ", got " +
                std::to_string(head_dim));
  }
  if (given(t.v)) {
    const int64_t head_dim_v = t.v.shape.back();
    if (head_dim_v < 1 || head_dim_v > kMaxHeadDim) {
      throw Error("v: expected shape[" + std::to_string(t.v.shape.size() - 1) + "] (head_dim_v) in 1.." +
                  std::to_string(kMaxHeadDim) + ", got " +
                  std::to_string(head_dim_v));
    }
  }
  check_memory(shapes, t.q.dtype);
  t.out = nan_tensor(t.q.dtype, shapes.out);
  t.lse = nan_tensor(DType::f32, shapes.lse);
  if (backward) {
    t.dq = nan_tensor(t.q.dtype, shapes.dq);
    if (given(t.k)) t.dk = nan_tensor(t.k.dtype, shapes.dk);
    if (given(t.v)) t.dv = nan_tensor(t.v.dtype, shapes.dv);
  }
}

namespace {

// The generated problem's inputs and outputs must fit in memory before any is allocated (the
// shape options can ask for anything): refused with the bytes, the shape and the memory available
// instead of a bare "out of memory" after minutes of filling the first tensors.
void check_problem_memory(const ProblemSpec& s, int64_t rows_q, int64_t rows_k, int64_t dv) {
  const std::size_t elem = io::element_size(s.dtype);
  const uint64_t q = io::checked_byte_size({rows_q, s.num_heads, s.head_dim}, elem, "q");
  const uint64_t k = io::checked_byte_size({rows_k, s.num_heads_k, s.head_dim}, elem, "k");
  const uint64_t v = io::checked_byte_size({rows_k, s.num_heads_k, dv}, elem, "v");
  const uint64_t out = io::checked_byte_size({rows_q, s.num_heads, dv}, elem, "out");
  const uint64_t lse = io::checked_byte_size({rows_q, s.num_heads}, sizeof(float), "lse");
  // Forward: q, k, v, out, lse; backward adds dout, dq, dk, dv (the sizes of out, q, k, v).
  uint64_t total = 0;
  for (const uint64_t bytes : {q, k, v, out, lse}) total = add_saturating(total, bytes);
  if (s.backward) {
    for (const uint64_t bytes : {out, q, k, v}) total = add_saturating(total, bytes);
  }
  require_memory(total, "problem: its inputs and outputs (q " + io::shape_string({rows_q, s.num_heads, s.head_dim}) +
                            ", k " + io::shape_string({rows_k, s.num_heads_k, s.head_dim}) +
                            (s.backward ? ", with gradients" : "") + ")");
}

}  // namespace

uint64_t available_memory() { return static_cast<uint64_t>(cpu::available_memory_bytes()); }

Tensors make_problem(const ProblemSpec& s, std::mt19937_64& rng) {
  Tensors t;
  const int64_t dv = s.head_dim_v > 0 ? s.head_dim_v : s.head_dim;
  if (!s.varlen_q.empty()) {
    int64_t total_q = 0, total_k = 0;
    t.cu_seqlens_q = empty_tensor(DType::i32, {static_cast<int64_t>(s.varlen_q.size()) + 1});
    t.cu_seqlens_k = empty_tensor(DType::i32, {static_cast<int64_t>(s.varlen_k.size()) + 1});
    auto* cq = reinterpret_cast<int32_t*>(t.cu_seqlens_q.data.data());
    auto* ck = reinterpret_cast<int32_t*>(t.cu_seqlens_k.data.data());
    cq[0] = ck[0] = 0;
    for (std::size_t b = 0; b < s.varlen_q.size(); ++b) {
      cq[b + 1] = static_cast<int32_t>(total_q += s.varlen_q[b]);
      ck[b + 1] = static_cast<int32_t>(total_k += s.varlen_k[b]);
    }
    check_problem_memory(s, total_q, total_k, dv);
    t.q = random_tensor(s.dtype, {total_q, s.num_heads, s.head_dim}, rng);
    t.k = random_tensor(s.dtype, {total_k, s.num_heads_k, s.head_dim}, rng);
    t.v = random_tensor(s.dtype, {total_k, s.num_heads_k, dv}, rng);
  } else {
    // The options are int-sized (CLI checks), so batch · seqlen fits in int64.
    check_problem_memory(s, s.batch * s.seqlen_q, s.batch * s.seqlen_k, dv);
    t.q = random_tensor(s.dtype, {s.batch, s.seqlen_q, s.num_heads, s.head_dim}, rng);
    t.k = random_tensor(s.dtype, {s.batch, s.seqlen_k, s.num_heads_k, s.head_dim}, rng);
    t.v = random_tensor(s.dtype, {s.batch, s.seqlen_k, s.num_heads_k, dv}, rng);
  }
  if (s.alibi) {
    const int64_t batch = s.varlen_q.empty() ? s.batch : static_cast<int64_t>(s.varlen_q.size());
    t.alibi_slopes = s.alibi_per_batch ? empty_tensor(DType::f32, {batch, s.num_heads})
                                       : empty_tensor(DType::f32, {s.num_heads});
    auto* slopes = reinterpret_cast<float*>(t.alibi_slopes.data.data());
    const int64_t n = t.alibi_slopes.numel();
    for (int64_t i = 0; i < n; ++i) {
      // Press et al. 2022's geometric slopes; per-batch rows are scaled so that batches differ.
      const int64_t h = i % s.num_heads, b = i / s.num_heads;
      slopes[i] = static_cast<float>(std::exp2(-8.0 * (h + 1) / s.num_heads) * (1.0 + 0.25 * b));
    }
  }
  allocate_outputs(t, s.backward);
  if (s.backward) t.dout = random_tensor(s.dtype, t.out.shape, rng);
  return t;
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  if (name == "cuda") {
#if FLASHATTN_WITH_CUDA
    if (!cuda_available()) throw Error("--device cuda: expected a CUDA device, got none (cudaGetDeviceCount found no usable GPU; --device auto falls back to the CPU)");
    return Device::cuda;
#else
    throw Error("--device cuda: this build has no CUDA backend (configure with -DFLASHATTN_CUDA=ON)");
#endif
  }
  throw Error("--device: expected auto, cpu or cuda, got '" + name + "'");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Device copies of the given tensors for one call, freed with the Runner.
struct Runner::Device_ {
  std::vector<void*> buffers;
  ~Device_() {
#if FLASHATTN_WITH_CUDA
    for (void* ptr : buffers) cuda_copy::release(ptr);
#endif
  }
  TensorView upload(const TensorView& host, const HostTensor& t) {
    if (!host.defined()) return host;
    TensorView d = host;
#if FLASHATTN_WITH_CUDA
    void* ptr = cuda_copy::allocate(t.data.size());
    buffers.push_back(ptr);
    cuda_copy::to_device(ptr, t.data.data(), t.data.size());
    d.data = ptr;
    d.device = Device::cuda;
#else
    (void)t;
#endif
    return d;
  }
};

Runner::Runner(Tensors& t, const CallOptions& o, Device device) : t_(t), device_(device) {
  host_ = make_params(t, o);
  const detail::Params p = detail::validate(host_, given(t.dout) ? Pass::backward : Pass::forward);
  run_ = host_;
  if (device == Device::cpu) return;
#if FLASHATTN_WITH_CUDA
  mirror_ = std::make_unique<Device_>();
  for (auto [view, tensor] : std::initializer_list<std::pair<TensorView*, HostTensor*>>{
           {&run_.q, &t.q}, {&run_.k, &t.k}, {&run_.v, &t.v}, {&run_.out, &t.out}, {&run_.lse, &t.lse},
           {&run_.dout, &t.dout}, {&run_.dq, &t.dq}, {&run_.dk, &t.dk}, {&run_.dv, &t.dv},
           {&run_.cu_seqlens_q, &t.cu_seqlens_q}, {&run_.cu_seqlens_k, &t.cu_seqlens_k},
           {&run_.alibi_slopes, &t.alibi_slopes}}) {
    *view = mirror_->upload(*view, *tensor);
  }
  if (p.is_varlen) {  // the device cannot read cu_seqlens cheaply: pass the host-derived maxima
    run_.max_seqlen_q = p.seqlen_q;
    run_.max_seqlen_k = p.seqlen_k;
  }
  cuda_copy::synchronize();
#else
  (void)p;
  throw Error("--device cuda: this build has no CUDA backend");
#endif
}

Runner::~Runner() = default;

double Runner::forward() {
  const double t0 = now_seconds();
  flashattn::forward(run_);
#if FLASHATTN_WITH_CUDA
  if (device_ == Device::cuda) cuda_copy::synchronize();
#endif
  return now_seconds() - t0;
}

double Runner::backward() {
  const double t0 = now_seconds();
  flashattn::backward(run_);
#if FLASHATTN_WITH_CUDA
  if (device_ == Device::cuda) cuda_copy::synchronize();
#endif
  return now_seconds() - t0;
}

void Runner::download() {
#if FLASHATTN_WITH_CUDA
  if (device_ != Device::cuda) return;
  for (auto [view, tensor] : std::initializer_list<std::pair<TensorView*, HostTensor*>>{
           {&run_.out, &t_.out}, {&run_.lse, &t_.lse}, {&run_.dq, &t_.dq}, {&run_.dk, &t_.dk}, {&run_.dv, &t_.dv}}) {
    if (view->defined()) cuda_copy::to_host(tensor->data.data(), view->data, tensor->data.size());
  }
#endif
}

Plan Runner::plan(Pass pass) const { return flashattn::plan(run_, pass); }

std::string Runner::kernel(Pass pass) const {
  const Plan pl = plan(pass);
  return pl.ok ? pl.kernel : "none (" + pl.reason + ")";
}

RunTimes run_attention(Tensors& t, const CallOptions& o, Device device) {
  Runner runner(t, o, device);
  RunTimes times;
  times.forward_kernel = runner.kernel(Pass::forward);
  times.forward_s = runner.forward();
  if (given(t.dout)) {
    times.backward_kernel = runner.kernel(Pass::backward);
    times.backward_s = runner.backward();
  }
  runner.download();
  return times;
}

std::vector<ErrorRow> compare_with_reference(const AttentionParams& params, bool backward) {
  const detail::Params p = detail::validate(params, backward ? Pass::backward : Pass::forward);
  const int64_t tq = reference::total_q(p), tk = reference::total_k(p);
  const std::size_t n_out = static_cast<std::size_t>(tq * p.num_heads * p.head_dim_v);
  const std::size_t n_lse = static_cast<std::size_t>(tq * p.num_heads);
  std::vector<double> out64(n_out), lse64(n_lse), out_naive(n_out), lse_naive(n_lse);
  reference::forward(p, reference::Precision::f64, out64.data(), lse64.data());
  reference::forward(p, reference::Precision::input, out_naive.data(), lse_naive.data());

  std::vector<ErrorRow> rows;
  const double c = floor_scale(p.dtype);
  rows.push_back(compare("out",
                         gather_rows(p, true, p.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.num_heads,
                                     p.head_dim_v),
                         out64, out_naive, c));
  if (p.lse) rows.push_back(compare("lse", gather_lse(p), lse64, lse_naive, 1e-5));
  if (!backward) return rows;

  const std::size_t n_dq = static_cast<std::size_t>(tq * p.num_heads * p.head_dim);
  const std::size_t n_dk = static_cast<std::size_t>(tk * p.num_heads_k * p.head_dim);
  const std::size_t n_dv = static_cast<std::size_t>(tk * p.num_heads_k * p.head_dim_v);
  std::vector<double> dq64(n_dq), dk64(n_dk), dv64(n_dv), dq_naive(n_dq), dk_naive(n_dk), dv_naive(n_dv);
  reference::backward(p, reference::Precision::f64, dq64.data(), dk64.data(), dv64.data());
  reference::backward(p, reference::Precision::input, dq_naive.data(), dk_naive.data(), dv_naive.data());
  rows.push_back(compare("dq",
                         gather_rows(p, true, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.num_heads,
                                     p.head_dim),
                         dq64, dq_naive, c));
  rows.push_back(compare("dk",
                         gather_rows(p, false, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                                     p.num_heads_k, p.head_dim),
                         dk64, dk_naive, c));
  rows.push_back(compare("dv",
                         gather_rows(p, false, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride,
                                     p.num_heads_k, p.head_dim_v),
                         dv64, dv_naive, c));
  return rows;
}

AttentionParams slice_heads(const AttentionParams& a, int64_t h0, int64_t count) {
  const bool varlen = a.q.ndim == 3;
  const int head_axis = varlen ? 1 : 2;
  const int64_t num_heads = a.q.shape[head_axis], num_heads_k = a.k.shape[head_axis];
  const int64_t group = num_heads / std::max<int64_t>(num_heads_k, 1);
  if (group <= 0 || h0 % group || count % group || h0 < 0 || count <= 0 || h0 + count > num_heads) {
    throw Error("slice_heads: heads [" + std::to_string(h0) + ", " + std::to_string(h0 + count) +
                ") do not cover whole KV groups of " + std::to_string(group));
  }
  auto slice = [](TensorView t, int axis, int64_t start, int64_t n) {
    if (!t.defined()) return t;
    t.data = static_cast<char*>(t.data) + start * t.stride[axis] * static_cast<int64_t>(dtype_size(t.dtype));
    t.shape[axis] = n;
    return t;
  };
  AttentionParams s = a;
  for (TensorView* t : {&s.q, &s.out, &s.dout, &s.dq}) *t = slice(*t, head_axis, h0, count);
  for (TensorView* t : {&s.k, &s.v, &s.dk, &s.dv}) *t = slice(*t, head_axis, h0 / group, count / group);
  s.lse = slice(s.lse, varlen ? 0 : 1, h0, count);
  if (s.alibi_slopes.defined()) s.alibi_slopes = slice(s.alibi_slopes, s.alibi_slopes.ndim - 1, h0, count);
  return s;
}

bool print_error_table(const std::vector<ErrorRow>& rows, const std::string& indent) {
  bool all = true;
  std::printf("%s%-6s %12s %10s %12s %12s  %s\n", indent.c_str(), "output", "max_abs_err", "rel_err", "naive_err",
              "bound", "result");
  for (const ErrorRow& r : rows) {
    const double rel = r.max_ref > 0 ? r.max_abs / r.max_ref : r.max_abs;
    std::string result = r.pass ? "PASS" : "FAIL";
    if (r.bad) result += " (" + std::to_string(r.bad) + " non-finite or unwritten)";
    std::printf("%s%-6s %12.3e %10.2e %12.3e %12.3e  %s\n", indent.c_str(), r.name.c_str(), r.max_abs, rel,
                r.naive_abs, r.bound, result.c_str());
    all = all && r.pass;
  }
  return all;
}

double attention_flops(const AttentionParams& params, bool backward) {
  const detail::Params p = detail::validate(params, Pass::forward);
  ProblemSpec s;
  s.batch = p.batch;
  s.seqlen_q = p.seqlen_q;
  s.seqlen_k = p.seqlen_k;
  for (int64_t b = 0; p.is_varlen && b < p.batch; ++b) {
    s.varlen_q.push_back(static_cast<int32_t>(p.q_len(b)));
    s.varlen_k.push_back(static_cast<int32_t>(p.k_len(b)));
  }
  s.num_heads = p.num_heads;
  s.head_dim = p.head_dim;
  s.head_dim_v = p.head_dim_v;
  s.options.causal = p.window_size_right == 0 && p.window_size_left < 0;
  return attention_flops(s, backward);
}

double attention_flops(const ProblemSpec& s, bool backward) {
  double pairs = 0;
  if (!s.varlen_q.empty()) {
    for (std::size_t b = 0; b < s.varlen_q.size(); ++b) pairs += double(s.varlen_q[b]) * double(s.varlen_k[b]);
  } else {
    pairs = double(s.batch) * double(s.seqlen_q) * double(s.seqlen_k);
  }
  const double dv = s.head_dim_v > 0 ? s.head_dim_v : s.head_dim;
  double flops = 2.0 * pairs * double(s.num_heads) * (double(s.head_dim) + dv);
  if (s.options.causal) flops *= 0.5;
  return backward ? 2.5 * flops : flops;
}

}  // namespace flashattn::cli
