#include "core/util/median.h"

#include <gtest/gtest.h>

namespace k3 {
namespace {

TEST(MedianTest, MiddleValueOrMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({4}), 4);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({5, 5, 1, 9, 5, 0}), 5);
}

}  // namespace
}  // namespace k3
