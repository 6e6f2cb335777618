// The streaming expert provider on its own (tiny checkpoint, real cache and read engine): the
// life of a lookahead guess. A guess holds a pin on its cache slot from its prefetch until its
// layer's demands have pinned what they use, so no fill in between can evict a right guess and
// make the disk read it twice; a guess whose layer passed without it loses the pin.
#include "pipeline/expert_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/checkpoint.h"
#include "core/model/weights.h"
#include "core/synth.h"
#include "io/aligned_buffer.h"
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
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    auto ckpt = Checkpoint::Open(dir_->path() + "/tiny");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto trunk = LoadTrunkWeights(*ckpt_);
    ASSERT_TRUE(trunk.ok()) << trunk.status();
    trunk_ = *std::move(trunk);
    const ModelConfig& c = ckpt_->config();
    const uint64_t slot = MeasureFootprint(*ckpt_, 16, 1).expert_slot_bytes;
    // Room for one layer's top-k, the guesses of the next and the top-k reserve, no more:
    // `mru` would then evict a finished guess first.
    const int64_t slots = 3 * c.num_experts_per_token + 1;
    auto policy =
        MakePolicy("mru", {.capacity = slots, .num_layers = static_cast<int32_t>(c.num_layers)});
    ASSERT_TRUE(policy.ok());
    auto cache = ExpertCache::Create(
        {.budget_bytes = slots * io::AlignUp(slot), .slot_bytes = slot}, *std::move(policy));
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto reads = io::ReadEngine::Create({.direct = false, .arena = cache_->arena()});
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

  std::vector<float> Hidden() const {
    return std::vector<float>(ckpt_->config().hidden_size, 0.5f);
  }

  static TempDir* dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<TrunkWeights> trunk_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<io::ReadEngine> reads_;
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

}  // namespace
}  // namespace k3
