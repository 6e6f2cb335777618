// BatchRequest::constraint (pipeline/batch_scheduler.h): the scheduler masks each row before
// sampling and reports each sampled token; without a constraint nothing changes; the demo
// model under a grammar constraint writes a valid turn.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/text/grammar/token_mask.h"
#include "core/text/tools/turn_parser.h"
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
    BatchEvents events;
    events.on_token = [&](size_t, int32_t, std::span<const float> logits, const StepMetrics&) {
      run.logits.emplace_back(logits.begin(), logits.end());
    };
    auto result = RunSequence(engine, r, events);
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
    // on_token sees the masked row.
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
class ConstrainedDemoTest : public ::k3::grammar::testing::DemoVocab {
 protected:
  static absl::StatusOr<std::unique_ptr<Engine>> OpenDemo(int max_context) {
    EngineOptions o;
    o.model_dir = demo().dir.path();
    o.max_context = max_context;
    o.memory.preset = "ultra";  // the smallest plan: the two-layer demo is below the others
    return Engine::Open(o);
  }
  // The assistant's turn after the prompt that opens `channel`, stopping at <|end_of_msg|>.
  static BatchRequest Request(const std::string& channel, int max_tokens, bool greedy, int seed) {
    BatchRequest r;
    r.prompt = Ids("<|open|>message role=\"assistant\"<|sep|><|open|>" + channel + "<|sep|>");
    r.max_tokens = max_tokens;
    r.stop_ids = {Special(grammar::kEndOfMsg)};
    r.sampler.greedy = greedy;
    r.sampler.temperature = 1.0;
    r.sampler.seed = seed;
    return r;
  }
  // Runs `r` under the constraint of `spec` (with max_tokens as its token budget if `budget`),
  // expecting a whole turn; the ids sampled.
  static std::vector<int32_t> RunWhole(Engine& engine, BatchRequest r, const OutputSpec& spec,
                                       bool budget) {
    auto constraint = grammar::GrammarConstraint::ForOutput(spec, trie());
    EXPECT_TRUE(constraint.ok()) << constraint.status();
    if (!constraint.ok()) return {};
    std::shared_ptr<grammar::GrammarConstraint> c = *std::move(constraint);
    EXPECT_LE(c->min_completion(), r.max_tokens);
    if (budget) c->set_token_budget(r.max_tokens);
    r.constraint = c;
    auto result = RunSequence(engine, r, {});
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return {};
    EXPECT_EQ(result->finish, FinishReason::kStop);
    EXPECT_TRUE(c->finished());
    EXPECT_FALSE(c->failed());
    return result->ids;
  }
};

TEST_F(ConstrainedDemoTest, TheDemoModelWritesAValidJsonResponse) {
  auto engine = OpenDemo(128);
  ASSERT_TRUE(engine.ok()) << engine.status();
  OutputSpec spec;
  spec.thinking = false;
  spec.response_format = ResponseFormat::kJsonSchema;
  spec.response_schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"unit":{"enum":["C","F"]},"ok":{"type":"boolean"}},
          "required":["unit","ok"]})");
  for (const bool greedy : {true, false}) {
    const std::vector<int32_t> ids = RunWhole(**engine, Request("response", 60, greedy, 9), spec,
                                              /*budget=*/false);
    auto text = tok().Decode(ids);
    ASSERT_TRUE(text.ok());
    const std::string tail = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    ASSERT_TRUE(text->ends_with(tail)) << *text;
    const auto body = nlohmann::json::parse(text->substr(0, text->size() - tail.size()));
    EXPECT_TRUE(body["unit"] == "C" || body["unit"] == "F") << *text;
    EXPECT_TRUE(body["ok"].is_boolean()) << *text;
  }
}

// A required call with thinking on: the demo model's think body never ends by itself, yet
// under the token budget the turn closes the think channel in time and ends with a whole call
// within max_tokens.
TEST_F(ConstrainedDemoTest, TheDemoModelEndsARequiredCallWithinItsBudget) {
  auto engine = OpenDemo(160);
  ASSERT_TRUE(engine.ok()) << engine.status();
  OutputSpec spec;
  spec.tools = {grammar::testing::GetWeather(), grammar::testing::GetTime()};
  spec.tool_choice = ToolChoice::kRequired;
  for (const bool greedy : {true, false}) {
    BatchRequest r = Request("think", 96, greedy, 5);
    // Without the budget the think body runs to max_tokens.
    r.constraint = *grammar::GrammarConstraint::ForOutput(spec, trie());
    auto cut = RunSequence(**engine, r, {});
    ASSERT_TRUE(cut.ok()) << cut.status();
    EXPECT_EQ(cut->finish, FinishReason::kLength);
    const std::vector<int32_t> ids = RunWhole(**engine, r, spec, /*budget=*/true);
    EXPECT_LE(ids.size(), 96u);
    TurnParser parser(tok(), spec);
    for (const int32_t id : ids) parser.Feed(id);
    parser.Finish();
    const ParsedTurn& turn = parser.result();
    EXPECT_TRUE(turn.ended);
    ASSERT_FALSE(turn.tool_calls.empty()) << *tok().Decode(ids);
    for (const ToolCall& call : turn.tool_calls) {
      EXPECT_TRUE(call.name == "get_weather" || call.name == "get_time") << call.name;
      const auto arguments = nlohmann::json::parse(call.arguments, nullptr, false);
      EXPECT_TRUE(arguments.is_object()) << call.arguments;
      if (call.name == "get_weather") {
        EXPECT_TRUE(arguments["city"].is_string()) << call.arguments;
      }
    }
    EXPECT_EQ(turn.dropped_calls, 0);
  }
}

}  // namespace
}  // namespace k3
