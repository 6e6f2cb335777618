// A step whose sequences are all cancelled ends after the layer in progress (core/model/model.h,
// BatchSegment::cancelled): with the engine's streaming experts, the lookahead of that cut pass
// must not leak into the next (a cut prompt's prediction was once scored by the decode step
// after it, past the end of the decode figures: a crash), and the other sequences run exactly.
#include <gtest/gtest.h>

#include <atomic>

#include "pipeline/engine.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::BitIdentical;

class CancelStepTest : public ::k3::testing::TinyModelSuite {};

// A prompt and two decode steps of one sequence, with (if `cut`) another prompt's step between
// them that is cancelled after its first layer: the logits of each step of the sequence.
std::vector<std::vector<float>> RunOne(Engine& engine, bool cut) {
  const std::vector<int32_t> prompt = {3, 7, 11, 5, 9}, other = {12, 40, 2, 6, 6, 1, 9, 33};
  SequenceState state = engine.NewState(), gone = engine.NewState();
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  const BatchSegment first{.ids = prompt, .state = &state};
  EXPECT_TRUE(engine.Step({&first, 1}, logits).ok());
  out.push_back(logits);
  if (cut) {
    std::atomic<bool> cancelled{true};  // seen after the first layer
    const BatchSegment cut_step{.ids = other, .state = &gone, .cancelled = &cancelled};
    const int64_t before = engine.layers_run();
    EXPECT_TRUE(engine.Step({&cut_step, 1}, logits).ok());
    EXPECT_EQ(engine.layers_run() - before, 1);
  }
  for (const int32_t id : {17, 2}) {
    const BatchSegment one{.ids = {&id, 1}, .state = &state};
    EXPECT_TRUE(engine.Step({&one, 1}, logits).ok());
    out.push_back(logits);
  }
  return out;
}

TEST_F(CancelStepTest, ACutPromptStepLeavesTheOtherSequencesExact) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  ASSERT_GT(o.prefill_prefetch_distance, o.prefetch_distance);  // a prompt looks further ahead
  auto fresh = Engine::Open(o);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const auto expected = RunOne(**fresh, false);
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto got = RunOne(**engine, true);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(BitIdentical(got[i], expected[i])) << i;
}

}  // namespace
}  // namespace k3
