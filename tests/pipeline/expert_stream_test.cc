// The streaming expert provider on its own (tiny checkpoint, real cache and read engine): the
// life of a lookahead guess. A guess holds a pin on its cache slot from its prefetch until its
// layer's demands have pinned what they use, so no fill in between can evict a right guess and
// make the disk read it twice; a guess whose layer passed without it loses the pin. And a layer
// needing more experts than the cache has slots: a window slides over them, reads of later
// experts issued as earlier ones are multiplied, the resident ones pinned before any miss.
#include "pipeline/expert_stream.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/model/weights.h"
#include "core/synth/synth.h"
#include "io/aligned_buffer.h"
#include "io/read_router.h"
#include "pipeline/memory_plan.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::TempDir;

class ExpertStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_TRUE(Synthesize(::k3::testing::TinyModel(dir_->path() + "/tiny")).ok());
    SynthOptions wide = ::k3::testing::TinyModel(dir_->path() + "/wide");
    wide.overrides = {{"num_experts", std::to_string(kWideExperts)}};
    ASSERT_TRUE(Synthesize(wide).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    // Room for one layer's top-k, the guesses of the next and the top-k reserve, no more:
    // `mru` would then evict a finished guess first.
    ASSERT_NO_FATAL_FAILURE(Open("tiny", -1, "mru"));
  }
  // The checkpoint `model` of the suite's dir with a cache of `slots` slots (-1: 3 top-k + 1)
  // under `policy`, its read engine and a provider.
  void Open(const std::string& model, int64_t slots, const std::string& policy) {
    TearDown();
    files_.clear();
    auto ckpt = Checkpoint::Open(dir_->path() + "/" + model);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto trunk = LoadTrunkWeights(*ckpt_);
    ASSERT_TRUE(trunk.ok()) << trunk.status();
    trunk_ = *std::move(trunk);
    const ModelConfig& c = ckpt_->config();
    const uint64_t slot = MeasureFootprint(*ckpt_, 16, 1).expert_slot_bytes;
    if (slots < 0) slots = 3 * c.num_experts_per_token + 1;
    auto made =
        MakePolicy(policy, {.capacity = slots, .num_layers = static_cast<int32_t>(c.num_layers)});
    ASSERT_TRUE(made.ok());
    auto cache = ExpertCache::Create(
        {.budget_bytes = slots * io::AlignUp(slot), .slot_bytes = slot}, *std::move(made));
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto reads = io::ReadRouter::Create({.engine = {.direct = false, .arena = cache_->arena()}});
    ASSERT_TRUE(reads.ok()) << reads.status();
    reads_ = *std::move(reads);
    for (const std::string& path : ckpt_->shard_paths()) {
      auto id = reads_->OpenFile(path);
      ASSERT_TRUE(id.ok());
      files_.push_back(*id);
    }
    MakeProvider(0);
  }
  // Lookahead of one layer, `width` experts guessed per layer (0: the top-k).
  void MakeProvider(int width) {
    provider_.reset();
    provider_ = std::make_unique<StreamingExpertProvider>(
        *ckpt_, *trunk_, *cache_, *reads_, files_, disk_,
        ExpertStreamOptions{
            .overlap = true,
            .prefetch_distance = 1,
            .prefetch_width = width,
            .prefetch_cap_bytes = 64 * static_cast<uint64_t>(ckpt_->config().expert_bytes())});
  }
  void TearDown() override {
    provider_.reset();  // before the engine and the cache it reads into
    reads_.reset();
  }

  // Waits until no read is landing in the cache (Lookahead has requested its fills by the time
  // it returns). The bound of a minute only turns a lost read into a failure rather than a
  // hang: a sanitizer build on a loaded machine can take well over the second it used to be.
  void AwaitFills() {
    for (int i = 0; i < 30000 && cache_->stats().filling_slots > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(cache_->stats().filling_slots, 0);
  }

  // Demands `experts` of `layer` and multiplies nothing; the pins of the call are gone after.
  void RunLayer(int64_t layer, std::vector<int32_t> experts) {
    provider_->StartFetch(layer, experts);
    ASSERT_TRUE(
        provider_->ForEachExpert(layer, experts, [](size_t, const ExpertWeights&) {}, {}).ok());
  }

  // What a layer's expert multiplies saw: each call's expert and the cache's misses (reads
  // issued) since `reads_before` when it began, in the order the calls began.
  struct MultiplyLog {
    std::mutex mu;
    std::vector<size_t> expert;
    std::vector<uint64_t> reads_before;
  };
  // StartFetch and ForEachExpert of `experts` of `layer`, logging each multiply.
  void RunLogged(int64_t layer, const std::vector<int32_t>& experts, MultiplyLog& log) {
    const uint64_t reads_before = cache_->stats().misses;
    provider_->StartFetch(layer, experts);
    auto use = [&](size_t i, const ExpertWeights&) {
      std::lock_guard<std::mutex> lock(log.mu);
      log.expert.push_back(i);
      log.reads_before.push_back(cache_->stats().misses - reads_before);
    };
    ASSERT_TRUE(provider_->ForEachExpert(layer, experts, use, {}).ok());
    ASSERT_EQ(log.expert.size(), experts.size());
  }

  std::vector<float> Hidden() const {
    return std::vector<float>(ckpt_->config().hidden_size, 0.5f);
  }

  static constexpr int kWideExperts = 32;  // the `wide` model: tiny with 32 experts per layer
  static TempDir* dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<TrunkWeights> trunk_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<io::ReadRouter> reads_;
  std::vector<io::FileId> files_;
  BusyClock disk_;
  std::unique_ptr<StreamingExpertProvider> provider_;
};
TempDir* ExpertStreamTest::dir_ = nullptr;

// The experts of `layer` resident in the cache.
std::vector<int32_t> Resident(const ExpertCache& cache, int32_t layer, int32_t experts) {
  std::vector<int32_t> out;
  for (int32_t e = 0; e < experts; ++e) {
    if (cache.Contains({layer, e})) out.push_back(e);
  }
  return out;
}

// Under expert parallelism a layer may have none of its experts on this rank: the shared
// experts (the work alongside) must still run, overlapped or serial.
TEST_F(ExpertStreamTest, ALayerWithNoExpertsStillRunsTheWorkAlongside) {
  for (bool overlap : {true, false}) {
    provider_.reset();
    provider_ = std::make_unique<StreamingExpertProvider>(
        *ckpt_, *trunk_, *cache_, *reads_, files_, disk_, ExpertStreamOptions{.overlap = overlap});
    int ran = 0;
    provider_->StartFetch(1, {});
    ASSERT_TRUE(provider_
                    ->ForEachExpert(
                        1, {}, [](size_t, const ExpertWeights&) {}, [&] { ++ran; })
                    .ok());
    EXPECT_EQ(ran, 1) << (overlap ? "overlapped" : "serial");
  }
}

TEST_F(ExpertStreamTest, GuessesKeepTheirSlotsUntilTheirLayerAsks) {
  const int32_t experts = static_cast<int32_t>(ckpt_->config().num_experts);
  // Fill every slot with layer 5, then guess layer 2 from layer 1's input.
  std::vector<int32_t> fill;
  for (int32_t e = 0; e < cache_->slots(); ++e) fill.push_back(e);
  RunLayer(5, fill);
  provider_->Lookahead(1, Hidden(), 1);
  AwaitFills();
  const std::vector<int32_t> guesses = Resident(*cache_, 2, experts);
  ASSERT_FALSE(guesses.empty());
  EXPECT_EQ(cache_->stats().pinned_slots, static_cast<int64_t>(guesses.size()));
  // Layer 1 reads two experts: the cache is full, and `mru` would take the guesses (the last in)
  // as victims, but they are pinned, so layer 5's experts go.
  RunLayer(1, {0, 1});
  EXPECT_EQ(Resident(*cache_, 2, experts), guesses);
  StepMetrics before;
  provider_->TakeMetrics(before);
  // Layer 2 asks for the guesses: hits, no read; the guards give way to the demand's own pins,
  // and those go when the layer is done.
  provider_->StartFetch(2, guesses);
  EXPECT_EQ(cache_->stats().pinned_slots, static_cast<int64_t>(guesses.size()));
  ASSERT_TRUE(provider_->ForEachExpert(2, guesses, [](size_t, const ExpertWeights&) {}, {}).ok());
  EXPECT_EQ(cache_->stats().pinned_slots, 0);
  StepMetrics m;
  provider_->TakeMetrics(m);
  EXPECT_EQ(m.experts_demand_read, 0u);
  EXPECT_EQ(m.cache_hits, guesses.size());
  EXPECT_EQ(m.expert_prefetch_used_bytes,
            guesses.size() * static_cast<uint64_t>(ckpt_->config().expert_bytes()));
}

TEST_F(ExpertStreamTest, GuessesOfAPassedLayerLoseTheirPins) {
  provider_->Lookahead(1, Hidden(), 1);  // guesses for layer 2
  AwaitFills();
  ASSERT_GT(cache_->stats().pinned_slots, 0);
  RunLayer(3, {6, 7});  // layer 2 never asked
  EXPECT_EQ(cache_->stats().pinned_slots, 0);
}

// Guesses never starve a demand: when every other slot is pinned, the layer takes theirs.
TEST_F(ExpertStreamTest, DemandsTakeTheSlotsOfGuessesWhenNothingElseIsFree) {
  MakeProvider(static_cast<int>(ckpt_->config().num_experts));  // guess every expert
  provider_->Lookahead(1, Hidden(), 1);
  AwaitFills();
  ASSERT_GT(cache_->stats().pinned_slots, 0);
  std::vector<int32_t> all_slots;  // one layer needing every slot (a prefill union)
  for (int32_t e = 0; e < cache_->slots(); ++e) all_slots.push_back(e);
  // Without taking theirs it would wait out the provider's 60 s for a free slot; the bound sits
  // far below that and far above the layer's time in a sanitizer build on a loaded machine.
  const auto start = std::chrono::steady_clock::now();
  RunLayer(1, all_slots);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(cache_->stats().pinned_slots, 0);
}

// A layer needs four times the cache: 32 experts, 4 slots. The window slides: once an expert
// is multiplied and unpinned, the next one's read is issued, so later experts are read while
// earlier ones still wait to be multiplied, and not only after all the earlier ones were. With
// at most two threads running multiplies, by the time the k-th multiply begins at least k - 1
// earlier ones have returned, each issuing one more read: so when the fourth (the last of the
// first window) begins, at least 4 + 2 reads were issued. Batch after batch, it would have been
// 4 at most. Each expert is read once and multiplied once, and no pin outlives the call.
TEST_F(ExpertStreamTest, AWindowSlidesOverALayerLargerThanTheCache) {
  constexpr int64_t kSlots = 4;
  ASSERT_NO_FATAL_FAILURE(Open("wide", kSlots, "lru"));
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 2);
  std::vector<int32_t> experts;
  for (int32_t e = 0; e < kWideExperts; ++e) experts.push_back(e);
  MultiplyLog log;
  ASSERT_NO_FATAL_FAILURE(RunLogged(3, experts, log));
  std::sort(log.expert.begin(), log.expert.end());
  for (size_t i = 0; i < experts.size(); ++i) EXPECT_EQ(log.expert[i], i);
  EXPECT_GE(log.reads_before[kSlots - 1], static_cast<uint64_t>(kSlots + 2));
  for (size_t k = 1; k < log.reads_before.size(); ++k) {
    EXPECT_GE(log.reads_before[k], std::min<uint64_t>(kSlots + k - 1, experts.size())) << k;
  }
  EXPECT_EQ(cache_->stats().pinned_slots, 0);
  StepMetrics m;
  provider_->TakeMetrics(m);
  EXPECT_EQ(m.cache_requests, experts.size());
  EXPECT_EQ(m.experts_demand_read, experts.size());
  EXPECT_EQ(m.expert_demand_bytes, experts.size() * ckpt_->config().expert_bytes());
}

// A layer needs every expert, 8 of them already cached (ids 24-31, the end of the order the
// model asks in), with 12 slots. The resident ones are pinned first, so no miss's fill evicts
// them: 24 reads, not 32. The misses take the other 4 slots at once: their reads are issued
// before the first multiply begins, while the hits are ready to multiply.
TEST_F(ExpertStreamTest, ResidentExpertsArePinnedFirstAndNeverReadAgain) {
  constexpr int64_t kSlots = 12;
  constexpr int32_t kCached = 8;
  ASSERT_NO_FATAL_FAILURE(Open("wide", kSlots, "lru"));
  std::vector<int32_t> cached, experts;
  for (int32_t e = kWideExperts - kCached; e < kWideExperts; ++e) cached.push_back(e);
  for (int32_t e = 0; e < kWideExperts; ++e) experts.push_back(e);
  RunLayer(3, cached);
  StepMetrics before;
  provider_->TakeMetrics(before);
  MultiplyLog log;
  ASSERT_NO_FATAL_FAILURE(RunLogged(3, experts, log));
  EXPECT_EQ(log.reads_before[0], static_cast<uint64_t>(kSlots - kCached));
  StepMetrics m;
  provider_->TakeMetrics(m);
  EXPECT_EQ(m.cache_hits, static_cast<uint64_t>(kCached));
  EXPECT_EQ(m.experts_demand_read, static_cast<uint64_t>(kWideExperts - kCached));
  EXPECT_EQ(cache_->stats().pinned_slots, 0);
}

}  // namespace
}  // namespace k3
