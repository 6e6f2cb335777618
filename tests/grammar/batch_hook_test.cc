// BatchRequest::constraint (pipeline/batch_scheduler.h): the scheduler masks each row before
// sampling and reports each sampled token; without a constraint nothing changes; the demo
// model under a grammar constraint writes a valid turn.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/grammar/token_mask.h"
#include "pipeline/batch_scheduler.h"
#include "tests/grammar/grammar_test_util.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

// Allows one id only, and records what it is told.
class OneToken : public TokenConstraint {
 public:
  explicit OneToken(int32_t id) : id_(id) {}
  void Mask(std::span<float> logits) override {
    ++masks;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (static_cast<int32_t>(i) != id_) logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
  void Accept(int32_t id) override { accepted.push_back(id); }
  int masks = 0;
  std::vector<int32_t> accepted;

 private:
  int32_t id_;
};

class BatchHookTest : public ::k3::testing::TinyModelSuite {
 protected:
  static BatchRequest Request(bool greedy) {
    BatchRequest r;
    r.prompt = {3, 7, 11, 5, 9};
    r.max_tokens = 8;
    r.sampler.greedy = greedy;
    r.sampler.temperature = 1.0;
    r.sampler.seed = 42;
    return r;
  }
  // The ids and the logits each was sampled from.
  struct Run {
    std::vector<int32_t> ids;
    std::vector<std::vector<float>> logits;
  };
  // The reference: Prefill then Decode, no scheduler.
  static Run Alone(Engine& engine, const BatchRequest& r) {
    Run run;
    SequenceState state = engine.NewState();
    Sampler sampler(r.sampler);
    std::vector<float> logits;
    EXPECT_TRUE(engine.Prefill(r.prompt, state, logits).ok());
    for (int i = 0; i < r.max_tokens; ++i) {
      const int32_t id = sampler.Sample(logits);
      run.ids.push_back(id);
      run.logits.push_back(logits);
      if (i + 1 < r.max_tokens) {
        EXPECT_TRUE(engine.Decode(id, state, logits).ok());
      }
    }
    return run;
  }
  static Run Go(Engine& engine, const BatchRequest& r) {
    Run run;
    SequenceHooks hooks;
    hooks.on_token = [&](int32_t, std::span<const float> logits, const StepMetrics&) {
      run.logits.emplace_back(logits.begin(), logits.end());
    };
    auto result = RunSequence(engine, r, hooks);
    EXPECT_TRUE(result.ok()) << result.status();
    if (result.ok()) run.ids = result->ids;
    return run;
  }
};

TEST_F(BatchHookTest, AConstraintThatAllowsOneIdYieldsOnlyIt) {
  EngineOptions o;
  o.model_dir = ModelDir();
  o.max_context = 32;
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const bool greedy : {true, false}) {
    const Run free = Alone(**engine, Request(greedy));
    ASSERT_EQ(free.ids.size(), 8u);
    // An id the free run never picks first, so that the mask is what chooses it.
    const int32_t forced = free.ids[0] == 2 ? 3 : 2;
    BatchRequest r = Request(greedy);
    auto one = std::make_shared<OneToken>(forced);
    r.constraint = one;
    const Run constrained = Go(**engine, r);
    EXPECT_EQ(constrained.ids, std::vector<int32_t>(8, forced));
    EXPECT_EQ(one->accepted, constrained.ids);
    EXPECT_EQ(one->masks, 8);
    // The TokenFn sees the masked row.
    for (const auto& row : constrained.logits) {
      EXPECT_FALSE(std::isinf(row[forced]));
      EXPECT_TRUE(std::isinf(row[forced == 2 ? 3 : 2]));
    }
    // Without a constraint the run is bit for bit Prefill then Decode.
    const Run again = Go(**engine, Request(greedy));
    EXPECT_EQ(again.ids, free.ids);
    ASSERT_EQ(again.logits.size(), free.logits.size());
    for (size_t i = 0; i < free.logits.size(); ++i) {
      EXPECT_TRUE(::k3::testing::BitIdentical(again.logits[i], free.logits[i])) << i;
    }
  }
}

// The demo model (random weights, one layer) with the demo tokenizer, constrained to a JSON
// schema response: whatever it prefers, the turn comes out whole and valid.
class ConstrainedDemoTest : public ::k3::grammar::testing::DemoVocab {};

TEST_F(ConstrainedDemoTest, TheDemoModelWritesAValidJsonResponse) {
  EngineOptions o;
  o.model_dir = demo().dir.path();
  o.max_context = 128;
  o.memory.preset = "ultra";  // the smallest plan: the two-layer demo is below the others
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  OutputSpec spec;
  spec.thinking = false;
  spec.response_format = ResponseFormat::kJsonSchema;
  spec.response_schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"unit":{"enum":["C","F"]},"ok":{"type":"boolean"}},
          "required":["unit","ok"]})");
  const TokenId end = Special(grammar::kEndOfMsg);
  for (const bool greedy : {true, false}) {
    auto constraint = grammar::GrammarConstraint::ForOutput(spec, trie());
    ASSERT_TRUE(constraint.ok()) << constraint.status();
    BatchRequest r;
    r.prompt = Ids("<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
    r.max_tokens = 60;
    r.stop_ids = {end};
    r.sampler.greedy = greedy;
    r.sampler.temperature = 1.0;
    r.sampler.seed = 9;
    std::shared_ptr<grammar::GrammarConstraint> c = *std::move(constraint);
    r.constraint = c;
    auto result = RunSequence(**engine, r, {});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->finish, FinishReason::kStop);
    EXPECT_TRUE(c->finished());
    EXPECT_FALSE(c->failed());
    auto text = tok().Decode(result->ids);
    ASSERT_TRUE(text.ok());
    const std::string tail = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    ASSERT_TRUE(text->ends_with(tail)) << *text;
    const auto body = nlohmann::json::parse(text->substr(0, text->size() - tail.size()));
    EXPECT_TRUE(body["unit"] == "C" || body["unit"] == "F") << *text;
    EXPECT_TRUE(body["ok"].is_boolean()) << *text;
  }
}

}  // namespace
}  // namespace k3
