#include "core/util/numeric.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace k3 {
namespace {

TEST(NumericTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(NumericTest, HalfKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                   // overflow to Inf
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);        // tie rounds to even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);    // tie rounds to even (up)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -24)), 0x0002);  // subnormal tie to even
}

TEST(NumericTest, EveryBF16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = BF16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBF16(f), b) << std::hex << b;
  }
}

TEST(NumericTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
}

}  // namespace
}  // namespace k3
