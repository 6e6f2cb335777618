// The memory plan's activation figure (StepScratch::Bytes, which pipeline/memory_plan.cc plans
// prompt chunks and batched steps with) against what the forward pass allocates for them: the
// capacities of the step scratch's buffers after steps of several token counts.
#include "core/model/step_scratch.h"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <numeric>

#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

class StepScratchTest : public ::k3::testing::TinyModelInMemorySuite {
 protected:
  const ModelConfig& config() const { return ckpt_->config(); }
  // `n` ids spread over the vocabulary, different for each `seed`.
  std::vector<int32_t> Ids(size_t n, int32_t seed) const {
    std::vector<int32_t> ids(n);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>((seed + 7 * i) % static_cast<size_t>(config().vocab_size));
    }
    return ids;
  }
};

TEST_F(StepScratchTest, NothingIsAllocatedBeforeAStep) {
  EXPECT_EQ(model_->step_scratch().allocated_bytes(), 0u);
  EXPECT_EQ(model_->step_scratch().expert_pass_bytes(), 0u);
  EXPECT_EQ(model_->step_scratch().attention_head_bytes(), 0u);
  EXPECT_EQ(StepScratch::Bytes(config(), 0), 0u);
}

// Prompt chunks of several sizes, a smaller one after larger ones, and decode steps: after each
// the scratch holds exactly what the plan counts for the most tokens run so far (it grows to
// that and never shrinks, so decoding allocates nothing).
TEST_F(StepScratchTest, PlannedBytesPerTokenAreWhatPromptChunksAllocate) {
  const uint64_t per_token = StepScratch::BytesPerToken(config());
  ASSERT_GT(per_token, 0u);
  size_t most = 0;
  int32_t seed = 1;
  for (size_t tokens : {1, 4, 16, 5, 300}) {
    SequenceState state(config());
    std::vector<float> logits;
    const std::vector<int32_t> ids = Ids(tokens, seed++);
    ASSERT_TRUE(model_->Forward(ids, state, false, logits).ok());
    most = std::max(most, tokens);
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_TRUE(model_->Forward({&next, 1}, state, false, logits).ok());
    EXPECT_EQ(model_->step_scratch().reserved_tokens(), most) << tokens << " tokens";
    EXPECT_EQ(model_->step_scratch().allocated_bytes(), StepScratch::Bytes(config(), most))
        << tokens << " tokens";
    EXPECT_EQ(StepScratch::Bytes(config(), most), most * per_token);
  }
  // The serial provider multiplies one expert at a time: one pass, within the plan's figure for
  // one compute thread (300 tokens of top-2 over 8 experts give an expert about 75 rows).
  EXPECT_GT(model_->step_scratch().expert_pass_bytes(), 0u);
  EXPECT_LE(model_->step_scratch().expert_pass_bytes(), StepScratch::ExpertPassBytes(config()));
  // An MLA head's buffers are lent per task: at most one per thread, each with scores for at
  // most twice the longest attention (301 positions), grown geometrically.
  const uint64_t head_bytes = 4 * (2 * config().kv_lora_rank + 2 * (most + 1));
  EXPECT_GT(model_->step_scratch().attention_head_bytes(), 0u);
  EXPECT_LE(model_->step_scratch().attention_head_bytes(),
            tbb::this_task_arena::max_concurrency() * head_bytes);
}

// A batched step stacks its segments' tokens: planned as their sum.
TEST_F(StepScratchTest, PlannedBytesOfABatchedStepAreThoseOfItsStackedTokens) {
  const std::vector<size_t> counts = {6, 1, 9};
  std::vector<std::vector<int32_t>> ids;
  std::vector<SequenceState> states;
  states.reserve(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    ids.push_back(Ids(counts[i], static_cast<int32_t>(10 + i)));
    states.emplace_back(config());
  }
  std::vector<BatchSegment> segments;
  for (size_t i = 0; i < counts.size(); ++i) segments.push_back({ids[i], &states[i]});
  std::vector<float> logits;
  ASSERT_TRUE(model_->ForwardBatch(segments, logits).ok());
  const size_t stacked = std::accumulate(counts.begin(), counts.end(), size_t{0});
  EXPECT_EQ(model_->step_scratch().reserved_tokens(), stacked);
  EXPECT_EQ(model_->step_scratch().allocated_bytes(), StepScratch::Bytes(config(), stacked));
}

}  // namespace
}  // namespace k3
