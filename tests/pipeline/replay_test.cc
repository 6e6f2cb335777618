// Replays of the recorded Kimi K3 trace: the published LRU and Belady figures, and the
// acceptance target of the default policy (at least 90 % of Belady's hit rate at 8-64 GB).
#include "pipeline/cache/replay.h"

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "pipeline/cache/policy.h"
#include "pipeline/cache/trace.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

class RecordedTraceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto read = ReadExpertTrace(testing::SharedDir() + "/traces/kimi-k3-expert-trace.bin");
    ASSERT_TRUE(read.ok()) << read.status();
    trace_ = new std::vector<ExpertKey>(*std::move(read));
  }
  static void TearDownTestSuite() {
    delete trace_;
    trace_ = nullptr;
  }

  // Hit rate in percent at `gb` GB (1e9 bytes) of Kimi K3 experts.
  static double HitRate(std::string_view policy, double gb) {
    auto stats = ReplayTrace(*trace_, policy, {.capacity_bytes = static_cast<uint64_t>(gb * 1e9)});
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? 100 * stats->hit_rate() : 0;
  }

  static std::vector<ExpertKey>* trace_;
};

std::vector<ExpertKey>* RecordedTraceTest::trace_ = nullptr;

TEST_F(RecordedTraceTest, TraceHasThePublishedShape) {
  ASSERT_NE(trace_, nullptr);
  EXPECT_EQ(trace_->size(), 100096u);
  absl::flat_hash_set<ExpertKey> distinct(trace_->begin(), trace_->end());
  EXPECT_EQ(distinct.size(), 10010u);
  EXPECT_EQ(SimulatedSlots(8'000'000'000, kKimiK3ExpertBytes), 455);
  EXPECT_EQ(SimulatedSlots(64'000'000'000, kKimiK3ExpertBytes), 3647);
}

TEST_F(RecordedTraceTest, LruMatchesThePublishedFigures) {
  ASSERT_NE(trace_, nullptr);
  for (double gb : {8, 16, 32, 64}) EXPECT_NEAR(HitRate("lru", gb), 36.24, 0.01) << gb << " GB";
  EXPECT_NEAR(HitRate("lru", 128), 49.19, 0.01);
}

TEST_F(RecordedTraceTest, BeladyMatchesThePublishedFigures) {
  ASSERT_NE(trace_, nullptr);
  EXPECT_NEAR(HitRate("belady", 8), 39.42, 0.01);
  EXPECT_NEAR(HitRate("belady", 16), 42.61, 0.01);
  EXPECT_NEAR(HitRate("belady", 32), 48.99, 0.01);
  EXPECT_NEAR(HitRate("belady", 64), 61.74, 0.01);
  EXPECT_NEAR(HitRate("belady", 128), 84.59, 0.01);
}

TEST_F(RecordedTraceTest, DefaultPolicyReachesNinetyPercentOfBelady) {
  ASSERT_NE(trace_, nullptr);
  for (double gb : {8, 16, 32, 64}) {
    const double optimal = HitRate("belady", gb);
    const double ours = HitRate(kDefaultPolicy, gb);
    EXPECT_GE(ours, 0.9 * optimal) << kDefaultPolicy << " at " << gb << " GB";
    EXPECT_LE(ours, optimal + 1e-9);
  }
}

}  // namespace
}  // namespace k3
