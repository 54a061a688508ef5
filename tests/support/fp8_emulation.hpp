// The "naive formula in the input precision" of the FP8 forward, for the accuracy criterion
// (error of ours ≤ 2 × error of this formula, both against the float64 reference): FlashAttention-3's
// own rounding steps (Shah et al. 2024, Sec. 3.3) without its tiling. Per query row, from the
// decoded e4m3 inputs:
//   S  = float32(q·k) · float32(softmax_scale · q_descale · k_descale)   (then softcap, ALiBi, mask)
//   P  = exp(S − rowmax S) in float32;  l = Σ P (the unrounded P)
//   P8 = e4m3(P · 256) / 256             (P goes into the second matmul as e4m3; the factor 256
//                                         keeps its small values out of e4m3's subnormals)
//   O  = bf16(float32(Σ P8 · v) · v_descale / l),   lse = float32(rowmax + log l)
// Dot products are summed in float64 and rounded once to float32 (a matmul with an fp32
// accumulator). Rows that see no key get out = 0 and lse = −inf. Same dense order as
// reference::forward: out [total_q, num_heads, head_dim_v], lse [num_heads, total_q].
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn_test_support.hpp"
#include "common/half.hpp"
#include "common/params.hpp"

namespace flashattn::testing {

// Every element a strided e4m3 tensor can address, decoded once (the loops below read each element
// many times; decoding per read made the FP8 GPU tests spend most of their time here).
struct DecodedE4m3 {
  std::vector<double> v;
  DecodedE4m3(const void* base, int64_t elements) : v(static_cast<size_t>(elements)) {
    const auto* b = static_cast<const uint8_t*>(base);
    for (int64_t i = 0; i < elements; ++i) v[static_cast<size_t>(i)] = detail::e4m3_to_float(b[i]);
  }
  double operator[](int64_t i) const { return v[static_cast<size_t>(i)]; }
};

// One past the largest element offset of a [batch, rows, heads, dim] view with these strides.
inline int64_t e4m3_extent(int64_t batch, int64_t rows, int64_t heads, int64_t dim, int64_t bs, int64_t rs,
                           int64_t hs) {
  if (batch <= 0 || rows <= 0 || heads <= 0 || dim <= 0) return 0;
  return (batch - 1) * bs + (rows - 1) * rs + (heads - 1) * hs + dim;
}

//
// Returns what the FP8 tensor cores' accumulation may add to any score: Hopper's FP8 wgmma keeps
// about 14 mantissa bits in its accumulator, not float32's 24 (DeepSeek-V3 technical report, 2024,
// Sec. 3.3.2, measured on H800), so a score may be off by ~2^-13 of Σ_d |q_d k_d| (scaled), where
// the emulation rounds an exact dot product once. The value is 2^-12 (a factor 2 of margin) times
// the largest scaled Σ_d |q_d k_d| over every (row, visible key): a bound on what that does to lse
// (a smooth max of the scores moves by at most the largest score change; softcap's tanh only
// shrinks changes).
inline double fp8_emulated_forward(const detail::Params& p, double* out, double* lse) {
  const DecodedE4m3 dq(p.q, e4m3_extent(p.batch, p.seqlen_q, p.num_heads, p.head_dim, p.q_batch_stride,
                                        p.q_row_stride, p.q_head_stride));
  const DecodedE4m3 dk(p.k, e4m3_extent(p.batch, p.seqlen_k, p.num_heads_k, p.head_dim, p.k_batch_stride,
                                        p.k_row_stride, p.k_head_stride));
  const DecodedE4m3 dv(p.v, e4m3_extent(p.batch, p.seqlen_k, p.num_heads_k, p.head_dim_v, p.v_batch_stride,
                                        p.v_row_stride, p.v_head_stride));
  auto descale = [&](const float* ptr, int64_t bs, int64_t hs, int64_t b, int64_t hk) {
    return ptr ? ptr[b * bs + hk * hs] : 1.0f;
  };
  const int64_t group = p.num_heads / p.num_heads_k;
  const int64_t total_q = p.batch * p.seqlen_q;  // batched only (the FP8 forward has no varlen)
  std::vector<float> s, prob;
  std::vector<double> acc(static_cast<size_t>(p.head_dim_v));
  double worst = 0.0;  // the largest scaled Σ_d |q_d k_d|
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t hk = h / group;
      const float qd = descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, b, hk);
      const float kd = descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, b, hk);
      const float vd = descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, b, hk);
      const float scale = p.softmax_scale * qd * kd;
      const double abs_scale = std::fabs(double(p.softmax_scale) * qd * kd);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t row = b * p.seqlen_q + i;
        double* o = out + (row * p.num_heads + h) * p.head_dim_v;
        const detail::KeyRange kr = detail::visible_keys(p, i, p.seqlen_q, p.seqlen_k);
        if (kr.hi <= kr.lo) {
          for (int64_t d = 0; d < p.head_dim_v; ++d) o[d] = 0.0;
          lse[h * total_q + row] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const int64_t q0 = b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
        s.assign(static_cast<size_t>(kr.hi - kr.lo), 0.0f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = kr.lo; j < kr.hi; ++j) {
          const int64_t k0 = b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride;
          double dot = 0.0, abs_dot = 0.0;
          for (int64_t d = 0; d < p.head_dim; ++d) {
            dot += dq[q0 + d] * dk[k0 + d];
            abs_dot += std::fabs(dq[q0 + d] * dk[k0 + d]);
          }
          worst = std::max(worst, abs_scale * abs_dot);
          float x = static_cast<float>(dot) * scale;
          if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
          x += detail::alibi_bias(p, b, h, i, j, p.seqlen_q, p.seqlen_k);
          s[static_cast<size_t>(j - kr.lo)] = x;
          m = std::max(m, x);
        }
        float l = 0.0f;
        prob.resize(s.size());
        for (size_t j = 0; j < s.size(); ++j) {
          const float e = std::exp(s[j] - m);
          l += e;
          prob[j] = detail::e4m3_to_float(detail::float_to_e4m3(e * 256.0f)) / 256.0f;
        }
        for (double& a : acc) a = 0.0;
        for (int64_t j = kr.lo; j < kr.hi; ++j) {
          const double pj = prob[static_cast<size_t>(j - kr.lo)];
          const int64_t v0 = b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride;
          for (int64_t d = 0; d < p.head_dim_v; ++d) acc[static_cast<size_t>(d)] += pj * dv[v0 + d];
        }
        const float norm = vd / l;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          o[d] = round_to(DType::bf16, static_cast<float>(acc[static_cast<size_t>(d)]) * norm);
        lse[h * total_q + row] = static_cast<float>(m + std::log(l));
      }
    }
  return std::ldexp(worst, -12);
}

}  // namespace flashattn::testing
