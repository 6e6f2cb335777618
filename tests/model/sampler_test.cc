#include "core/model/sampler.h"

#include <gtest/gtest.h>

#include <map>

namespace k3 {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 3.0f, 2.5f, -1.0f, 0.5f};

TEST(SamplerTest, GreedyTakesTheMaxAndTiesGoToTheLowerId) {
  Sampler s({});
  EXPECT_EQ(s.Sample(kLogits), 1);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplerOptions k1{.greedy = false, .temperature = 2.0, .top_k = 1, .top_p = 1.0, .seed = 9};
  SamplerOptions p0{.greedy = false, .temperature = 2.0, .top_k = 0, .top_p = 1e-6, .seed = 9};
  Sampler a(k1), b(p0);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(a.Sample(kLogits), 1);
    EXPECT_EQ(b.Sample(kLogits), 1);
  }
}

TEST(SamplerTest, SameSeedSameSequenceAndTopKIsRespected) {
  SamplerOptions o{.greedy = false, .temperature = 1.0, .top_k = 3, .top_p = 1.0, .seed = 42};
  Sampler a(o), b(o);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) {
    int32_t x = a.Sample(kLogits);
    EXPECT_EQ(x, b.Sample(kLogits));
    ++seen[x];
  }
  EXPECT_EQ(seen.size(), 3u);  // ids 1, 2 and 3: the three largest logits
  EXPECT_GT(seen[1], seen[3]);
}

TEST(SamplerTest, InvalidOptionsAreRefused) {
  EXPECT_FALSE(ValidateSamplerOptions({.temperature = -0.5}).ok());
  EXPECT_FALSE(ValidateSamplerOptions({.top_k = -1}).ok());
  EXPECT_FALSE(ValidateSamplerOptions({.top_p = 0.0}).ok());
  EXPECT_FALSE(ValidateSamplerOptions({.top_p = 1.01}).ok());
  EXPECT_TRUE(ValidateSamplerOptions({}).ok());
}

}  // namespace
}  // namespace k3
