// GrammarConstraint's token budget (core/text/grammar/token_mask.h) on the demo vocabulary: walks
// whose logits favour free text far above the markers, which without a budget would not end,
// end with <|end_of_msg|> within every budget from the shortest turn up, and their calls and
// JSON validate; with ample slack, or a budget the turn cannot meet, the masks are the
// grammar's alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/turn_check.h"

namespace k3::grammar {
namespace {

using ::k3::grammar::testing::GetTime;
using ::k3::grammar::testing::GetWeather;
using ::k3::grammar::testing::IdSymbols;
using ::k3::grammar::testing::ParseJson;
using ::k3::grammar::testing::ParseTurn;
using ::k3::grammar::testing::Turn;
using ::k3::grammar::testing::Valid;
using Json = nlohmann::ordered_json;

OutputSpec TwoToolsRequired(bool thinking) {
  OutputSpec spec;
  spec.thinking = thinking;
  spec.tools = {GetWeather(), GetTime()};
  spec.tool_choice = ToolChoice::kRequired;
  return spec;
}

OutputSpec NamedTool() {
  OutputSpec spec;
  spec.tools = {GetWeather(), GetTime()};
  spec.tool_choice = ToolChoice::kNamed;
  spec.named_tool = "get_weather";
  return spec;
}

OutputSpec NestedJsonSchema() {
  OutputSpec spec;
  spec.response_format = ResponseFormat::kJsonSchema;
  spec.response_schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},
      "tags":{"type":"array","items":{"enum":["alpha","b",1]},"minItems":2,"maxItems":4},
      "address":{"type":"object","properties":{"zip":{"type":"string"},
                  "geo":{"type":"array","items":{"type":"number"},"minItems":1}},
                 "required":["zip","geo"],"additionalProperties":false}},
      "required":["name","age","ok","tags","address"]})");
  return spec;
}

OutputSpec JsonObject() {
  OutputSpec spec;
  spec.response_format = ResponseFormat::kJsonObject;
  spec.thinking = false;
  return spec;
}

class TokenBudgetTest : public ::k3::grammar::testing::DemoVocab {
 protected:
  static std::unique_ptr<GrammarConstraint> Constraint(const OutputSpec& spec) {
    auto c = GrammarConstraint::ForOutput(spec, trie());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Random logits with every ordinary token 8 above the specials: free text (a think body, a
  // string, digits) all but never ends by itself.
  static std::vector<float> Logits(std::mt19937& rng) {
    std::normal_distribution<float> normal;
    std::vector<float> logits(tok().vocab_size());
    for (int32_t id = 0; id < tok().vocab_size(); ++id) {
      logits[id] = normal(rng) + (tok().IsSpecial(id) ? 0.0f : 8.0f);
    }
    return logits;
  }

  // Samples from the softmax of the masked logits.
  static int32_t Sample(const std::vector<float>& logits, std::mt19937& rng) {
    float top = -INFINITY;
    for (const float x : logits) top = std::max(top, x);
    std::vector<double> weights(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) weights[i] = std::exp(logits[i] - top);
    return std::discrete_distribution<int32_t>(weights.begin(), weights.end())(rng);
  }

  // A walk of at most `cap` tokens under `budget` (-1: none); the ids sampled. One walk in
  // three makes the matcher forget every State but the current one after each token, which
  // renumbers the States that completions are known for.
  static std::vector<int32_t> Walk(const OutputSpec& spec, int budget, int cap, std::mt19937& rng) {
    std::unique_ptr<GrammarConstraint> c = Constraint(spec);
    if (budget >= 0) c->set_token_budget(budget);
    if (rng() % 3 == 0) c->set_max_states(2);
    std::vector<int32_t> ids;
    while (static_cast<int>(ids.size()) < cap) {
      std::vector<float> logits = Logits(rng);
      c->Mask(logits);
      const int32_t id = Sample(logits, rng);
      ids.push_back(id);
      c->Accept(id);
      EXPECT_FALSE(c->failed());
      if (id == Special(kEndOfMsg)) break;
    }
    return ids;
  }

  // The turn the ids spell, checked against the spec: tools are forced, else a JSON response.
  static void ExpectValid(const OutputSpec& spec, const std::vector<int32_t>& ids) {
    const Turn turn = ParseTurn(IdSymbols(*trie(), ids), spec.thinking);
    ASSERT_TRUE(turn.ended);
    if (spec.response_format != ResponseFormat::kText) {
      const Json body = ParseJson(turn.response);
      ASSERT_FALSE(body.is_discarded()) << turn.response;
      EXPECT_TRUE(body.is_object()) << turn.response;
      if (spec.response_format == ResponseFormat::kJsonSchema) {
        EXPECT_TRUE(Valid(body, spec.response_schema)) << turn.response;
      }
      return;
    }
    ASSERT_FALSE(turn.calls.empty());
    if (spec.tool_choice == ToolChoice::kNamed) {
      EXPECT_EQ(turn.calls.size(), 1u);
      EXPECT_EQ(turn.calls[0].tool, spec.named_tool);
    }
    for (const Turn::Call& call : turn.calls) {
      const ToolSpec* tool = nullptr;
      for (const ToolSpec& t : spec.tools) {
        if (t.name == call.tool) tool = &t;
      }
      ASSERT_NE(tool, nullptr) << call.tool;
      EXPECT_TRUE(Valid(call.arguments, tool->parameters)) << call.arguments.dump();
    }
  }
};

TEST_F(TokenBudgetTest, EveryWalkEndsWithinItsBudgetAndValidates) {
  const std::pair<std::string, OutputSpec> specs[] = {
      {"required, thinking", TwoToolsRequired(true)},
      {"required, no thinking", TwoToolsRequired(false)},
      {"named", NamedTool()},
      {"json_schema", NestedJsonSchema()},
      {"json_object", JsonObject()},
  };
  std::mt19937 rng(17);
  int unended = 0;
  for (const auto& [name, spec] : specs) {
    const int shortest = Constraint(spec)->min_completion();
    ASSERT_GT(shortest, 0) << name;
    ASSERT_LT(shortest, 1000) << name;
    // Without a budget the logits keep the turn in free text (a json_object may close early:
    // `{}` is one token).
    unended += Walk(spec, -1, shortest + 200, rng).back() != Special(kEndOfMsg);
    for (const int extra : {0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 200}) {
      const int budget = shortest + extra;
      const std::vector<int32_t> ids = Walk(spec, budget, budget + 50, rng);
      ASSERT_LE(static_cast<int>(ids.size()), budget) << name << " budget " << budget;
      ASSERT_EQ(ids.back(), Special(kEndOfMsg)) << name << " budget " << budget;
      ExpectValid(spec, ids);
    }
  }
  EXPECT_GE(unended, 4);
}

// The shortest completions are the grammar's: a required string argument as an empty string,
// an integer as one digit, an enum as its shortest value, an array at its minItems.
TEST_F(TokenBudgetTest, AtTheShortestBudgetTheMinimalTurnValidates) {
  std::mt19937 rng(23);
  for (const OutputSpec& spec : {NamedTool(), NestedJsonSchema()}) {
    const int shortest = Constraint(spec)->min_completion();
    for (int walk = 0; walk < 5; ++walk) {
      const std::vector<int32_t> ids = Walk(spec, shortest, shortest + 50, rng);
      ASSERT_EQ(ids.back(), Special(kEndOfMsg));
      EXPECT_LE(static_cast<int>(ids.size()), shortest);
      ExpectValid(spec, ids);
    }
  }
}

// Masks equal the grammar's alone at every step of walks (the same ids fed to both) while the
// budget leaves ample slack, and while the budget is below the shortest completion (a token
// that spells several symbols of it may bring the turn back within the budget later).
TEST_F(TokenBudgetTest, AmpleOrHopelessBudgetsChangeNoMask) {
  std::mt19937 rng(29);
  int compared = 0;
  for (const OutputSpec& spec : {TwoToolsRequired(true), NestedJsonSchema(), JsonObject()}) {
    const int shortest = Constraint(spec)->min_completion();
    for (const int budget : {1000000, shortest - 1, 1}) {
      std::unique_ptr<GrammarConstraint> plain = Constraint(spec);
      std::unique_ptr<GrammarConstraint> budgeted = Constraint(spec);
      budgeted->set_token_budget(budget);
      for (int step = 0; step < 300 && !plain->finished(); ++step) {
        std::vector<float> logits = Logits(rng);
        std::vector<float> masked = logits;
        plain->Mask(logits);
        budgeted->Mask(masked);
        if (budget > 1000 || budgeted->remaining_tokens() < budgeted->min_completion()) {
          ASSERT_EQ(logits, masked) << "budget " << budget << " step " << step;
          ++compared;
        }
        // Specials one time in four, so that the walk gets past the bodies.
        if (rng() % 4 == 0) {
          for (int32_t id = 0; id < tok().vocab_size(); ++id) {
            if (!tok().IsSpecial(id)) logits[id] = -INFINITY;
          }
          if (std::all_of(logits.begin(), logits.end(), [](float x) { return std::isinf(x); })) {
            logits = masked;
          }
        }
        const int32_t id = Sample(logits, rng);
        plain->Accept(id);
        budgeted->Accept(id);
      }
    }
  }
  EXPECT_GE(compared, 300);
}

// Near the budget, Mask against a per-token simulation on a second matcher: a token is allowed
// iff the grammar allows it and the shortest completion after it fits in the tokens left.
TEST_F(TokenBudgetTest, NearTheBudgetMaskEqualsBruteForce) {
  std::mt19937 rng(31);
  int judged = 0;
  for (const OutputSpec& spec : {TwoToolsRequired(false), NestedJsonSchema(), JsonObject()}) {
    auto grammar = std::make_shared<Grammar>(::k3::grammar::testing::MustBuild(spec));
    GrammarConstraint c(grammar, trie());
    Matcher m(grammar);
    Matcher::State s = m.start();
    const int budget = m.MinCompletion(s) + 20;
    c.set_token_budget(budget);
    for (int step = 0; !c.finished(); ++step) {
      ASSERT_LT(step, budget);
      std::vector<float> logits = Logits(rng);
      c.Mask(logits);
      const int limit = budget - step - 1;
      for (int32_t id = 0; id < tok().vocab_size(); ++id) {
        const int16_t symbol = trie()->symbol(id);
        Matcher::State next = Matcher::kDead;
        if (symbol == TokenTrie::kOrdinary) next = m.NextBytes(s, trie()->bytes(id));
        if (symbol >= kEndOfMsg) next = m.Next(s, symbol);
        const bool want = next != Matcher::kDead && m.MinCompletion(next) <= limit;
        ASSERT_EQ(!std::isinf(logits[id]), want) << "step " << step << " id " << id;
      }
      ++judged;
      const int32_t id = Sample(logits, rng);
      c.Accept(id);
      s = tok().IsSpecial(id) ? m.Next(s, trie()->symbol(id)) : m.NextBytes(s, trie()->bytes(id));
    }
  }
  EXPECT_GE(judged, 60);
}

// The budget counts from the constraint's start: tokens accepted before it was set count.
TEST_F(TokenBudgetTest, TheBudgetCountsAcceptedTokens) {
  std::unique_ptr<GrammarConstraint> c = Constraint(TwoToolsRequired(true));
  for (const TokenId id : Ids("Let me see")) c->Accept(id);
  c->set_token_budget(100);
  EXPECT_EQ(c->remaining_tokens(), 100 - static_cast<int>(Ids("Let me see").size()));
  c->Accept(Ids(".")[0]);
  EXPECT_EQ(c->remaining_tokens(), 99 - static_cast<int>(Ids("Let me see").size()));
  EXPECT_EQ(Constraint(JsonObject())->remaining_tokens(), -1);
}

// Every byte is a token of its own, which the budget's bound (a token per symbol) relies on.
TEST_F(TokenBudgetTest, EveryByteIsAToken) {
  std::vector<bool> single(256, false);
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    if (trie()->symbol(id) == TokenTrie::kOrdinary && trie()->bytes(id).size() == 1) {
      single[static_cast<unsigned char>(trie()->bytes(id)[0])] = true;
    }
  }
  EXPECT_EQ(std::count(single.begin(), single.end(), true), 256);
}

}  // namespace
}  // namespace k3::grammar
