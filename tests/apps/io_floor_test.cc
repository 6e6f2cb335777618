// What k3 bench says about a row's I/O floor, from made-up replay times: the fastest replay is
// the floor, a floor slower than the run or too short to time or with replays that disagree is
// no floor ("-" and a note), and no row is ever shown beating its floor. No clock, no reads.
#include "apps/bench/io_floor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace k3::cli::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(ReplayAgainTest, AtLeastTheMinimumThenUntilTheTwoFastestAgreeAndBeatTheRun) {
  const double run = 1.0;
  EXPECT_TRUE(ReplayAgain({0.5}, run));
  EXPECT_TRUE(ReplayAgain({0.5, 0.5}, run));
  EXPECT_FALSE(ReplayAgain({0.5, 0.52, 0.9}, run));  // the two fastest agree; a slow one is noise
  EXPECT_TRUE(ReplayAgain({0.5, 0.9, 0.95}, run));   // the fastest is alone
  EXPECT_TRUE(ReplayAgain({1.5, 1.5, 1.5}, run));    // slower than the run: not a floor yet
  EXPECT_FALSE(ReplayAgain({1.5, 1.5, 1.5, 1.5, 1.5, 1.5}, run));  // the most it will do
  EXPECT_FALSE(ReplayAgain({0.5, 0.9, 0.95, 1.2, 1.3, 1.4}, run));
  EXPECT_EQ(kMaxReplays, 6);
  // No run time to check against (the run decoded nothing): only the agreement counts.
  EXPECT_FALSE(ReplayAgain({0.5, 0.5, 0.5}, 0));
}

TEST(JudgeFloorTest, TheFloorIsTheFastestReplayOfAnyRunPerToken) {
  // Two runs of 8 tokens: the fastest replay is 0.4 s, 0.05 s/token.
  const FloorVerdict v = JudgeFloor(0.1, {{.seconds = {0.6, 0.42, 0.45}, .tokens = 8},
                                          {.seconds = {0.4, 0.9, 0.5}, .tokens = 8}});
  EXPECT_DOUBLE_EQ(v.seconds_per_token, 0.05);
  EXPECT_EQ(v.replays, 6);
  EXPECT_DOUBLE_EQ(v.spread, 0.42 / 0.4 - 1);
  EXPECT_DOUBLE_EQ(v.ratio, 2.0);
  EXPECT_THAT(v.note, IsEmpty());
  EXPECT_EQ(FloorCell(v, 1), "2.00");
}

TEST(JudgeFloorTest, RunsOfDifferentLengthsCompareInSecondsPerToken) {
  // 0.3 s over 3 tokens (0.1) is slower per token than 0.4 s over 8 (0.05).
  const FloorVerdict v = JudgeFloor(
      0.06, {{.seconds = {0.3, 0.3}, .tokens = 3}, {.seconds = {0.4, 0.41}, .tokens = 8}});
  EXPECT_DOUBLE_EQ(v.seconds_per_token, 0.05);
  EXPECT_DOUBLE_EQ(v.ratio, 0.06 / 0.05);
}

TEST(JudgeFloorTest, AFloorSlowerThanTheRunIsNoFloor) {
  // The reported case: 0.0105 s/token against replays six times slower.
  const FloorVerdict v = JudgeFloor(0.0105, {{.seconds = {0.52, 0.53, 0.55}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(v.ratio));
  EXPECT_THAT(v.note, HasSubstr("slower than the run"));
  EXPECT_DOUBLE_EQ(v.seconds_per_token, 0.52 / 8);  // still reported, as a measurement
  EXPECT_EQ(FloorCell(v, 3), "- [3]");
  // Even by a hair.
  const FloorVerdict hair = JudgeFloor(0.0999, {{.seconds = {0.8, 0.8, 0.8}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(hair.ratio));
  EXPECT_THAT(hair.note, HasSubstr("slower than the run"));
  // Equal is a floor reached: 1.00.
  const FloorVerdict equal = JudgeFloor(0.1, {{.seconds = {0.8, 0.8, 0.8}, .tokens = 8}});
  EXPECT_DOUBLE_EQ(equal.ratio, 1.0);
  EXPECT_EQ(FloorCell(equal, 1), "1.00");
}

TEST(JudgeFloorTest, OneFastReplayAmongSlowOnesMakesTheFloor) {
  // A slow replay (a busy moment) does not matter as long as two fast ones agree.
  const FloorVerdict v = JudgeFloor(0.1, {{.seconds = {5.0, 0.4, 0.41}, .tokens = 8}});
  EXPECT_DOUBLE_EQ(v.seconds_per_token, 0.05);
  EXPECT_DOUBLE_EQ(v.ratio, 2.0);
}

TEST(JudgeFloorTest, AFloorTooShortToTimeIsNoFloor) {
  // Tiny reads served from a warm cache: 0.2 ms for the whole log.
  const FloorVerdict v = JudgeFloor(0.01, {{.seconds = {0.0002, 0.0002, 0.0002}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(v.ratio));
  EXPECT_THAT(v.note, HasSubstr("too short to time"));
  EXPECT_EQ(FloorCell(v, 1), "- [1]");
  // The threshold is on the whole replay, not per token.
  const FloorVerdict timed =
      JudgeFloor(0.01, {{.seconds = {kShortestFloorSeconds, kShortestFloorSeconds}, .tokens = 8}});
  EXPECT_THAT(timed.note, IsEmpty());
  EXPECT_DOUBLE_EQ(timed.ratio, 0.01 / (kShortestFloorSeconds / 8));
}

TEST(JudgeFloorTest, ReplaysThatDisagreeMakeNoFloor) {
  const FloorVerdict v =
      JudgeFloor(1.0, {{.seconds = {0.2, 0.4, 0.6, 0.5, 0.45, 0.7}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(v.ratio));
  EXPECT_DOUBLE_EQ(v.spread, 1.0);
  EXPECT_THAT(v.note, HasSubstr("disagree"));
  // Within kReplaysDisagree they are a floor.
  const FloorVerdict close = JudgeFloor(1.0, {{.seconds = {0.2, 0.24}, .tokens = 8}});
  EXPECT_DOUBLE_EQ(close.ratio, 1.0 / (0.2 / 8));
  // A single replay confirms nothing.
  const FloorVerdict single = JudgeFloor(1.0, {{.seconds = {0.2}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(single.ratio));
  EXPECT_THAT(single.note, HasSubstr("single replay"));
}

TEST(JudgeFloorTest, RunsThatReadNothingHaveNoFloorAndNothingToExplain) {
  const FloorVerdict v =
      JudgeFloor(0.01, {{.seconds = {}, .tokens = 8}, {.seconds = {}, .tokens = 8}});
  EXPECT_TRUE(std::isnan(v.ratio));
  EXPECT_TRUE(std::isnan(v.seconds_per_token));
  EXPECT_EQ(v.replays, 0);
  EXPECT_THAT(v.note, IsEmpty());
  EXPECT_EQ(FloorCell(v, 1), "-");
  // Nor do runs that decoded no token.
  EXPECT_EQ(JudgeFloor(0.01, {{.seconds = {0.5, 0.5}, .tokens = 0}}).replays, 0);
}

// The rule itself, over a grid of run times and replay times: the cell is a ratio of at least
// 1.00 or "- [n]" with a note, never a ratio below 1.
TEST(JudgeFloorTest, NoRowIsShownBeatingItsFloor) {
  const std::vector<double> times = {0,    1e-5, 5e-4, 1e-3, 0.004, 0.0105, 0.05,
                                     0.08, 0.1,  0.52, 1.0,  3.0,   NAN};
  int shown = 0, noted = 0;
  for (double step : times) {
    for (double a : times) {
      for (double b : times) {
        if (std::isnan(a) || std::isnan(b)) continue;
        const FloorVerdict v = JudgeFloor(step, {{.seconds = {a, b}, .tokens = 8}});
        const std::string cell = FloorCell(v, 1);
        SCOPED_TRACE(testing::Message() << "step " << step << " replays " << a << ", " << b << ": "
                                        << cell << " " << v.note);
        if (std::isfinite(v.ratio)) {
          ++shown;
          EXPECT_GE(v.ratio, 1.0);
          EXPECT_GE(step, v.seconds_per_token);
          EXPECT_THAT(v.note, IsEmpty());
          EXPECT_GE(std::stod(cell), 1.0);
        } else {
          ++noted;
          EXPECT_FALSE(v.note.empty());
          EXPECT_EQ(cell, "- [1]");
        }
      }
    }
  }
  EXPECT_GT(shown, 0);
  EXPECT_GT(noted, 0);
}

}  // namespace
}  // namespace k3::cli::bench
