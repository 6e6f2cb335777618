// Log probabilities against a plain log-softmax, the top ids in order, masked ids left out.
#include "core/model/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace k3 {
namespace {

TEST(LogProbsTest, EqualLogSoftmaxAndListTheMostLikelyFirst) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 4);
  std::vector<float> logits(5000);
  for (float& x : logits) x = n(rng);
  logits[17] = logits[4000];  // a tie: the lower id first
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x));
  const TokenLogprob lp = LogProbs(logits, 123, 20);
  EXPECT_NEAR(lp.logprob, logits[123] - std::log(sum), 1e-5);
  ASSERT_EQ(lp.top.size(), 20u);
  for (size_t i = 0; i < lp.top.size(); ++i) {
    EXPECT_NEAR(lp.top[i].second, logits[lp.top[i].first] - std::log(sum), 1e-5);
    if (i > 0) {
      EXPECT_GE(lp.top[i - 1].second, lp.top[i].second);
    }
  }
  EXPECT_EQ(LogProbs(logits, 0, 0).top.size(), 0u);
}

TEST(LogProbsTest, MaskedIdsAreNeverAmongTheTop) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 2.0f, -inf, 1.0f};
  const TokenLogprob lp = LogProbs(logits, 1, 20);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(std::exp(2.0) + std::exp(1.0)), 1e-6);
}

}  // namespace
}  // namespace k3
