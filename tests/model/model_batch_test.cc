// A batched step's two extras (core/model/model.h, BatchSegment): the logits after every
// position of a segment, equal to the whole-prompt forward pass's; and a segment cancelled
// between layers, which leaves the step at the next layer while the others' logits and states
// stay bit-identical to running them alone, counted in layers.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::BitIdentical;

class ModelBatchTest : public ::k3::testing::TinyModelInMemorySuite {
 protected:
  SequenceState NewState() const { return SequenceState(ckpt_->config()); }
  size_t vocab() const { return static_cast<size_t>(ckpt_->config().vocab_size); }
  int64_t layers() const { return ckpt_->config().num_layers; }

  // `ids` alone from an empty state: the logits of every position.
  std::vector<float> Alone(std::span<const int32_t> ids, SequenceState& state) {
    std::vector<float> logits;
    EXPECT_TRUE(model_->Forward(ids, state, /*all_positions=*/true, logits).ok());
    return logits;
  }
};

const std::vector<int32_t> kLong = {3, 7, 11, 5, 9, 2, 30, 41};
const std::vector<int32_t> kShort = {12, 40, 2};

TEST_F(ModelBatchTest, PositionLogitsEqualTheWholePromptsBesideAnotherSegment) {
  SequenceState alone = NewState();
  const std::vector<float> expected = Alone(kLong, alone);
  SequenceState a = NewState(), b = NewState();
  std::vector<std::vector<float>> heard;
  BatchSegment with{.ids = kLong, .state = &a};
  with.on_position_logits = [&](size_t row, std::span<const float> logits) {
    EXPECT_EQ(row, heard.size());
    heard.emplace_back(logits.begin(), logits.end());
  };
  const BatchSegment segments[] = {{.ids = kShort, .state = &b}, with};
  std::vector<float> last;
  ASSERT_TRUE(model_->ForwardBatch(segments, last).ok());
  ASSERT_EQ(heard.size(), kLong.size());
  for (size_t row = 0; row < heard.size(); ++row) {
    const std::vector<float> want(expected.begin() + row * vocab(),
                                  expected.begin() + (row + 1) * vocab());
    EXPECT_TRUE(BitIdentical(heard[row], want)) << row;
  }
  // The step's own logits are the last position's.
  EXPECT_TRUE(BitIdentical({last.begin() + vocab(), last.end()}, heard.back()));
}

// Cancelled after layer 1 of a step with another segment: the step runs every layer for the
// other, whose logits and state are those of running it alone; the cancelled one's logits are
// zeros and its state is left.
TEST_F(ModelBatchTest, ACancelledSegmentLeavesAtTheNextLayerAndTheOthersAreExact) {
  ASSERT_GE(layers(), 3);
  SequenceState alone = NewState();
  std::vector<float> alone_logits;
  ASSERT_TRUE(model_->Forward(kShort, alone, false, alone_logits).ok());

  SequenceState a = NewState(), b = NewState();
  std::atomic<bool> cancel{false};
  const BatchSegment segments[] = {{.ids = kLong, .state = &a, .cancelled = &cancel},
                                   {.ids = kShort, .state = &b}};
  std::vector<size_t> tokens_at;  // the rows each layer ran
  std::vector<float> logits;
  const int64_t before = model_->layers_run();
  ASSERT_TRUE(model_
                  ->ForwardBatch(segments, logits,
                                 [&](int64_t layer, std::span<const float> prefix) {
                                   tokens_at.push_back(prefix.size() / ckpt_->config().hidden_size);
                                   if (layer == 1) cancel = true;
                                 })
                  .ok());
  EXPECT_EQ(model_->layers_run() - before, layers());
  ASSERT_EQ(tokens_at.size(), static_cast<size_t>(layers()));
  EXPECT_EQ(tokens_at[0], kLong.size() + kShort.size());
  EXPECT_EQ(tokens_at[1], kLong.size() + kShort.size());
  EXPECT_EQ(tokens_at[2], kShort.size());  // from the next layer on, only the other's rows
  ASSERT_EQ(logits.size(), 2 * vocab());
  EXPECT_TRUE(
      std::all_of(logits.begin(), logits.begin() + vocab(), [](float v) { return v == 0; }));
  EXPECT_TRUE(BitIdentical({logits.begin() + vocab(), logits.end()}, alone_logits));
  EXPECT_EQ(b.position(), alone.position());
  EXPECT_EQ(a.position(), 0);  // never appended
  // b goes on exactly as the one that ran alone.
  std::vector<float> next_b, next_alone;
  const int32_t id = 17;
  ASSERT_TRUE(model_->Forward({&id, 1}, b, false, next_b).ok());
  ASSERT_TRUE(model_->Forward({&id, 1}, alone, false, next_alone).ok());
  EXPECT_TRUE(BitIdentical(next_b, next_alone));
}

// Every segment cancelled: the step ends after the layer in progress, the layers after it never
// run (the clock a server counts a cancellation in).
TEST_F(ModelBatchTest, WhenEverySegmentIsCancelledTheStepEndsAtTheNextLayer) {
  ASSERT_GE(layers(), 3);
  SequenceState a = NewState();
  std::atomic<bool> cancel{false};
  const BatchSegment one[] = {{.ids = kLong, .state = &a, .cancelled = &cancel}};
  std::vector<float> logits;
  int64_t observed = 0;
  const int64_t before = model_->layers_run();
  ASSERT_TRUE(model_
                  ->ForwardBatch(one, logits,
                                 [&](int64_t layer, std::span<const float>) {
                                   ++observed;
                                   if (layer == 0) cancel = true;
                                 })
                  .ok());
  EXPECT_EQ(observed, 1);
  EXPECT_EQ(model_->layers_run() - before, 1);
  ASSERT_EQ(logits.size(), vocab());
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return v == 0; }));
}

}  // namespace
}  // namespace k3
