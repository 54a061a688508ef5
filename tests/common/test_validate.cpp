// validate() through the public API: every rejected input gives plan().ok = false and a
// flashattn::Error from forward()/backward() whose message starts "<argument>: expected" and says
// what came; on error no output is written (poisoned outputs compared bitwise). Also the Params
// that valid calls produce (mask resolution, default scale, varlen lengths, strides).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_problem.hpp"
#include "common/params.hpp"
#include "fp8_emulation.hpp"
#include "reference/reference.hpp"

namespace flashattn::testing {
namespace {

ProblemConfig base_config(bool varlen) {
  ProblemConfig c;
  c.batch = 2;
  c.seqlen_q = 5;
  c.seqlen_k = 7;
  c.num_heads = 4;
  c.num_heads_k = 2;
  c.head_dim = 8;
  c.head_dim_v = 6;
  if (varlen) {
    c.lens_q = {3, 0, 4};
    c.lens_k = {5, 2, 0};
  }
  return c;
}

using Mutation = void (*)(AttentionParams&);

struct ErrorCase {
  const char* name;
  Pass pass;
  bool varlen;
  Mutation mutate;
  const char* argument;  // the message must start with "<argument>: expected"
  const char* contains;  // and contain this
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

int32_t* cu_q(AttentionParams& a) { return static_cast<int32_t*>(a.cu_seqlens_q.data); }
int32_t* cu_k(AttentionParams& a) { return static_cast<int32_t*>(a.cu_seqlens_k.data); }

// Each case breaks exactly one thing of an otherwise valid call. Base batched call:
// q [2, 5, 4, 8], k [2, 7, 2, 8], v [2, 7, 2, 6], out [2, 5, 4, 6], lse [2, 4, 5], fp32.
// Base varlen call: lens_q {3, 0, 4}, lens_k {5, 2, 0}: q [7, 4, 8], k [7, 2, 8], lse [4, 7].
const ErrorCase kCases[] = {
    // Required tensors.
    {"MissingQ", Pass::forward, false, [](AttentionParams& a) { a.q = {}; }, "q", "required by the forward"},
    {"MissingK", Pass::forward, false, [](AttentionParams& a) { a.k = {}; }, "k", "got none"},
    {"MissingV", Pass::forward, false, [](AttentionParams& a) { a.v = {}; }, "v", "got none"},
    {"MissingOut", Pass::forward, false, [](AttentionParams& a) { a.out = {}; }, "out", "got none"},
    {"MissingOutBwd", Pass::backward, false, [](AttentionParams& a) { a.out = {}; }, "out", "required by the backward"},
    {"MissingLseBwd", Pass::backward, false, [](AttentionParams& a) { a.lse = {}; }, "lse", "required by the backward"},
    {"MissingDout", Pass::backward, false, [](AttentionParams& a) { a.dout = {}; }, "dout", "got none"},
    {"MissingDq", Pass::backward, false, [](AttentionParams& a) { a.dq = {}; }, "dq", "got none"},
    {"MissingDk", Pass::backward, false, [](AttentionParams& a) { a.dk = {}; }, "dk", "got none"},
    {"MissingDv", Pass::backward, false, [](AttentionParams& a) { a.dv = {}; }, "dv", "got none"},
    {"OnlyCuSeqlensQ", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_k = {}; }, "cu_seqlens_k",
     "cu_seqlens_q is given"},
    {"OnlyCuSeqlensK", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_q = {}; }, "cu_seqlens_q",
     "cu_seqlens_k is given"},
    // Ranks and descriptor sanity.
    {"QRank3WithoutCuSeqlens", Pass::forward, false,
     [](AttentionParams& a) { a.q.ndim = 3; }, "q", "needs cu_seqlens_q and cu_seqlens_k), got rank 3"},
    {"KRank3", Pass::forward, false, [](AttentionParams& a) { a.k.ndim = 3; }, "k", "expected rank 4"},
    {"VarlenQRank4", Pass::forward, true, [](AttentionParams& a) { a.q.ndim = 4; }, "q", "got rank 4"},
    {"LseRank2Batched", Pass::forward, false, [](AttentionParams& a) { a.lse.ndim = 2; }, "lse", "expected rank 3"},
    {"DqRank2", Pass::backward, false, [](AttentionParams& a) { a.dq.ndim = 2; }, "dq", "expected rank 4"},
    {"NdimTooBig", Pass::forward, false, [](AttentionParams& a) { a.v.ndim = 5; }, "v", "ndim in 0..4, got 5"},
    {"NdimNegative", Pass::forward, false, [](AttentionParams& a) { a.out.ndim = -1; }, "out", "got -1"},
    {"NdimZeroWithData", Pass::forward, false, [](AttentionParams& a) { a.lse.ndim = 0; }, "lse", "got ndim 0"},
    {"NegativeShape", Pass::forward, false, [](AttentionParams& a) { a.k.shape[1] = -7; }, "k",
     "shape[1] >= 0, got -7"},
    {"NullData", Pass::forward, false, [](AttentionParams& a) { a.v.data = nullptr; }, "v", "got nullptr"},
    {"NullDataDk", Pass::backward, false, [](AttentionParams& a) { a.dk.data = nullptr; }, "dk", "got nullptr"},
    // Strides.
    {"LastStrideNotOne", Pass::forward, false, [](AttentionParams& a) { a.q.stride[3] = 2; }, "q",
     "stride[3] = 1 (last dimension contiguous), got 2"},
    {"LseLastStrideNotOne", Pass::forward, false, [](AttentionParams& a) { a.lse.stride[2] = 4; }, "lse",
     "stride[2] = 1"},
    {"NegativeStride", Pass::forward, false, [](AttentionParams& a) { a.k.stride[1] = -16; }, "k",
     "stride[1] >= 0, got -16"},
    {"NegativeStrideDout", Pass::backward, false, [](AttentionParams& a) { a.dout.stride[0] = -1; }, "dout",
     "stride[0] >= 0, got -1"},
    {"OffsetOverflow", Pass::forward, false,
     [](AttentionParams& a) { a.q.stride[0] = std::numeric_limits<int64_t>::max(); }, "q", "overflows int64"},
    {"OffsetOverflowSum", Pass::forward, false,
     [](AttentionParams& a) {
       a.k.stride[0] = std::numeric_limits<int64_t>::max() / 2 - 8;  // (2-1)·stride fits,
       a.k.stride[1] = std::numeric_limits<int64_t>::max() / 8;       // the sum with 6·stride[1] does not
     },
     "k", "overflows int64"},
    {"ByteOffsetOverflow", Pass::forward, false,
     [](AttentionParams& a) { a.v.stride[0] = std::numeric_limits<int64_t>::max() / 2; }, "v", "overflows int64"},
    {"NumelOverflow", Pass::forward, false,
     [](AttentionParams& a) {
       a.out.shape[0] = int64_t{1} << 40;
       a.out.shape[1] = int64_t{1} << 40;
     },
     "out", "overflows int64"},
    // Dtypes.
    {"QDtypeInt32", Pass::forward, false, [](AttentionParams& a) { a.q.dtype = DType::i32; }, "q",
     "fp32, fp16, bf16 or e4m3, got int32"},
    {"QDtypeUnknown", Pass::forward, false, [](AttentionParams& a) { a.q.dtype = static_cast<DType>(9); }, "q",
     "got enum value 9"},
    {"KDtypeMismatch", Pass::forward, false, [](AttentionParams& a) { a.k.dtype = DType::f16; }, "k",
     "dtype fp32 (same as q), got fp16"},
    {"VDtypeMismatch", Pass::forward, false, [](AttentionParams& a) { a.v.dtype = DType::bf16; }, "v", "got bf16"},
    {"OutDtypeMismatch", Pass::forward, false, [](AttentionParams& a) { a.out.dtype = DType::f16; }, "out",
     "got fp16"},
    {"LseDtype", Pass::forward, false, [](AttentionParams& a) { a.lse.dtype = DType::f16; }, "lse",
     "expected dtype fp32 (lse is always float32), got fp16"},
    {"DoutDtype", Pass::backward, false, [](AttentionParams& a) { a.dout.dtype = DType::bf16; }, "dout", "got bf16"},
    {"DqDtype", Pass::backward, false, [](AttentionParams& a) { a.dq.dtype = DType::bf16; }, "dq", "got bf16"},
    {"DkDtype", Pass::backward, false, [](AttentionParams& a) { a.dk.dtype = DType::f16; }, "dk", "got fp16"},
    {"DvDtype", Pass::backward, false, [](AttentionParams& a) { a.dv.dtype = DType::f16; }, "dv", "got fp16"},
    {"CuSeqlensDtype", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_q.dtype = DType::f32; },
     "cu_seqlens_q", "dtype int32"},
    {"AlibiDtype", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[4];
       a.alibi_slopes = make_tensor(slopes, DType::bf16, {4});
     },
     "alibi_slopes", "dtype fp32"},
    // Devices.
    {"DeviceMismatch", Pass::forward, false, [](AttentionParams& a) { a.k.device = Device::cuda; }, "k",
     "device cpu:0 (same as q), got cuda:0"},
    {"DeviceIndexMismatch", Pass::forward, false, [](AttentionParams& a) { a.out.device_index = 1; }, "out",
     "got cpu:1"},
    {"DeviceMismatchDv", Pass::backward, false, [](AttentionParams& a) { a.dv.device = Device::cuda; }, "dv",
     "got cuda:0"},
    {"DeviceMismatchLse", Pass::forward, false, [](AttentionParams& a) { a.lse.device = Device::cuda; }, "lse",
     "got cuda:0"},
    {"DeviceMismatchCuSeqlens", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_k.device_index = 3; },
     "cu_seqlens_k", "got cpu:3"},
    {"DeviceUnknown", Pass::forward, false, [](AttentionParams& a) { a.v.device = static_cast<Device>(5); }, "v",
     "cpu or cuda, got enum value 5"},
    {"DeviceIndexNegative", Pass::forward, false, [](AttentionParams& a) { a.q.device_index = -1; }, "q",
     "device_index >= 0, got -1"},
    // Sizes.
    {"HeadDimZero", Pass::forward, false,
     [](AttentionParams& a) { a.q.shape[3] = 0; }, "q", "shape[3] (head_dim) in 1..256, got 0"},
    {"HeadDimTooBig", Pass::forward, false,
     [](AttentionParams& a) {
       for (TensorView* t : {&a.q, &a.k}) t->shape[3] = 257;
     },
     "q", "(head_dim) in 1..256, got 257"},
    {"HeadDimVTooBig", Pass::forward, false,
     [](AttentionParams& a) {
       for (TensorView* t : {&a.v, &a.out}) t->shape[3] = 300;
     },
     "v", "(head_dim_v) in 1..256, got 300"},
    {"NumHeadsZero", Pass::forward, false, [](AttentionParams& a) { a.q.shape[2] = 0; }, "q",
     "(num_heads) >= 1, got 0"},
    {"NumHeadsKNotDividing", Pass::forward, false,
     [](AttentionParams& a) {
       a.k.shape[2] = 3;
       a.v.shape[2] = 3;
     },
     "k", "shape[2] (num_heads_k) to divide num_heads = 4, got 3"},
    {"NumHeadsKZero", Pass::forward, false, [](AttentionParams& a) { a.k.shape[2] = 0; }, "k",
     "to divide num_heads = 4, got 0"},
    {"KBatch", Pass::forward, false, [](AttentionParams& a) { a.k.shape[0] = 1; }, "k",
     "shape[0] (batch) = 2 (from q), got 1"},
    {"KHeadDim", Pass::forward, false, [](AttentionParams& a) { a.k.shape[3] = 4; }, "k",
     "shape[3] (head_dim) = 8 (from q), got 4"},
    {"VBatch", Pass::forward, false, [](AttentionParams& a) { a.v.shape[0] = 1; }, "v", "(batch) = 2"},
    {"VSeqlen", Pass::forward, false, [](AttentionParams& a) { a.v.shape[1] = 6; }, "v",
     "shape[1] (seqlen_k) = 7 (from k), got 6"},
    {"VHeads", Pass::forward, false, [](AttentionParams& a) { a.v.shape[2] = 1; }, "v",
     "shape[2] (num_heads_k) = 2 (from k), got 1"},
    {"OutSeqlen", Pass::forward, false, [](AttentionParams& a) { a.out.shape[1] = 4; }, "out",
     "shape[1] (seqlen_q) = 5 (from q), got 4"},
    {"OutHeads", Pass::forward, false, [](AttentionParams& a) { a.out.shape[2] = 2; }, "out",
     "(num_heads) = 4 (from q), got 2"},
    {"OutHeadDimV", Pass::forward, false, [](AttentionParams& a) { a.out.shape[3] = 8; }, "out",
     "shape[3] (head_dim_v) = 6 (from v), got 8"},
    {"LseBatch", Pass::forward, false, [](AttentionParams& a) { a.lse.shape[0] = 3; }, "lse", "(batch) = 2"},
    {"LseHeads", Pass::forward, false, [](AttentionParams& a) { a.lse.shape[1] = 2; }, "lse", "(num_heads) = 4"},
    {"LseSeqlen", Pass::forward, false, [](AttentionParams& a) { a.lse.shape[2] = 7; }, "lse",
     "shape[2] (seqlen_q) = 5"},
    {"DoutShape", Pass::backward, false, [](AttentionParams& a) { a.dout.shape[3] = 5; }, "dout",
     "shape[3] (head_dim_v) = 6 (same as out), got 5"},
    {"DqShape", Pass::backward, false, [](AttentionParams& a) { a.dq.shape[1] = 4; }, "dq",
     "shape[1] (seqlen_q) = 5 (same as q), got 4"},
    {"DkShape", Pass::backward, false, [](AttentionParams& a) { a.dk.shape[2] = 4; }, "dk",
     "shape[2] (num_heads_k) = 2 (same as k), got 4"},
    {"DvShape", Pass::backward, false, [](AttentionParams& a) { a.dv.shape[0] = 1; }, "dv",
     "shape[0] (batch) = 2 (same as v), got 1"},
    {"VarlenOutRows", Pass::forward, true, [](AttentionParams& a) { a.out.shape[0] = 6; }, "out",
     "shape[0] (total_q) = 7 (from q), got 6"},
    {"VarlenLseShape", Pass::forward, true, [](AttentionParams& a) { a.lse.shape[1] = 8; }, "lse",
     "shape[1] (total_q) = 7"},
    {"VarlenKRows", Pass::forward, true, [](AttentionParams& a) { a.v.shape[0] = 5; }, "v",
     "shape[0] (total_k) = 7 (from k), got 5"},
    // cu_seqlens contents (host tensors).
    // Two lengths that differ: neither is "the" batch, so the message names both.
    {"CuSeqlensShapeMismatch", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_k.shape[0] = 3; },
     "cu_seqlens_q, cu_seqlens_k", "the same length (batch + 1), got 4 and 3"},
    {"CuSeqlensQBatchZeroKNot", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_q.shape[0] = 1; },
     "cu_seqlens_q, cu_seqlens_k", "the same length (batch + 1), got 1 and 4"},
    {"CuSeqlensKEmpty", Pass::backward, true, [](AttentionParams& a) { a.cu_seqlens_k.shape[0] = 0; },
     "cu_seqlens_k", "at least 1 element, got [0]"},
    {"CuSeqlensEmpty", Pass::forward, true,
     [](AttentionParams& a) {
       a.cu_seqlens_q.shape[0] = 0;
       a.cu_seqlens_k.shape[0] = 0;
     },
     "cu_seqlens_q", "at least 1 element"},
    {"CuSeqlensRank2", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_q.ndim = 2; }, "cu_seqlens_q",
     "expected rank 1"},
    {"CuSeqlensStart", Pass::forward, true, [](AttentionParams& a) { cu_q(a)[0] = 1; }, "cu_seqlens_q",
     "element 0 = 0, got 1"},
    {"CuSeqlensDecreasing", Pass::forward, true, [](AttentionParams& a) { cu_k(a)[1] = 8; }, "cu_seqlens_k",
     "non-decreasing values, got element 2 = 7 < element 1 = 8"},
    {"CuSeqlensLastQ", Pass::forward, true, [](AttentionParams& a) { cu_q(a)[3] = 6; }, "cu_seqlens_q",
     "last element = 7 (total_q = q.shape[0]), got 6"},
    {"CuSeqlensLastK", Pass::forward, true, [](AttentionParams& a) { cu_k(a)[3] = 9; }, "cu_seqlens_k",
     "last element = 7 (total_k = k.shape[0]), got 9"},
    {"CuSeqlensNull", Pass::forward, true, [](AttentionParams& a) { a.cu_seqlens_q.data = nullptr; },
     "cu_seqlens_q", "got nullptr"},
    {"MaxSeqlenQTooSmall", Pass::forward, true, [](AttentionParams& a) { a.max_seqlen_q = 3; }, "max_seqlen_q",
     "0 or >= the longest sequence (4), got 3"},
    {"MaxSeqlenKTooSmall", Pass::backward, true, [](AttentionParams& a) { a.max_seqlen_k = 1; }, "max_seqlen_k",
     "longest sequence (5), got 1"},
    {"MaxSeqlenNegative", Pass::forward, false, [](AttentionParams& a) { a.max_seqlen_q = -1; }, "max_seqlen_q",
     ">= 0 (0 = derive), got -1"},
    {"MaxSeqlenBatchedTooSmall", Pass::forward, false, [](AttentionParams& a) { a.max_seqlen_k = 6; },
     "max_seqlen_k", "(7), got 6"},
    // Scalars.
    {"WindowLeft", Pass::forward, false, [](AttentionParams& a) { a.window_size_left = -2; }, "window_size_left",
     ">= -1 (-1 = unbounded), got -2"},
    {"WindowRight", Pass::backward, false, [](AttentionParams& a) { a.window_size_right = -5; },
     "window_size_right", "got -5"},
    {"CausalWithWindowRight", Pass::forward, false,
     [](AttentionParams& a) {
       a.causal = true;
       a.window_size_right = 3;
     },
     "window_size_right", "-1 or 0 with causal = true"},
    {"CausalAlignUnknown", Pass::forward, false,
     [](AttentionParams& a) { a.causal_align = static_cast<CausalAlign>(2); }, "causal_align", "got enum value 2"},
    {"SoftcapNegative", Pass::forward, false, [](AttentionParams& a) { a.softcap = -1.0f; }, "softcap",
     "finite value >= 0 (0 = off), got -1"},
    {"SoftcapNaN", Pass::forward, false, [](AttentionParams& a) { a.softcap = std::nanf(""); }, "softcap", "got nan"},
    {"SoftcapInf", Pass::backward, false,
     [](AttentionParams& a) { a.softcap = std::numeric_limits<float>::infinity(); }, "softcap", "got inf"},
    {"ScaleNaN", Pass::forward, false, [](AttentionParams& a) { a.softmax_scale = std::nanf(""); }, "softmax_scale",
     "finite value (0 = 1/sqrt(head_dim)), got nan"},
    {"ScaleInf", Pass::forward, false,
     [](AttentionParams& a) { a.softmax_scale = -std::numeric_limits<float>::infinity(); }, "softmax_scale",
     "got -inf"},
    // Denormal scale or softcap: every score underflows, or 1/softcap is inf and every row masked.
    {"ScaleDenormal", Pass::forward, false, [](AttentionParams& a) { a.softmax_scale = 1e-40f; }, "softmax_scale",
     "|softmax_scale| >= 1.1754944e-38 (FLT_MIN; smaller values are denormal), got 1e-40"},
    {"ScaleDenormalNegative", Pass::backward, false, [](AttentionParams& a) { a.softmax_scale = -1e-45f; },
     "softmax_scale", "got -1e-45"},
    {"SoftcapDenormal", Pass::forward, false, [](AttentionParams& a) { a.softcap = 1e-45f; }, "softcap",
     "expected 0 (off) or a positive finite value with a finite reciprocal, got 1e-45"},
    {"SoftcapReciprocalOverflows", Pass::backward, false, [](AttentionParams& a) { a.softcap = 2e-39f; }, "softcap",
     "finite reciprocal, got 2e-39"},
    // Fixed bug: a finite 1/softcap times a moderate scale overflowed to inf: NaN out, lse and
    // gradients with a success status.
    {"SoftcapScaleRatioOverflows", Pass::forward, false,
     [](AttentionParams& a) {
       a.softmax_scale = 1000.0f;
       a.softcap = 1e-36f;
     },
     "softcap", "softmax_scale / softcap finite in float32 (the scores are scaled by it before tanh), got "
                "softmax_scale = 1000 and softcap = 1e-36"},
    // Fixed bug: a ratio below FLT_MIN (each value fine alone) gave the CPU backward NaN dK
    // (softmax_scale / 0) or an inaccurate one (Q's digits lost to denormals).
    {"SoftcapScaleRatioUnderflows", Pass::backward, false,
     [](AttentionParams& a) {
       a.softmax_scale = 1e-8f;
       a.softcap = 1e38f;
     },
     "softcap", "|softmax_scale / softcap| >= 1.1754944e-38 (FLT_MIN: the scores are scaled by it before tanh, and "
                "smaller values are denormal; softcap = 0 turns capping off), got softmax_scale = 1e-08 and "
                "softcap = 1e+38"},
    {"SoftcapScaleRatioDenormal", Pass::forward, false,
     [](AttentionParams& a) {
       a.softmax_scale = 1e-6f;
       a.softcap = 1e38f;
     },
     "softcap", "got softmax_scale = 1e-06 and softcap = 1e+38"},
    // Fixed bugs: pointers off their element size reached the kernels (UBSan: misaligned loads and
    // stores on the CPU; a misaligned-address fault on the GPU).
    // Fixed bug: a NaN or infinite slope gave NaN outputs with a success status.
    {"AlibiNaN", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[4] = {0.5f, NAN, 0.25f, 0.125f};
       a.alibi_slopes = make_tensor(slopes, DType::f32, {4});
     },
     "alibi_slopes", "expected finite values, got nan at element [1]"},
    {"AlibiInfBatch", Pass::backward, false,
     [](AttentionParams& a) {
       static float slopes[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, -INFINITY, 0.5f};
       a.alibi_slopes = make_tensor(slopes, DType::f32, {2, 4});
     },
     "alibi_slopes", "got -inf at element [1, 2]"},
    {"MisalignedQ", Pass::forward, false, [](AttentionParams& a) { a.q.data = static_cast<char*>(a.q.data) + 2; },
     "q", "data pointer aligned to 4 bytes (the fp32 element size), got address"},
    {"MisalignedLse", Pass::forward, false,
     [](AttentionParams& a) { a.lse.data = static_cast<char*>(a.lse.data) + 2; }, "lse", "aligned to 4 bytes"},
    {"MisalignedDk", Pass::backward, false,
     [](AttentionParams& a) { a.dk.data = static_cast<char*>(a.dk.data) + 1; }, "dk", "aligned to 4 bytes"},
    {"MisalignedCuSeqlens", Pass::forward, true,
     [](AttentionParams& a) { a.cu_seqlens_k.data = static_cast<char*>(a.cu_seqlens_k.data) + 2; }, "cu_seqlens_k",
     "aligned to 4 bytes (the int32 element size)"},
    {"MisalignedAlibi", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[5];
       a.alibi_slopes = make_tensor(reinterpret_cast<char*>(slopes) + 2, DType::f32, {4});
     },
     "alibi_slopes", "aligned to 4 bytes"},
    // Fixed bug: only equal start pointers were refused, so dk one element after dq was accepted
    // and both were written over each other.
    {"DkInsideDqFirstRow", Pass::backward, false,
     [](AttentionParams& a) { a.dk.data = static_cast<float*>(a.dq.data) + 1; }, "dk",
     "disjoint from dq (each output written once), got a data pointer 4 bytes after dq's, inside the first row of dq"},
    {"DqInsideDvFirstRow", Pass::backward, false,
     [](AttentionParams& a) { a.dq.data = static_cast<float*>(a.dv.data) + 5; }, "dv",
     "got a data pointer 20 bytes before dq's, inside the first row of dv"},
    // Fixed bug: outputs that started past the other's first row but inside its span were
    // accepted, and their shared elements written twice (gradients silently wrong). dq is dense
    // [2, 5, 4, 8]: dk one head later, dv one sequence row later.
    {"DkNextHeadOfDq", Pass::backward, false,
     [](AttentionParams& a) { a.dk.data = static_cast<float*>(a.dq.data) + 8; }, "dk",
     "disjoint from dq (each output written once), got views that share elements (dk starts 32 bytes from dq)"},
    {"DvNextRowOfDq", Pass::backward, false,
     [](AttentionParams& a) { a.dv.data = static_cast<float*>(a.dq.data) + 32; }, "dv",
     "got views that share elements (dv starts 128 bytes from dq)"},
    {"NumThreads", Pass::forward, false, [](AttentionParams& a) { a.num_threads = -1; }, "num_threads",
     ">= 0 (0 = all hardware threads), got -1"},
    {"AlibiShape", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[5];
       a.alibi_slopes = make_tensor(slopes, DType::f32, {5});
     },
     "alibi_slopes", "shape[0] (num_heads) = 4 (from q), got 5"},
    {"AlibiBatchShape", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[12];
       a.alibi_slopes = make_tensor(slopes, DType::f32, {3, 4});
     },
     "alibi_slopes", "shape[0] (batch) = 2 (from q), got 3"},
    {"AlibiRank3", Pass::forward, false,
     [](AttentionParams& a) {
       static float slopes[8];
       a.alibi_slopes = make_tensor(slopes, DType::f32, {1, 2, 4});
     },
     "alibi_slopes", "rank 1 [num_heads] or rank 2 [batch, num_heads], got rank 3"},
    {"AlibiNull", Pass::forward, false,
     [](AttentionParams& a) { a.alibi_slopes = make_tensor(nullptr, DType::f32, {4}); }, "alibi_slopes",
     "got nullptr"},
    // Aliasing: an output overlapping an input.
    {"OutAliasesQ", Pass::forward, false, [](AttentionParams& a) { a.out.data = a.q.data; }, "out",
     "memory disjoint from q (an output must not alias an input), got overlapping byte ranges"},
    {"LseAliasesV", Pass::forward, false,
     [](AttentionParams& a) { a.lse.data = static_cast<char*>(a.v.data) + 4; }, "lse", "disjoint from v"},
    // (The smaller view moves inside the larger one's storage, so nothing else can overlap.)
    {"DqAliasesDout", Pass::backward, false, [](AttentionParams& a) { a.dout.data = a.dq.data; }, "dq",
     "disjoint from dout"},
    {"DvAliasesLse", Pass::backward, false, [](AttentionParams& a) { a.lse.data = a.dv.data; }, "dv",
     "disjoint from lse"},
    // Outputs overlapping themselves. Base strides: out [120, 24, 6, 1], lse [20, 5, 1],
    // dq [160, 32, 8, 1], dv [84, 12, 6, 1]; varlen dk [16, 8, 1].
    {"OutStrideZero", Pass::forward, false, [](AttentionParams& a) { a.out.stride[1] = 0; }, "out",
     "expected nested strides, each at least the span of the dims with smaller strides (so that each element is "
     "written once), got stride[1] = 0 for shape[1] = 5"},
    {"OutStridesInterleave", Pass::forward, false, [](AttentionParams& a) { a.out.stride[2] = 3; }, "out",
     "got stride[2] = 3 for shape[2] = 4, inside the 6 elements spanned by the dims with smaller strides"},
    {"LseStrideZero", Pass::forward, false, [](AttentionParams& a) { a.lse.stride[0] = 0; }, "lse",
     "(so that each element is written once), got stride[0] = 0 for shape[0] = 2"},
    {"DqBatchStrideInsideRows", Pass::backward, false, [](AttentionParams& a) { a.dq.stride[0] = 10; }, "dq",
     "got stride[0] = 10 for shape[0] = 2, inside the 32 elements"},
    {"DkStrideZeroVarlen", Pass::backward, true, [](AttentionParams& a) { a.dk.stride[1] = 0; }, "dk",
     "got stride[1] = 0 for shape[1] = 2"},
    {"DvEqualStrides", Pass::backward, false, [](AttentionParams& a) { a.dv.stride[1] = 6; }, "dv",
     "got stride[1] = 6 for shape[1] = 7, inside the 12 elements"},
    // Outputs overlapping each other.
    {"LseOverlapsOut", Pass::forward, false,
     [](AttentionParams& a) { a.lse.data = static_cast<float*>(a.out.data) + 100; }, "lse",
     "memory disjoint from out (each output written once), got overlapping byte ranges"},
    {"DkSameAsDq", Pass::backward, false, [](AttentionParams& a) { a.dk.data = a.dq.data; }, "dk",
     "memory disjoint from dq (each output written once), got the same data pointer"},
    {"DvSameAsDq", Pass::backward, true, [](AttentionParams& a) { a.dv.data = a.dq.data; }, "dv",
     "disjoint from dq"},
    {"DvSameAsDk", Pass::backward, false, [](AttentionParams& a) { a.dv.data = a.dk.data; }, "dv",
     "disjoint from dk (each output written once), got the same data pointer"},
    {"DkAliasesCuSeqlens", Pass::backward, true,
     [](AttentionParams& a) {
       // cu_seqlens_k moved (valid contents) into dk's own storage.
       int32_t* inside_dk = static_cast<int32_t*>(a.dk.data);
       for (int i = 0; i < 4; ++i) inside_dk[i] = cu_k(a)[i];
       a.cu_seqlens_k.data = inside_dk;
     },
     "dk", "disjoint from cu_seqlens_k"},
};

// plan() refuses `a` with a reason that starts "<argument>: expected", contains `contains` and
// "got"; the call throws the same reason; the outputs (poisoned by Problem) are bitwise untouched.
void expect_refused_by_name(const Problem& pr, const AttentionParams& a, Pass pass, const char* argument,
                            const char* contains) {
  const std::string prefix = std::string(argument) + ": expected";
  const Plan pl = plan(a, pass);
  EXPECT_FALSE(pl.ok);
  EXPECT_EQ(pl.reason.rfind(prefix, 0), 0u) << "reason: " << pl.reason;
  EXPECT_NE(pl.reason.find(contains), std::string::npos) << "reason: " << pl.reason;
  EXPECT_NE(pl.reason.find("got"), std::string::npos) << "reason: " << pl.reason;

  const HostTensor out0 = pr.out, lse0 = pr.lse, dq0 = pr.dq, dk0 = pr.dk, dv0 = pr.dv;
  try {
    if (pass == Pass::forward) forward(a); else backward(a);
    ADD_FAILURE() << "expected flashattn::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), pl.reason) << "plan() and the call must give the same reason";
  }
  EXPECT_TRUE(pr.out.bitwise_equal(out0));
  EXPECT_TRUE(pr.lse.bitwise_equal(lse0));
  EXPECT_TRUE(pr.dq.bitwise_equal(dq0));
  EXPECT_TRUE(pr.dk.bitwise_equal(dk0));
  EXPECT_TRUE(pr.dv.bitwise_equal(dv0));
}

class ValidationError : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ValidationError, NamesArgumentAndWritesNothing) {
  const ErrorCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(base_config(c.varlen), seed);
  AttentionParams a = pr.params();
  c.mutate(a);
  expect_refused_by_name(pr, a, c.pass, c.argument, c.contains);
}

INSTANTIATE_TEST_SUITE_P(All, ValidationError, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) { return std::string(info.param.name); });

// ------------------------------------------------------------------------------------------------
// The FP8 (e4m3) forward's arguments (FlashAttention-3 Sec. 3.3). Base call: q [2, 5, 4, 128],
// k [2, 7, 2, 128], v [2, 7, 2, 128] e4m3, out bf16, lse, descales [2, 2] float32, all on the CPU
// (validate() accepts them there; only the CPU backend refuses e4m3).

ProblemConfig fp8_config() {
  ProblemConfig c = ProblemConfig::batched(DType::e4m3, 2, 5, 7, 4, 2, 128);
  c.descale = Descale::per_head;
  return c;
}

struct Fp8ErrorCase {
  const char* name;
  Pass pass;
  void (*configure)(ProblemConfig&);  // nullptr: fp8_config() as is
  Mutation mutate;                    // nullptr: none
  const char* argument;
  const char* contains;
};

void PrintTo(const Fp8ErrorCase& c, std::ostream* os) { *os << c.name; }

const Fp8ErrorCase kFp8Cases[] = {
    {"KFp16", Pass::forward, nullptr, [](AttentionParams& a) { a.k.dtype = DType::f16; }, "k",
     "dtype e4m3 (same as q), got fp16"},
    {"VBf16", Pass::forward, nullptr, [](AttentionParams& a) { a.v.dtype = DType::bf16; }, "v",
     "dtype e4m3 (same as q), got bf16"},
    {"OutFp16", Pass::forward, nullptr, [](AttentionParams& a) { a.out.dtype = DType::f16; }, "out",
     "dtype bf16 (the output of the e4m3 forward, as FlashAttention-3's), got fp16"},
    {"OutE4m3", Pass::forward, nullptr, [](AttentionParams& a) { a.out.dtype = DType::e4m3; }, "out",
     "dtype bf16 (the output of the e4m3 forward, as FlashAttention-3's), got e4m3"},
    {"QDescaleFp16", Pass::forward, nullptr, [](AttentionParams& a) { a.q_descale.dtype = DType::f16; }, "q_descale",
     "dtype fp32 (float32 dequantization factors), got fp16"},
    {"KDescaleBf16Scalar", Pass::forward, [](ProblemConfig& c) { c.descale = Descale::scalar; },
     [](AttentionParams& a) { a.k_descale.dtype = DType::bf16; }, "k_descale", "dtype fp32"},
    {"KDescaleWrongBatch", Pass::forward, nullptr, [](AttentionParams& a) { a.k_descale.shape[0] = 3; }, "k_descale",
     "shape[0] (batch) = 2 (from q), got 3 in shape [3, 2]"},
    {"VDescaleWrongHeads", Pass::forward, nullptr, [](AttentionParams& a) { a.v_descale.shape[1] = 4; }, "v_descale",
     "shape[1] (num_heads_k) = 2 (from k), got 4"},
    {"QDescaleNumHeadsNotNumHeadsK", Pass::forward, nullptr,
     [](AttentionParams& a) {
       a.q_descale.shape[1] = 4;  // [batch, num_heads]: FA-3's descales are per KV head
       a.q_descale.stride[0] = 4;
     },
     "q_descale", "(num_heads_k) = 2 (from k), got 4"},
    {"QDescaleRank3", Pass::forward, nullptr,
     [](AttentionParams& a) {
       a.q_descale.ndim = 3;
       a.q_descale.shape[2] = 1;
     },
     "q_descale", "one value (rank 0, or shape [1]) or shape [batch, num_heads_k] = [2, 2], got shape [2, 2, 1]"},
    {"VDescaleShape2", Pass::forward, [](ProblemConfig& c) { c.descale = Descale::per_tensor; },
     [](AttentionParams& a) { a.v_descale.shape[0] = 2; }, "v_descale", "got shape [2]"},
    {"KDescaleNdimNegative", Pass::forward, nullptr, [](AttentionParams& a) { a.k_descale.ndim = -1; }, "k_descale",
     "got ndim -1"},
    {"QDescaleOnCuda", Pass::forward, nullptr, [](AttentionParams& a) { a.q_descale.device = Device::cuda; },
     "q_descale", "device cpu:0 (same as q), got cuda:0"},
    {"VDescaleDeviceIndex", Pass::forward, nullptr, [](AttentionParams& a) { a.v_descale.device_index = 1; },
     "v_descale", "device cpu:0 (same as q), got cpu:1"},
    {"KDescaleNegativeStride", Pass::forward, nullptr, [](AttentionParams& a) { a.k_descale.stride[0] = -2; },
     "k_descale", "stride[0] >= 0 (0 broadcasts), got -2"},
    {"QDescaleStrideOverflow", Pass::forward, nullptr,
     [](AttentionParams& a) { a.q_descale.stride[0] = std::numeric_limits<int64_t>::max() / 2; }, "q_descale",
     "overflows int64"},
    {"VDescaleNull", Pass::forward, nullptr, [](AttentionParams& a) { a.v_descale.data = nullptr; }, "v_descale",
     "a data pointer for shape [2, 2], got nullptr"},
    {"KDescaleMisaligned", Pass::forward, nullptr,
     [](AttentionParams& a) { a.k_descale.data = static_cast<char*>(a.k_descale.data) + 2; }, "k_descale",
     "aligned to 4 bytes"},
    {"OutAliasesQDescale", Pass::forward, nullptr, [](AttentionParams& a) { a.q_descale.data = a.out.data; }, "out",
     "memory disjoint from q_descale (an output must not alias an input)"},
    {"LseAliasesScalarVDescale", Pass::forward, [](ProblemConfig& c) { c.descale = Descale::scalar; },
     [](AttentionParams& a) { a.v_descale.data = static_cast<float*>(a.lse.data) + 3; }, "lse",
     "disjoint from v_descale"},
    {"Backward", Pass::backward, nullptr, nullptr, "q",
     "fp32, fp16 or bf16 in the backward (e4m3 inputs have a forward pass only"},
    {"Varlen", Pass::forward,
     [](ProblemConfig& c) {
       c.lens_q = {3, 4};
       c.lens_k = {5, 2};
       c.descale = Descale::none;
     },
     nullptr, "cu_seqlens_q", "none with q in e4m3 (the FP8 forward runs batched only for now, no varlen)"},
    {"HeadDim64", Pass::forward, [](ProblemConfig& c) { c.head_dim = 64; }, nullptr, "q",
     "shape[3] (head_dim) = 128 with e4m3 inputs (the only FP8 head_dim for now), got 64"},
    {"HeadDimV64", Pass::forward, [](ProblemConfig& c) { c.head_dim_v = 64; }, nullptr, "v",
     "shape[3] (head_dim_v) = 128 with e4m3 inputs (the only FP8 head_dim for now), got 64"},
    {"HeadDim256", Pass::forward, [](ProblemConfig& c) { c.head_dim = 256; }, nullptr, "q", "got 256"},
    // Descales belong to e4m3 inputs only.
    {"DescaleForBf16", Pass::forward, [](ProblemConfig& c) { c.dtype = DType::bf16; }, nullptr, "q_descale",
     "none (descales apply to e4m3 inputs only, FlashAttention-3's FP8 forward), got a tensor with q in bf16"},
    {"ScalarDescaleForFp16", Pass::forward,
     [](ProblemConfig& c) {
       c.dtype = DType::f16;
       c.descale = Descale::scalar;
     },
     nullptr, "q_descale", "got a tensor with q in fp16"},
    {"VDescaleOnlyForFp32Backward", Pass::backward, [](ProblemConfig& c) { c.dtype = DType::f32; },
     [](AttentionParams& a) { a.q_descale = a.k_descale = {}; }, "v_descale", "got a tensor with q in fp32"},
    // The CPU backend has no FP8 kernel: plan() says so, forward() throws it.
    {"OnCpu", Pass::forward, nullptr, nullptr, "q",
     "a CUDA tensor for e4m3 (the FP8 forward runs only on the CUDA backend, sm_90), got a CPU tensor"},
    {"OnCpuWithoutDescales", Pass::forward, [](ProblemConfig& c) { c.descale = Descale::none; }, nullptr, "q",
     "got a CPU tensor"},
};

class Fp8ValidationError : public ::testing::TestWithParam<Fp8ErrorCase> {};

TEST_P(Fp8ValidationError, NamesArgumentAndWritesNothing) {
  const Fp8ErrorCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  ProblemConfig cfg = fp8_config();
  if (c.configure) c.configure(cfg);
  Problem pr(cfg, seed);
  AttentionParams a = pr.params();
  if (c.mutate) c.mutate(a);
  expect_refused_by_name(pr, a, c.pass, c.argument, c.contains);
}

INSTANTIATE_TEST_SUITE_P(All, Fp8ValidationError, ::testing::ValuesIn(kFp8Cases),
                         [](const ::testing::TestParamInfo<Fp8ErrorCase>& info) { return std::string(info.param.name); });

// validate() fills out_dtype and the descales (the CUDA kernel reads these fields by name).
TEST(Fp8Validation, FillsOutDtypeAndDescales) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Problem pr(ProblemConfig::batched(dt, 2, 5, 7, 4, 2, 8), 1);
    const detail::Params p = detail::validate(pr.params(), Pass::forward);
    EXPECT_EQ(p.out_dtype, dt);
    EXPECT_EQ(p.q_descale, nullptr);
    EXPECT_EQ(p.k_descale, nullptr);
    EXPECT_EQ(p.v_descale, nullptr);
  }
  for (Descale ds : {Descale::none, Descale::scalar, Descale::per_tensor, Descale::per_head}) {
    ProblemConfig c = fp8_config();
    c.descale = ds;
    Problem pr(c, 1);
    const AttentionParams a = pr.params();
    const detail::Params p = detail::validate(a, Pass::forward);
    EXPECT_EQ(p.dtype, DType::e4m3);
    EXPECT_EQ(p.out_dtype, DType::bf16);
    const float* ptrs[3] = {p.q_descale, p.k_descale, p.v_descale};
    const int64_t bs[3] = {p.q_descale_batch_stride, p.k_descale_batch_stride, p.v_descale_batch_stride};
    const int64_t hs[3] = {p.q_descale_head_stride, p.k_descale_head_stride, p.v_descale_head_stride};
    const TensorView* views[3] = {&a.q_descale, &a.k_descale, &a.v_descale};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(ptrs[i], ds == Descale::none ? nullptr : views[i]->data) << i;
      EXPECT_EQ(bs[i], ds == Descale::per_head ? 2 : 0) << i;  // [batch, num_heads_k] contiguous
      EXPECT_EQ(hs[i], ds == Descale::per_head ? 1 : 0) << i;
    }
  }
}

// FA-3 takes descales of any strides: a per-head factor broadcast over the batch (stride 0), a
// per-batch one broadcast over the heads, a transposed [num_heads_k, batch] buffer; size-1 dims
// get stride 0 whatever stride they came with.
TEST(Fp8Validation, DescalesTakeAnyStrides) {
  Problem pr(fp8_config(), 1);
  float buf[4] = {0.5f, 1.0f, 1.5f, 2.0f};
  AttentionParams a = pr.params();
  a.q_descale.data = buf;
  a.q_descale.stride[0] = 0;  // [batch, num_heads_k] broadcast over the batch
  a.q_descale.stride[1] = 1;
  a.k_descale.data = buf;
  a.k_descale.stride[0] = 1;  // broadcast over the heads: last stride 0 is fine here
  a.k_descale.stride[1] = 0;
  a.v_descale.data = buf;
  a.v_descale.stride[0] = 1;  // transposed
  a.v_descale.stride[1] = 2;
  detail::Params p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.q_descale_batch_stride, 0);
  EXPECT_EQ(p.q_descale_head_stride, 1);
  EXPECT_EQ(p.k_descale_batch_stride, 1);
  EXPECT_EQ(p.k_descale_head_stride, 0);
  EXPECT_EQ(p.v_descale_batch_stride, 1);
  EXPECT_EQ(p.v_descale_head_stride, 2);
  a.q_descale.ndim = 1;  // shape [1] with a stray stride
  a.q_descale.shape[0] = 1;
  a.q_descale.stride[0] = 7;
  p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.q_descale, buf);
  EXPECT_EQ(p.q_descale_batch_stride, 0);
  EXPECT_EQ(p.q_descale_head_stride, 0);
}

// The test support's FP8 pieces on the CPU: the float64 reference reads e4m3 inputs times their
// descales (checked against the same problem in fp32 holding the products), and the FA-3 emulation
// (the FP8 criterion's naive formula) is close to it but not equal (P is rounded to e4m3).
TEST(Fp8Validation, ReferenceAppliesDescalesAndEmulationIsClose) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  ProblemConfig c = fp8_config();
  c.seqlen_q = 33;
  c.seqlen_k = 70;
  c.causal = true;
  Problem pr(c, seed);
  const detail::Params p = detail::validate(pr.params(), Pass::forward);
  std::vector<double> ref_out(static_cast<size_t>(2 * 33 * 4 * 128)), ref_lse(static_cast<size_t>(4 * 2 * 33));
  reference::forward(p, reference::Precision::f64, ref_out.data(), ref_lse.data());

  ProblemConfig c32 = c;
  c32.dtype = DType::f32;
  c32.descale = Descale::none;
  Problem pr32(c32, seed);
  const std::vector<double> q = pr.q.to_dense(), k = pr.k.to_dense(), v = pr.v.to_dense();
  const std::vector<double> qd = pr.descale(0).to_dense(), kd = pr.descale(1).to_dense(), vd = pr.descale(2).to_dense();
  auto scaled = [](const std::vector<double>& x, const std::vector<double>& d, int64_t heads, int64_t rows) {
    std::vector<double> y(x.size());
    const int64_t dim = 128, group = heads / 2;
    for (size_t e = 0; e < x.size(); ++e) {
      const int64_t h = static_cast<int64_t>(e) / dim % heads, b = static_cast<int64_t>(e) / (dim * heads * rows);
      y[e] = x[e] * d[static_cast<size_t>(b * 2 + h / group)];  // products of e4m3 and fp32: exact in fp64
    }
    return y;
  };
  pr32.q.set(scaled(q, qd, 4, 33));
  pr32.k.set(scaled(k, kd, 2, 70));
  pr32.v.set(scaled(v, vd, 2, 70));
  const DenseResults& r32 = pr32.reference(reference::Precision::f64, false);
  double diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) {
    diff = std::max(diff, std::fabs(ref_out[i] - r32.out[i]));
    max_ref = std::max(max_ref, std::fabs(ref_out[i]));
  }
  EXPECT_GT(max_ref, 0.1);
  EXPECT_LT(diff, 1e-6 * max_ref) << "reference on e4m3 + descales vs fp32 products (rounded to fp32 there)";

  std::vector<double> emu_out(ref_out.size()), emu_lse(ref_lse.size());
  fp8_emulated_forward(p, emu_out.data(), emu_lse.data());
  double emu_err = 0, lse_err = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) emu_err = std::max(emu_err, std::fabs(emu_out[i] - ref_out[i]));
  for (size_t i = 0; i < ref_lse.size(); ++i) lse_err = std::max(lse_err, std::fabs(emu_lse[i] - ref_lse[i]));
  EXPECT_GT(emu_err, 0.0);
  EXPECT_LT(emu_err, 0.1 * max_ref);  // P in e4m3: a few per cent at most
  EXPECT_LT(lse_err, 1e-4 * max_abs({&ref_lse}));
}

TEST(Validation, InvalidPassEnum) {
  Problem pr(base_config(false), 1);
  const Plan pl = plan(pr.params(), static_cast<Pass>(7));
  EXPECT_FALSE(pl.ok);
  EXPECT_EQ(pl.reason.rfind("pass: expected forward or backward", 0), 0u) << pl.reason;
}

// ------------------------------------------------------------------------------------------------
// Valid calls.

TEST(Validation, PlanNamesAKernelForValidCalls) {
  for (bool varlen : {false, true}) {
    Problem pr(base_config(varlen), 1);
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const Plan pl = plan(pr.params(), pass);
      EXPECT_TRUE(pl.ok) << pl.reason;
      EXPECT_FALSE(pl.kernel.empty());
      EXPECT_TRUE(pl.reason.empty());
    }
  }
}

TEST(Validation, ForwardIgnoresBackwardTensors) {
  Problem pr(base_config(false), 1);
  AttentionParams a = pr.params();
  a.dq.dtype = DType::i32;   // would be rejected by the backward
  a.dk = {};
  a.dout.device = Device::cuda;
  a.dv.ndim = 9;
  EXPECT_TRUE(plan(a, Pass::forward).ok) << plan(a, Pass::forward).reason;
  EXPECT_FALSE(plan(a, Pass::backward).ok);
  const detail::Params p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.dout, nullptr);
  EXPECT_EQ(p.dq, nullptr);
}

TEST(Validation, LseIsOptionalInTheForward) {
  ProblemConfig c = base_config(false);
  c.with_lse = false;
  Problem pr(c, 1);
  const detail::Params p = detail::validate(pr.params(), Pass::forward);
  EXPECT_EQ(p.lse, nullptr);
}

TEST(Validation, ResolvesMaskAndScale) {
  ProblemConfig c = base_config(false);
  c.causal = true;
  c.window_size_left = 3;
  c.align = CausalAlign::top_left;
  Problem pr(c, 1);
  detail::Params p = detail::validate(pr.params(), Pass::forward);
  EXPECT_EQ(p.window_size_left, 3);
  EXPECT_EQ(p.window_size_right, 0);
  EXPECT_FALSE(p.align_bottom_right);
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.0f / std::sqrt(8.0f));
  EXPECT_EQ(p.softcap, 0.0f);

  AttentionParams a = pr.params();
  a.causal = false;
  a.window_size_left = -1;
  a.window_size_right = 5;
  a.causal_align = CausalAlign::bottom_right;
  a.softmax_scale = 0.25f;
  a.softcap = 30.0f;
  a.num_threads = 3;
  a.deterministic = true;
  p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.window_size_left, -1);
  EXPECT_EQ(p.window_size_right, 5);
  EXPECT_TRUE(p.align_bottom_right);
  EXPECT_EQ(p.softmax_scale, 0.25f);
  EXPECT_EQ(p.softcap, 30.0f);
  EXPECT_EQ(p.num_threads, 3);
  EXPECT_TRUE(p.deterministic);

  a.causal = true;
  a.window_size_right = 0;  // explicit 0 with causal is consistent
  EXPECT_EQ(detail::validate(a, Pass::forward).window_size_right, 0);
}

TEST(Validation, BatchedSizesAndStrides) {
  ProblemConfig c = base_config(false);
  c.layout = Layout::head_major;
  c.alibi = Alibi::per_batch_head;
  Problem pr(c, 1);
  const detail::Params p = detail::validate(pr.params(), Pass::backward);
  EXPECT_FALSE(p.is_varlen);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 5);
  EXPECT_EQ(p.seqlen_k, 7);
  EXPECT_EQ(p.num_heads, 4);
  EXPECT_EQ(p.num_heads_k, 2);
  EXPECT_EQ(p.head_dim, 8);
  EXPECT_EQ(p.head_dim_v, 6);
  EXPECT_EQ(p.dtype, DType::f32);
  EXPECT_EQ(p.q, pr.q.data());
  EXPECT_EQ(p.q_batch_stride, pr.q.stride()[0]);
  EXPECT_EQ(p.q_row_stride, pr.q.stride()[1]);
  EXPECT_EQ(p.q_head_stride, pr.q.stride()[2]);
  EXPECT_EQ(p.k_row_stride, pr.k.stride()[1]);
  EXPECT_EQ(p.v_head_stride, pr.v.stride()[2]);
  EXPECT_EQ(p.o_batch_stride, pr.out.stride()[0]);
  EXPECT_EQ(p.do_row_stride, pr.dout.stride()[1]);
  EXPECT_EQ(p.dq_head_stride, pr.dq.stride()[2]);
  EXPECT_EQ(p.dk_batch_stride, pr.dk.stride()[0]);
  EXPECT_EQ(p.dv_row_stride, pr.dv.stride()[1]);
  EXPECT_EQ(p.lse_batch_stride, pr.lse.stride()[0]);
  EXPECT_EQ(p.lse_head_stride, pr.lse.stride()[1]);
  EXPECT_EQ(p.lse_row_stride, 1);
  ASSERT_NE(p.alibi_slopes, nullptr);
  EXPECT_EQ(p.alibi_batch_stride, 4);
  EXPECT_EQ(p.q_len(1), 5);
  EXPECT_EQ(p.k_start(1), 0);
}

TEST(Validation, VarlenSizesAndStrides) {
  ProblemConfig c = base_config(true);
  c.alibi = Alibi::per_head;
  Problem pr(c, 1);
  AttentionParams a = pr.params();
  detail::Params p = detail::validate(a, Pass::forward);
  EXPECT_TRUE(p.is_varlen);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seqlen_q, 4);  // longest sequences, not the totals
  EXPECT_EQ(p.seqlen_k, 5);
  EXPECT_EQ(p.q_batch_stride, 0);
  EXPECT_EQ(p.q_row_stride, 32);
  EXPECT_EQ(p.q_head_stride, 8);
  EXPECT_EQ(p.lse_batch_stride, 0);
  EXPECT_EQ(p.lse_head_stride, 7);
  EXPECT_EQ(p.lse_row_stride, 1);
  EXPECT_EQ(p.alibi_batch_stride, 0);
  EXPECT_EQ(p.q_start(2), 3);
  EXPECT_EQ(p.q_len(1), 0);
  EXPECT_EQ(p.k_len(2), 0);
  a.max_seqlen_q = 4;  // exact hints are fine, larger ones too
  a.max_seqlen_k = 100;
  p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.seqlen_q, 4);
  EXPECT_EQ(p.seqlen_k, 5);
}

TEST(Validation, PackedOutputsMayShareABuffer) {
  // dq, dk, dv as interleaved views of one [batch, seqlen, 3, heads, dim] buffer (qkv-packed
  // layouts): their byte ranges overlap, their elements do not, so the call is valid.
  ProblemConfig c = base_config(false);
  c.seqlen_k = c.seqlen_q;
  c.num_heads_k = c.num_heads;
  c.head_dim_v = c.head_dim;
  Problem pr(c, 1);
  AttentionParams a = pr.params();
  std::vector<float> packed(static_cast<size_t>(2 * 5 * 3 * 4 * 8));
  TensorView* views[] = {&a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 3; ++i) {
    TensorView& t = *views[i];
    t.data = packed.data() + i * 4 * 8;
    t.stride[0] = 5 * 3 * 4 * 8;
    t.stride[1] = 3 * 4 * 8;
    t.stride[2] = 8;
    t.stride[3] = 1;
  }
  EXPECT_TRUE(plan(a, Pass::backward).ok) << plan(a, Pass::backward).reason;
}

TEST(Validation, AdjacentOutputsMayShareABuffer) {
  // dq and dk back to back in one allocation: dense, disjoint spans.
  Problem pr(base_config(false), 1);
  AttentionParams a = pr.params();
  std::vector<float> buf(static_cast<size_t>(a.dq.numel() + a.dk.numel()));
  a.dq.data = buf.data();
  a.dk.data = buf.data() + a.dq.numel();
  EXPECT_TRUE(plan(a, Pass::backward).ok) << plan(a, Pass::backward).reason;
  // One element further back, dk's first element is dq's last.
  a.dk.data = buf.data() + a.dq.numel() - 1;
  const Plan r = plan(a, Pass::backward);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("dk: expected memory disjoint from dq"), std::string::npos) << r.reason;
}

TEST(Validation, DenseOutputInsideAGappedOne) {
  // dq interleaved in a packed [batch, seqlen, 2, heads, dim] buffer; dk dense, placed over dq's
  // second row (inside dq's span, past its first row): the exact check finds the shared element.
  ProblemConfig c = base_config(false);
  c.seqlen_k = c.seqlen_q;
  c.num_heads_k = c.num_heads;
  Problem pr(c, 1);
  AttentionParams a = pr.params();
  std::vector<float> packed(static_cast<size_t>(2 * 5 * 2 * 4 * 8 + 2 * 5 * 4 * 8));
  a.dq.data = packed.data();
  a.dq.stride[0] = 5 * 2 * 4 * 8;
  a.dq.stride[1] = 2 * 4 * 8;
  a.dq.stride[2] = 8;
  a.dk.data = packed.data() + 2 * 4 * 8 - 4;  // ends inside dq's second row
  const Plan r = plan(a, Pass::backward);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("dk: expected memory disjoint from dq"), std::string::npos) << r.reason;
  // In the gap between dq's rows, but dk dense and longer than the gap: still shares elements.
  a.dk.data = packed.data() + 4 * 8;
  EXPECT_FALSE(plan(a, Pass::backward).ok);
}

// Fixed bug: two gapped views (neither dense) were not compared element by element, so dk placed
// one sequence row into dq's interleaved packing was accepted and rows were written twice.
TEST(Validation, GappedOutputsSharingAnElementAreRefused) {
  ProblemConfig c = base_config(false);
  c.seqlen_k = c.seqlen_q;
  c.num_heads_k = c.num_heads;
  c.head_dim_v = c.head_dim;
  Problem pr(c, fresh_seed());
  AttentionParams a = pr.params();
  // One packed dqkv [batch 2, seqlen 5, 3, heads 4, dim 8]: dq, dk, dv in slots 0, 1, 2 are valid.
  const int64_t row = 3 * 4 * 8;
  std::vector<float> packed(static_cast<size_t>(2 * 5 * row));
  for (TensorView* t : {&a.dq, &a.dk, &a.dv}) {
    t->stride[0] = 5 * row;
    t->stride[1] = row;
    t->stride[2] = 8;
  }
  a.dq.data = packed.data();
  a.dk.data = packed.data() + 4 * 8;
  a.dv.data = packed.data() + 2 * 4 * 8;
  EXPECT_TRUE(plan(a, Pass::backward).ok) << plan(a, Pass::backward).reason;
  // dk one sequence row further: its row (b, s) is dq's row (b, s + 1).
  a.dk.data = packed.data() + row;
  Plan r = plan(a, Pass::backward);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("dk: expected memory disjoint from dq (each output written once), got views that share "
                          "elements (dk starts 384 bytes from dq)"),
            std::string::npos)
      << r.reason;
  // dv over dq's rows of batch 1: shares them.
  a.dk.data = packed.data() + 4 * 8;
  a.dv.data = packed.data() + 5 * row;
  r = plan(a, Pass::backward);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("dv: expected memory disjoint from dq"), std::string::npos) << r.reason;
}

TEST(Validation, ViewsShareElementIsExact) {
  // Brute force against the search on small random nested layouts with gaps (one dtype).
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> storage(4096);
  for (int trial = 0; trial < 2000; ++trial) {
    auto view = [&](int64_t offset) {
      TensorView v;
      v.dtype = DType::f32;
      v.ndim = 3;
      v.data = storage.data() + offset;
      int64_t span = 1;
      for (int d = 2; d >= 0; --d) {
        v.shape[d] = 1 + static_cast<int64_t>(rng() % 4);
        v.stride[d] = d == 2 ? 1 : span + static_cast<int64_t>(rng() % 6);
        span = v.stride[d] * v.shape[d];
      }
      return v;
    };
    const TensorView t = view(static_cast<int64_t>(rng() % 64)), o = view(static_cast<int64_t>(rng() % 64));
    std::set<const float*> elements;
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t j = 0; j < t.shape[1]; ++j)
        for (int64_t k = 0; k < t.shape[2]; ++k)
          elements.insert(static_cast<const float*>(t.data) + i * t.stride[0] + j * t.stride[1] + k);
    bool shared = false;
    for (int64_t i = 0; i < o.shape[0]; ++i)
      for (int64_t j = 0; j < o.shape[1]; ++j)
        for (int64_t k = 0; k < o.shape[2]; ++k)
          shared |= elements.count(static_cast<const float*>(o.data) + i * o.stride[0] + j * o.stride[1] + k) > 0;
    const detail::SharedElements got = detail::views_share_element(t, o);
    ASSERT_EQ(got, shared ? detail::SharedElements::yes : detail::SharedElements::no) << "trial " << trial;
  }
}

TEST(Validation, ViewsShareElementGivesUpPastItsBudget) {
  // The search stops at its node budget and says so (validate() then refuses the outputs).
  std::vector<float> storage(1 << 12);
  TensorView t, o;
  for (TensorView* v : {&t, &o}) {
    v->dtype = DType::f32;
    v->ndim = 2;
    v->shape[0] = 16;
    v->shape[1] = 16;
    v->stride[1] = 1;
  }
  t.stride[0] = 16;
  o.stride[0] = 17;
  t.data = storage.data();
  o.data = storage.data() + 2000;  // past t's span: no
  EXPECT_EQ(detail::views_share_element(t, o), detail::SharedElements::no);
  o.data = storage.data() + 100;
  EXPECT_EQ(detail::views_share_element(t, o), detail::SharedElements::yes);
  EXPECT_EQ(detail::views_share_element(t, o, 1), detail::SharedElements::unknown);
}

TEST(Validation, BroadcastInputsMayOverlapThemselves) {
  // Inputs are only read: a stride-0 (expanded) k or v is fine; only outputs must not overlap.
  Problem pr(base_config(false), 1);
  AttentionParams a = pr.params();
  a.k.stride[1] = 0;
  a.v.stride[2] = 0;
  a.dout.stride[0] = 0;
  EXPECT_TRUE(plan(a, Pass::forward).ok) << plan(a, Pass::forward).reason;
  EXPECT_TRUE(plan(a, Pass::backward).ok) << plan(a, Pass::backward).reason;
}

TEST(Validation, SizeOneOutputDimsMayHaveAnyStride) {
  // A size-1 dim is never stepped through, so its stride (0 included) cannot make an overlap.
  ProblemConfig c = base_config(false);
  c.batch = 1;
  Problem pr(c, 1);
  AttentionParams a = pr.params();
  a.out.stride[0] = 0;
  a.lse.stride[0] = 0;
  a.dq.stride[0] = 7;
  EXPECT_TRUE(plan(a, Pass::forward).ok) << plan(a, Pass::forward).reason;
  EXPECT_TRUE(plan(a, Pass::backward).ok) << plan(a, Pass::backward).reason;
}

TEST(Validation, CuSeqlensOfLengthOneIsBatchZero) {
  ProblemConfig c = base_config(true);
  c.lens_q = {0};
  c.lens_k = {0};
  Problem pr(c, 1);
  AttentionParams a = pr.params();
  a.cu_seqlens_q.shape[0] = 1;
  a.cu_seqlens_k.shape[0] = 1;
  EXPECT_TRUE(plan(a, Pass::forward).ok) << plan(a, Pass::forward).reason;
  EXPECT_EQ(detail::validate(a, Pass::forward).batch, 0);
}

TEST(Validation, SmallestAcceptedScaleAndSoftcap) {
  Problem pr(base_config(false), 1);
  AttentionParams a = pr.params();
  a.softmax_scale = -std::numeric_limits<float>::min();
  a.softcap = 1e-38f;  // 1/softcap = 1e38 is finite
  EXPECT_TRUE(plan(a, Pass::forward).ok) << plan(a, Pass::forward).reason;
}

// A window wider than every sequence is stored as -1 (unbounded): INT64_MAX used to overflow
// i + offset + window + 1 in visible_keys() and mask every key.
TEST(Validation, HugeWindowsAreUnbounded) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Problem pr(base_config(false), 1);  // seqlen_q 5 + seqlen_k 7 = 12
  AttentionParams a = pr.params();
  a.window_size_left = kMax;
  a.window_size_right = kMax - 1;
  detail::Params p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.window_size_left, -1);
  EXPECT_EQ(p.window_size_right, -1);
  a.window_size_left = 12;  // the widest window kept as given; one more is unbounded
  a.window_size_right = 13;
  p = detail::validate(a, Pass::backward);
  EXPECT_EQ(p.window_size_left, 12);
  EXPECT_EQ(p.window_size_right, -1);
  a.causal = true;
  a.window_size_right = -1;
  a.window_size_left = kMax;
  p = detail::validate(a, Pass::forward);
  EXPECT_EQ(p.window_size_left, -1);
  EXPECT_EQ(p.window_size_right, 0);

  Problem vpr(base_config(true), 1);  // varlen: total_q 7 + total_k 7 = 14
  AttentionParams v = vpr.params();
  v.window_size_left = 14;
  v.window_size_right = 15;
  p = detail::validate(v, Pass::forward);
  EXPECT_EQ(p.window_size_left, 14);
  EXPECT_EQ(p.window_size_right, -1);
}

// The tester's case: window_size_right (or left) = INT64_MAX on the CPU forward gives the same
// bits as -1, and the rows are not masked.
struct HugeWindowCase {
  bool varlen;
  CausalAlign align;
  bool left;  // which window is INT64_MAX (the other one is -1 or small)
  int64_t other;
  int64_t seqlen_q = 5;  // batched; 9 > seqlen_k = 7 makes the bottom-right offset negative
};

class HugeWindow : public ::testing::TestWithParam<HugeWindowCase> {};

TEST_P(HugeWindow, ForwardMatchesUnboundedBitwise) {
  const HugeWindowCase& hc = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  ProblemConfig c = base_config(hc.varlen);
  c.align = hc.align;
  c.num_threads = 1;
  c.seqlen_q = hc.seqlen_q;
  (hc.left ? c.window_size_right : c.window_size_left) = hc.other;
  Problem huge(c, seed), unbounded(c, seed);  // same seed: same inputs
  AttentionParams a = huge.params(), b = unbounded.params();
  (hc.left ? a.window_size_left : a.window_size_right) = std::numeric_limits<int64_t>::max();
  (hc.left ? b.window_size_left : b.window_size_right) = -1;
  forward(a);
  forward(b);
  EXPECT_TRUE(bitwise_equal("out", huge.out, unbounded.out));
  EXPECT_TRUE(bitwise_equal("lse", huge.lse, unbounded.lse));
  // Every query row with keys sees at least one: lse finite, not the -inf of a masked row.
  const std::vector<double> lse = huge.lse_dense();
  const std::vector<int32_t> lens_q = hc.varlen ? c.lens_q : std::vector<int32_t>(2, static_cast<int32_t>(c.seqlen_q));
  const std::vector<int32_t> lens_k = hc.varlen ? c.lens_k : std::vector<int32_t>(2, static_cast<int32_t>(c.seqlen_k));
  for (int64_t h = 0, total_q = huge.total_q(); h < c.num_heads; ++h) {
    int64_t row = 0;
    for (size_t s = 0; s < lens_q.size(); ++s) {
      for (int32_t i = 0; i < lens_q[s]; ++i, ++row) {
        const double x = lse[static_cast<size_t>(h * total_q + row)];
        if (lens_k[s] > 0 && hc.other < 0) {
          EXPECT_TRUE(std::isfinite(x)) << "head " << h << " row " << row << ": lse " << x;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, HugeWindow,
                         ::testing::Values(HugeWindowCase{false, CausalAlign::bottom_right, false, -1},
                                           HugeWindowCase{false, CausalAlign::bottom_right, true, -1},
                                           HugeWindowCase{false, CausalAlign::top_left, false, 2},
                                           HugeWindowCase{false, CausalAlign::top_left, true, 0},
                                           HugeWindowCase{true, CausalAlign::bottom_right, false, 1},
                                           HugeWindowCase{true, CausalAlign::top_left, true, -1},
                                           HugeWindowCase{false, CausalAlign::bottom_right, true, -1, 9},
                                           HugeWindowCase{false, CausalAlign::bottom_right, false, 3, 9}),
                         [](const ::testing::TestParamInfo<HugeWindowCase>& info) {
                           const HugeWindowCase& h = info.param;
                           return std::string(h.varlen ? "Varlen" : "Batched") +
                                  (h.align == CausalAlign::bottom_right ? "BR" : "TL") + (h.left ? "Left" : "Right") +
                                  (h.other < 0 ? std::string("OtherUnbounded") : "Other" + std::to_string(h.other)) +
                                  (h.seqlen_q > 7 ? "LongerQ" : "");
                         });

TEST(Validation, EmptyProblemsAreValid) {
  // Zero-length sequences and an empty batch are legal calls with nothing to compute.
  for (int64_t b : {0, 2}) {
    ProblemConfig c = base_config(false);
    c.batch = b;
    c.seqlen_q = b ? 0 : 5;
    Problem pr(c, 1);
    EXPECT_TRUE(plan(pr.params(), Pass::forward).ok) << plan(pr.params(), Pass::forward).reason;
    EXPECT_TRUE(plan(pr.params(), Pass::backward).ok);
  }
  ProblemConfig c = base_config(true);
  c.lens_q = {};
  c.lens_k = {};
  c.lens_q.push_back(0);
  c.lens_k.push_back(0);
  Problem pr(c, 1);
  EXPECT_TRUE(plan(pr.params(), Pass::forward).ok) << plan(pr.params(), Pass::forward).reason;
}

TEST(Validation, LastStrideMattersOnlyWhereItIsSteppedThrough) {
  // PyTorch leaves arbitrary strides on size-1 dims (a size-1 head_dim is never stepped through)
  // and hands empty outputs stride-0 gradients (sum().backward()); a real stride-0 last dim is refused.
  struct Case {
    const char* what;
    int64_t head_dim, seqlen_q;
    TensorView AttentionParams::*tensor;
    int64_t stride;
    Pass pass;
    bool ok;
  };
  const Case cases[] = {
      {"size-1 head_dim", 1, 5, &AttentionParams::q, 17, Pass::forward, true},
      {"empty dout", 8, 0, &AttentionParams::dout, 0, Pass::backward, true},
      {"non-empty dout", 8, 5, &AttentionParams::dout, 0, Pass::backward, false},
  };
  for (const Case& k : cases) {
    ProblemConfig c = base_config(false);
    c.head_dim = k.head_dim;
    c.seqlen_q = k.seqlen_q;
    Problem pr(c, 1);
    AttentionParams a = pr.params();
    (a.*k.tensor).stride[3] = k.stride;
    const Plan pl = plan(a, k.pass);
    EXPECT_EQ(pl.ok, k.ok) << k.what << ": " << pl.reason;
    if (k.ok && k.pass == Pass::backward) backward(a);
  }
}

TEST(Validation, CudaTensorsWithoutCudaBackendSayWhy) {
  if (cuda_available()) GTEST_SKIP() << "this build has CUDA and a device";
  Problem pr(base_config(true), 1);
  AttentionParams a = pr.params();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k}) t->device = Device::cuda;
  // cu_seqlens on the device are not read by validate() (the CUDA backend checks them); here the
  // CPU-only build must refuse with a reason rather than touch them.
  const Plan pl = plan(a, Pass::forward);
  EXPECT_FALSE(pl.ok);
  EXPECT_EQ(pl.reason.rfind("device: expected", 0), 0u) << pl.reason;
  EXPECT_THROW(forward(a), Error);
}

}  // namespace
}  // namespace flashattn::testing
