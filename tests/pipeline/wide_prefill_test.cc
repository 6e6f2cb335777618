// Prompts whose chunk needs more experts per layer than the cache holds (a prefill union larger
// than the cache): the streaming provider's window slides over each layer's union, reading each
// expert of it once, and the answer is the synchronous model's to the bit (DESIGN.md invariant
// 1); a failed read in the window fails the prompt, naming file and offset (invariant 2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "core/synth/synth.h"
#include "pipeline/engine.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::BitIdentical;
using ::k3::testing::CountingProvider;
using ::k3::testing::OptionsFor;
using ::k3::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A prompt in one chunk whose experts outnumber the cache: `tiny` with 32 experts per layer, 24
// tokens (a union of up to 32 experts per MoE layer), a cache of 5 slots. The window slides over
// each layer's union, and still every (layer, expert) of it is read once, none twice, by demand
// (no lookahead) or by demand and used prefetch (lookahead 1, also on one compute thread); the
// logits are bit-identical to the synchronous model's, to every expert cached, to the serial
// baseline, and to the same prompt fed a token at a time.
class WidePrefillTest : public ::k3::testing::TinyModelSuite {
 protected:
  static constexpr int kSlots = 5;
  static constexpr size_t kTokens = 24;

  static void SetUpTestSuite() {
    dir_ = new TempDir();  // the suite's own model only (TinyModelSuite deletes the dir)
    SynthOptions opt = ::k3::testing::TinyModel("");
    opt.overrides = {{"num_experts", "32"}};
    ASSERT_TRUE(::k3::testing::LinkSynthModel(WideDir(), "tiny, 32 experts", opt));
  }
  static std::string WideDir() { return dir_->path() + "/wide"; }

  static std::vector<int32_t> Prompt() {
    std::vector<int32_t> ids;
    for (size_t t = 0; t < kTokens; ++t) ids.push_back(static_cast<int32_t>((t * 37 + 5) % 200));
    return ids;
  }
  // The prompt in one chunk, with a cache of kSlots experts.
  static EngineOptions SmallCache() {
    EngineOptions o = OptionsFor(WideDir());
    o.prefill_chunk = kTokens;
    auto ckpt = Checkpoint::Open(WideDir());
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    const uint64_t slot = MeasureFootprint(**ckpt, o.max_context, kTokens).expert_slot_bytes;
    o.memory = {.trunk_gb = 1, .cache_gb = (kSlots + 0.5) * slot / 1e9};
    o.prefetch_distance = 0;
    o.prefill_prefetch_distance = 0;
    return o;
  }
  static absl::StatusOr<std::vector<float>> Prefill(const EngineOptions& o, StepMetrics* m,
                                                    int64_t* slots = nullptr) {
    auto engine = Engine::Open(o);
    if (!engine.ok()) return engine.status();
    if (slots != nullptr) *slots = (*engine)->plan().cache_slots;
    SequenceState state = (*engine)->NewState();
    std::vector<float> logits;
    if (auto s = (*engine)->Prefill(Prompt(), state, logits, m); !s.ok()) return s;
    return logits;
  }
};

TEST_F(WidePrefillTest, AUnionLargerThanTheCacheIsReadOnceWithTheSameBits) {
  // The synchronous model on the same chunk: the reference logits and the union sizes.
  auto ckpt = Checkpoint::Open(WideDir());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto trunk = LoadTrunkWeights(**ckpt);
  ASSERT_TRUE(trunk.ok()) << trunk.status();
  CountingProvider counting(**ckpt);
  Model model((*ckpt)->config(), **trunk, counting);
  SequenceState state((*ckpt)->config());
  std::vector<float> want;
  ASSERT_TRUE(model.Forward(Prompt(), state, false, want).ok());
  const uint64_t unions = counting.requested;
  const ModelConfig& c = (*ckpt)->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_dense(l) ? 0 : 1;
  ASSERT_GT(unions, static_cast<uint64_t>(3 * kSlots * moe_layers));  // 3x the cache, on average

  struct Setting {
    std::string name;
    EngineOptions options;
  };
  std::vector<Setting> settings;
  settings.push_back({"small cache", SmallCache()});
  settings.push_back({"small cache, serial", SmallCache()});
  settings.back().options.overlap = false;
  settings.push_back({"small cache, prompt lookahead 1", SmallCache()});
  settings.back().options.prefill_prefetch_distance = 1;
  // One thread runs the graph: a demand that waits for a slot there must not need a multiply.
  settings.push_back({"small cache, prompt lookahead 1, one thread", SmallCache()});
  settings.back().options.prefill_prefetch_distance = 1;
  settings.back().options.threads = 1;
  settings.push_back({"every expert cached", SmallCache()});
  settings.back().options.memory = {.preset = "max"};
  settings.push_back({"a token at a time", SmallCache()});
  settings.back().options.prefill_chunk = 1;
  const uint64_t expert = c.expert_bytes();
  for (const Setting& s : settings) {
    StepMetrics m;
    int64_t slots = 0;
    auto logits = Prefill(s.options, &m, &slots);
    ASSERT_TRUE(logits.ok()) << s.name << ": " << logits.status();
    EXPECT_TRUE(BitIdentical(*logits, want)) << s.name;
    if (s.options.prefill_chunk == 1 || s.options.memory.preset == "max") continue;
    EXPECT_EQ(slots, kSlots) << s.name;
    EXPECT_EQ(m.cache_requests, unions) << s.name;
    if (s.options.prefill_prefetch_distance == 0) {
      // A cold cache: every expert of every union read once, by demand.
      EXPECT_EQ(m.experts_demand_read, unions) << s.name;
      EXPECT_EQ(m.cache_hits, 0u) << s.name;
      EXPECT_EQ(m.expert_demand_bytes, unions * expert) << s.name;
    } else {
      EXPECT_GT(m.prefetch_predicted, 0u) << s.name;
      EXPECT_EQ(m.experts_demand_read + m.cache_hits, unions) << s.name;
      EXPECT_LE(m.experts_demand_read + m.expert_prefetch_used_bytes / expert, unions) << s.name;
    }
  }
}

// A bad sector in every expert of one layer, in the middle of such a window: the prompt fails
// naming the file and the offset, and nothing hangs.
TEST_F(WidePrefillTest, AFailedReadInTheWindowNamesFileAndOffset) {
  auto ckpt = Checkpoint::Open(WideDir());
  ASSERT_TRUE(ckpt.ok());
  const std::string shard = (*ckpt)->shard_paths()[(*ckpt)->expert(2, 0).spans[0].shard];
  const std::string file = shard.substr(shard.rfind('/'));
  for (bool overlap : {true, false}) {
    EngineOptions o = SmallCache();
    o.overlap = overlap;
    o.faults = std::make_shared<io::FaultPlan>();
    for (int e = 0; e < (*ckpt)->config().num_experts; ++e) {
      o.faults->FailAtOffset((*ckpt)->expert(2, e).spans[0].offset + 100, EIO, -1, file);
    }
    StepMetrics m;
    auto logits = Prefill(o, &m);
    ASSERT_FALSE(logits.ok()) << "overlap " << overlap;
    const std::string message(logits.status().message());
    EXPECT_THAT(message, AllOf(HasSubstr(file.substr(1)), HasSubstr("offset"))) << overlap;
  }
}

}  // namespace
}  // namespace k3
