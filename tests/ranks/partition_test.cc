// The partition of routed experts over ranks (pipeline/ranks/partition.h).
#include "pipeline/ranks/partition.h"

#include <gtest/gtest.h>

#include <vector>

namespace k3::ranks {
namespace {

std::vector<int> CountsOfLayer(const ExpertPartition& p, int64_t layer, int64_t experts) {
  std::vector<int> counts(static_cast<size_t>(p.ranks()), 0);
  for (int32_t e = 0; e < experts; ++e) ++counts[static_cast<size_t>(p.owner(layer, e))];
  return counts;
}

TEST(PartitionTest, EqualWeightsSplitEveryLayerEvenly) {
  const ExpertPartition p(4, 896, {1, 1, 1});
  for (int64_t l = 0; l < 4; ++l) {
    const std::vector<int> c = CountsOfLayer(p, l, 896);
    for (int n : c) EXPECT_TRUE(n == 298 || n == 299) << "layer " << l;
  }
  // The extra experts rotate: over three layers each rank gets its third exactly.
  const ExpertPartition q(3, 896, {1, 1, 1});
  for (double s : q.shares()) EXPECT_NEAR(s, 896.0 / 3, 1e-9);
}

TEST(PartitionTest, SharesFollowTheWeightsAndEveryRankHasExpertsInEveryLayer) {
  const ExpertPartition p(10, 64, {3, 1, 0.01});
  for (int64_t l = 0; l < 10; ++l) {
    const std::vector<int> c = CountsOfLayer(p, l, 64);
    EXPECT_GE(c[2], 1) << "a rank of tiny weight still owns an expert of layer " << l;
    EXPECT_NEAR(c[0], 3 * c[1], 3) << "layer " << l;
  }
  EXPECT_GT(p.shares()[0], p.shares()[1]);
}

TEST(PartitionTest, ARanksExpertsAreSpreadOverTheLayerNotOneBlock) {
  const ExpertPartition p(1, 16, {1, 1});
  // Interleaved: no run of more than two neighbours on one rank.
  int run = 1, longest = 1;
  for (int32_t e = 1; e < 16; ++e) {
    run = p.owner(0, e) == p.owner(0, e - 1) ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  EXPECT_LE(longest, 2);
}

TEST(PartitionTest, IsTheSameForTheSameInput) {
  const ExpertPartition a(5, 32, {2, 1, 1}), b(5, 32, {2, 1, 1});
  for (int64_t l = 0; l < 5; ++l) {
    for (int32_t e = 0; e < 32; ++e) EXPECT_EQ(a.owner(l, e), b.owner(l, e));
  }
}

TEST(PartitionTest, OneRankOwnsEverything) {
  const ExpertPartition p(2, 8, {1});
  for (int32_t e = 0; e < 8; ++e) EXPECT_EQ(p.owner(1, e), 0);
}

TEST(PartitionTest, WeightsAreCacheBytesWhenTheCachesHoldEveryExpertElseDiskRates) {
  const std::vector<RankCapacity> ranks = {{.cache_bytes = 300, .disk_rate = 1},
                                           {.cache_bytes = 100, .disk_rate = 3}};
  EXPECT_EQ(ShareWeights(ranks, 400), (std::vector<double>{300, 100}));
  EXPECT_EQ(ShareWeights(ranks, 401), (std::vector<double>{1, 3}));
  // A rank with no figure gets the others' mean; none with one: equal shares.
  EXPECT_EQ(ShareWeights({{.disk_rate = 2}, {.disk_rate = 0}, {.disk_rate = 4}}, 1e9),
            (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(ShareWeights({{}, {}}, 1), (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace k3::ranks
