// Replacement policies on small hand-made traces with known answers, plus properties every
// policy must have (victims respect the cache's predicate; nothing beats Belady).
#include "pipeline/cache/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "pipeline/cache/replay.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

// Pages of a textbook reference string, all in one layer.
std::vector<ExpertKey> Pages(const std::vector<int>& pages) {
  std::vector<ExpertKey> out;
  for (int p : pages) out.push_back({1, p});
  return out;
}

// Hits of `policy` on `trace` with `slots` slots (one byte per expert, so bytes = slots).
uint64_t Hits(const std::vector<ExpertKey>& trace, std::string_view policy, int64_t slots) {
  auto stats = ReplayTrace(trace, policy,
                           {.capacity_bytes = static_cast<uint64_t>(slots), .expert_bytes = 1});
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? stats->hits : 0;
}

// 1 2 3 4 1 2 5 1 2 3 4 5: the string of Belady's anomaly.
const std::vector<ExpertKey>& AnomalyString() {
  static const auto* kTrace =
      new std::vector<ExpertKey>(Pages({1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5}));
  return *kTrace;
}

// Silberschatz et al., Operating System Concepts: 20 references, 3 frames.
const std::vector<ExpertKey>& SilberschatzString() {
  static const auto* kTrace = new std::vector<ExpertKey>(
      Pages({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1}));
  return *kTrace;
}

TEST(PolicyTest, LruOnTextbookStrings) {
  EXPECT_EQ(Hits(AnomalyString(), "lru", 3), 12u - 10u);
  EXPECT_EQ(Hits(AnomalyString(), "lru", 4), 12u - 8u);
  EXPECT_EQ(Hits(SilberschatzString(), "lru", 3), 20u - 12u);
}

TEST(PolicyTest, FifoShowsBeladysAnomaly) {
  EXPECT_EQ(Hits(AnomalyString(), "fifo", 3), 12u - 9u);
  EXPECT_EQ(Hits(AnomalyString(), "fifo", 4), 12u - 10u);  // more frames, more faults
  EXPECT_EQ(Hits(SilberschatzString(), "fifo", 3), 20u - 15u);
}

TEST(PolicyTest, BeladyOnTextbookStrings) {
  EXPECT_EQ(Hits(AnomalyString(), "belady", 3), 12u - 7u);
  EXPECT_EQ(Hits(AnomalyString(), "belady", 4), 12u - 6u);
  EXPECT_EQ(Hits(SilberschatzString(), "belady", 3), 20u - 9u);
}

TEST(PolicyTest, LfuKeepsTheFrequentKey) {
  const auto trace = Pages({1, 1, 2, 3, 1});
  EXPECT_EQ(Hits(trace, "lfu", 2), 2u);  // 3 evicts 2 (one request), not 1 (two)
  EXPECT_EQ(Hits(trace, "lru", 2), 1u);  // 3 evicts 1, the least recently used
}

// A cyclic scan one key larger than the cache: LRU and FIFO never hit, MRU and Belady miss
// once per cycle.
TEST(PolicyTest, CyclicScanLargerThanTheCache) {
  std::vector<ExpertKey> trace;
  for (int pass = 0; pass < 4; ++pass) {
    for (int p = 1; p <= 5; ++p) trace.push_back({1, p});
  }
  EXPECT_EQ(Hits(trace, "lru", 4), 0u);
  EXPECT_EQ(Hits(trace, "fifo", 4), 0u);
  EXPECT_EQ(Hits(trace, "mru", 4), 12u);
  EXPECT_EQ(Hits(trace, "belady", 4), 12u);
}

// Forward passes over 4 layers x 3 experts (12 keys) with 8 slots: LRU misses everything;
// Belady keeps a stable set and misses 4 keys per pass after the first. The layer-aware
// policies do the same but for up to one hit per pass: they keep the current layer's keys,
// which its visit may request again (in real traces several tokens share experts), and Belady
// knows it will not (layer-reuse learns it).
TEST(PolicyTest, LayerAwarePoliciesMatchBeladyOnForwardPasses) {
  std::vector<ExpertKey> trace;
  for (int pass = 0; pass < 6; ++pass) {
    for (int layer = 1; layer <= 4; ++layer) {
      for (int e = 0; e < 3; ++e) trace.push_back({layer, 10 * layer + e});
    }
  }
  const uint64_t optimal = Hits(trace, "belady", 8);
  EXPECT_EQ(optimal, 5u * 8u);
  EXPECT_EQ(Hits(trace, "lru", 8), 0u);
  for (const char* policy : {"layer-mru", "layer-lfu", "layer-freq", "layer-reuse"}) {
    EXPECT_GE(Hits(trace, policy, 8), optimal - 5) << policy;
  }
}

// Reuse inside a layer (several tokens choosing the same expert in one visit) must not be
// lost: the layer-aware policies keep the current layer's experts. layer-reuse does once it has
// seen that they come back: it may lose a few hits while it learns, none afterwards.
std::vector<ExpertKey> SharedExpertTrace(int layers) {
  std::vector<ExpertKey> trace;
  for (int layer = 1; layer <= layers; ++layer) {
    for (int token = 0; token < 4; ++token) {
      trace.push_back({layer, 0});
      trace.push_back({layer, 1 + token});  // a new expert per token
    }
  }
  return trace;
}

TEST(PolicyTest, LayerAwarePoliciesKeepTheCurrentLayer) {
  const auto trace = SharedExpertTrace(10);
  for (const char* policy : {"layer-mru", "layer-lfu", "layer-freq"}) {
    EXPECT_EQ(Hits(trace, policy, 2), 3u * 10) << policy;  // expert 0: 3 hits per layer
  }
  const uint64_t learning = Hits(trace, "layer-reuse", 2);
  EXPECT_GE(learning, 3u * 10 - 3);
  EXPECT_EQ(Hits(SharedExpertTrace(20), "layer-reuse", 2), learning + 3u * 10);
}

// A hot set requested every round between one-time scans larger than the cache: LRU loses
// the hot keys to every scan; the scan-resistant policies keep them. (2Q is not among them
// here: its ghost list, half the cache, forgets a hot key before the 20-key scan is over.)
TEST(PolicyTest, ScanResistance) {
  std::vector<ExpertKey> trace;
  int cold = 1000;
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    for (int rep = 0; rep < 2; ++rep) {
      for (int hot = 0; hot < 5; ++hot) trace.push_back({1, hot});
    }
    for (int i = 0; i < 20; ++i) trace.push_back({1, cold++});
  }
  const uint64_t lru = Hits(trace, "lru", 10);
  EXPECT_EQ(lru, kRounds * 5u);  // only the repeat right after the first touch
  for (const char* policy : {"arc", "s3fifo", "lirs", "lfu", "wtinylfu"}) {
    EXPECT_GE(Hits(trace, policy, 10), lru + (kRounds - 3) * 5u) << policy;
  }
}

std::vector<ExpertKey> RandomTrace(int n, int layers, int experts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ExpertKey> trace;
  int layer = 1;
  for (int i = 0; i < n; ++i) {
    if (rng() % 4 == 0) layer = layer % layers + 1;  // mostly layer order, like a pass
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    trace.push_back({layer, static_cast<int>(experts * u * u)});  // skewed popularity
  }
  return trace;
}

TEST(PolicyTest, NoPolicyBeatsBelady) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto trace = RandomTrace(3000, 6, 40, seed);
    for (int64_t slots : {1, 7, 30, 100}) {
      const uint64_t optimal = Hits(trace, "belady", slots);
      for (const std::string& policy : PolicyNames()) {
        EXPECT_LE(Hits(trace, policy, slots), optimal) << policy << " at " << slots << " slots";
      }
    }
  }
}

// Every policy, driven directly: the victim must be a resident key the predicate accepts, and
// none when it accepts nothing.
TEST(PolicyTest, VictimsRespectThePredicate) {
  const auto trace = RandomTrace(40, 3, 10, 7);
  for (const std::string& name : PolicyNames()) {
    SCOPED_TRACE(name);
    auto policy = MakePolicy(name, {.capacity = 100, .future = trace});
    ASSERT_TRUE(policy.ok());
    std::vector<ExpertKey> resident;
    for (const ExpertKey& key : trace) {
      (*policy)->OnRequest(key, RequestKind::kDemand);
      if (std::find(resident.begin(), resident.end(), key) != resident.end()) {
        (*policy)->OnHit(key);
      } else {
        (*policy)->OnInsert(key);
        resident.push_back(key);
      }
    }
    EXPECT_FALSE((*policy)->ChooseVictim([](const ExpertKey&) { return false; }));
    for (const ExpertKey& only : resident) {
      auto victim = (*policy)->ChooseVictim([&](const ExpertKey& k) { return k == only; });
      ASSERT_TRUE(victim.has_value());
      EXPECT_EQ(*victim, only);
    }
    auto any = (*policy)->ChooseVictim([](const ExpertKey&) { return true; });
    ASSERT_TRUE(any.has_value());
    EXPECT_NE(std::find(resident.begin(), resident.end(), *any), resident.end());
  }
}

// Incremental decoding in miniature (8 layers, 64 experts, top-4 per token, skewed popularity,
// each expert of the previous token kept with probability rho): a cache of half a pass gets
// nothing from LRU, and the default policy must stay close to the best online policy whether
// frequency (rho = 0) or recency (rho = 0.4) predicts reuse.
std::vector<ExpertKey> DecodeTrace(double rho, uint32_t seed) {
  constexpr int kLayers = 8, kExperts = 64, kTopK = 4, kTokens = 600;
  std::mt19937 rng(seed);
  std::vector<std::vector<double>> weights(kLayers, std::vector<double>(kExperts));
  for (auto& w : weights) {
    for (int e = 0; e < kExperts; ++e) w[e] = 1.0 / (1 + (e * 37 + rng() % 7) % kExperts);
  }
  std::vector<std::vector<int>> previous(kLayers);
  std::vector<ExpertKey> trace;
  for (int t = 0; t < kTokens; ++t) {
    for (int l = 0; l < kLayers; ++l) {
      std::vector<int> chosen;
      for (int e : previous[l]) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < rho) chosen.push_back(e);
      }
      std::vector<double> w = weights[l];
      for (int e : chosen) w[e] = 0;
      while (static_cast<int>(chosen.size()) < kTopK) {
        const int e = std::discrete_distribution<int>(w.begin(), w.end())(rng);
        chosen.push_back(e);
        w[e] = 0;
      }
      previous[l] = chosen;
      for (int e : chosen) trace.push_back({l + 1, e});
    }
  }
  return trace;
}

TEST(PolicyTest, DefaultPolicyOnIncrementalDecoding) {
  for (double rho : {0.0, 0.4}) {
    const auto trace = DecodeTrace(rho, 11);
    const int64_t slots = 16;  // half of the 32 experts a token touches
    uint64_t best = 0;
    std::string best_name;
    for (const std::string& policy : PolicyNames()) {
      if (policy == "belady") continue;
      const uint64_t h = Hits(trace, policy, slots);
      if (h > best) {
        best = h;
        best_name = policy;
      }
    }
    EXPECT_EQ(Hits(trace, "lru", slots), 0u);
    EXPECT_GE(Hits(trace, kDefaultPolicy, slots), 0.9 * best)
        << "rho " << rho << ": best is " << best_name;
  }
}

TEST(PolicyTest, FactoryErrors) {
  auto unknown = MakePolicy("nope", {.capacity = 4});
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("layer-reuse"));
  EXPECT_EQ(MakePolicy("belady", {.capacity = 4}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no future
  EXPECT_EQ(MakePolicy("lru", {.capacity = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& name : PolicyNames()) {
    const std::vector<ExpertKey> future = {{1, 1}};
    auto p = MakePolicy(name, {.capacity = 4, .future = future});
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  EXPECT_NE(std::find(PolicyNames().begin(), PolicyNames().end(), kDefaultPolicy),
            PolicyNames().end());
}

}  // namespace
}  // namespace k3
