// dtype helpers and make_tensor (flashattn.hpp).
#include <gtest/gtest.h>

#include <string>

#include <cmath>
#include <cstdint>

#include "common/half.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn {
namespace {

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::f32), "fp32");
  EXPECT_STREQ(dtype_name(DType::f16), "fp16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::i32), "int32");
  EXPECT_STREQ(dtype_name(DType::e4m3), "e4m3");
  EXPECT_EQ(static_cast<int32_t>(DType::e4m3), 4);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_STREQ(dtype_name(static_cast<DType>(42)), "unknown");
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(static_cast<DType>(42)), 0u);
}

// OCP e4m3fn (common/half.hpp): every code decodes to its value and encodes back; rounding is to
// nearest even, saturating at ±448; 0x7F / 0xFF are the NaNs.
TEST(E4m3, DecodeEncodeRoundTrip) {
  for (int code = 0; code < 256; ++code) {
    const float x = detail::e4m3_to_float(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(x)) << code;
      continue;
    }
    EXPECT_EQ(detail::float_to_e4m3(x), code) << code << " = " << x;
  }
  EXPECT_EQ(detail::e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(detail::e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(detail::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(detail::e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(detail::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(detail::e4m3_to_float(0xfe), -448.0f);
}

TEST(E4m3, RoundsToNearestEvenAndSaturates) {
  auto round = [](float x) { return detail::e4m3_to_float(detail::float_to_e4m3(x)); };
  EXPECT_EQ(round(1.0625f), 1.0f);     // tie between 1 and 1.125: even mantissa
  EXPECT_EQ(round(1.1875f), 1.25f);    // tie between 1.125 and 1.25: even mantissa
  EXPECT_EQ(round(1.07f), 1.125f);
  EXPECT_EQ(round(17.0f), 16.0f);      // tie between 16 and 18
  EXPECT_EQ(round(15.5f), 16.0f);      // rounds up into the next binade
  EXPECT_EQ(round(std::ldexp(1.0f, -10)), 0.0f);                    // tie between 0 and 2^-9
  EXPECT_EQ(round(std::ldexp(3.0f, -10)), std::ldexp(2.0f, -9));     // tie between 2^-9 and 2^-8
  EXPECT_EQ(round(std::ldexp(1.0f, -12)), 0.0f);
  EXPECT_EQ(round(std::ldexp(15.0f, -10)), std::ldexp(1.0f, -6));   // 7.5 · 2^-9: up to the smallest normal
  EXPECT_EQ(round(440.0f), 448.0f);
  EXPECT_EQ(round(1000.0f), 448.0f);
  EXPECT_EQ(round(-1e30f), -448.0f);
  EXPECT_EQ(round(INFINITY), 448.0f);
  EXPECT_EQ(detail::float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(detail::float_to_e4m3(NAN), 0x7f);
}

TEST(MakeTensor, ContiguousRowMajor) {
  float buf[1];
  const TensorView t = make_tensor(buf, DType::bf16, {2, 3, 4, 5}, Device::cuda, 1);
  EXPECT_EQ(t.ndim, 4);
  EXPECT_EQ(t.data, buf);
  EXPECT_EQ(t.dtype, DType::bf16);
  EXPECT_EQ(t.device, Device::cuda);
  EXPECT_EQ(t.device_index, 1);
  EXPECT_EQ(t.stride[0], 60);
  EXPECT_EQ(t.stride[1], 20);
  EXPECT_EQ(t.stride[2], 5);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(TensorView{}.defined());
  EXPECT_EQ(TensorView{}.numel(), 0);
  EXPECT_EQ(make_tensor(buf, DType::f32, {7}).numel(), 7);
  EXPECT_EQ(make_tensor(buf, DType::f32, {3, 0, 2}).numel(), 0);
}

TEST(MakeTensor, RejectsBadShapes) {
  float buf[1];
  try {
    make_tensor(buf, DType::f32, {1, 2, 3, 4, 5});
    FAIL() << "expected flashattn::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 1 to 4 dimensions, got 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tensor(buf, DType::f32, {}), Error);
  try {
    make_tensor(buf, DType::f32, {2, -1});
    FAIL() << "expected flashattn::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape[1] >= 0, got -1"), std::string::npos) << e.what();
  }
}

// Fixed bug: strides and numel() of shapes past int64 overflowed (undefined behaviour; the
// strides wrapped to 0 in Release builds).
TEST(MakeTensor, RejectsShapesPastInt64) {
  float buf[1];
  try {
    make_tensor(buf, DType::f32, {2, int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40});
    FAIL() << "expected flashattn::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("make_tensor: expected a shape whose contiguous strides fit in int64, got "
                                         "[2, 1099511627776, 1099511627776, 1099511627776]"),
              std::string::npos)
        << e.what();
  }
  TensorView t = make_tensor(buf, DType::f32, {1});
  t.ndim = 4;
  t.shape[0] = t.shape[1] = t.shape[2] = t.shape[3] = int64_t{1} << 40;
  EXPECT_EQ(t.numel(), INT64_MAX);  // saturated; validate() refuses it by name
}

}  // namespace
}  // namespace flashattn
