// Token masking (core/text/grammar/token_mask.h) on the demo vocabulary: example E's ids pass the
// mask token by token; random walks that sample only allowed tokens always end in a valid turn
// whose calls and JSON validate against their schemas; Mask equals a per-token simulation
// without the trie; a forbidden token stops the constraint without harm.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/turn_check.h"

namespace k3::grammar {
namespace {

using ::k3::grammar::testing::GetTime;
using ::k3::grammar::testing::GetWeather;
using ::k3::grammar::testing::IdSymbols;
using ::k3::grammar::testing::MustBuild;
using ::k3::grammar::testing::ParseJson;
using ::k3::grammar::testing::ParseTurn;
using ::k3::grammar::testing::Symbols;
using ::k3::grammar::testing::Turn;
using ::k3::grammar::testing::Valid;
using Json = nlohmann::ordered_json;

class TokenMaskTest : public ::k3::grammar::testing::DemoVocab {
 protected:
  // Ids that Mask leaves possible from `logits` all zero.
  static std::vector<int32_t> Allowed(GrammarConstraint& c) {
    std::vector<float> logits(tok().vocab_size(), 0.0f);
    c.Mask(logits);
    std::vector<int32_t> out;
    for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
      if (!std::isinf(logits[id])) out.push_back(id);
    }
    return out;
  }

  // One walk: sample among the allowed tokens (half the time a special, if one is allowed, so
  // that bodies end; otherwise preferring tokens that close a JSON string or container), and
  // return the sampled ids; empty if it ran past `cap`. Every Mask must allow some token.
  static std::vector<int32_t> Walk(const OutputSpec& spec, std::mt19937& rng, int cap = 3000) {
    auto c = GrammarConstraint::ForOutput(spec, trie());
    EXPECT_TRUE(c.ok()) << c.status();
    std::vector<int32_t> ids;
    while (static_cast<int>(ids.size()) < cap) {
      const std::vector<int32_t> allowed = Allowed(**c);
      EXPECT_FALSE(allowed.empty());
      std::vector<int32_t> specials, closing;
      for (const int32_t id : allowed) {
        if (tok().IsSpecial(id)) specials.push_back(id);
        const std::string_view b = trie()->bytes(id);
        if (b.find_first_of("\"]}") != std::string_view::npos) closing.push_back(id);
      }
      const std::vector<int32_t>* pool = &allowed;
      const int coin = std::uniform_int_distribution<int>(0, 9)(rng);
      if (!specials.empty() && coin < 5) pool = &specials;
      if (specials.empty() && !closing.empty() && coin < 3) pool = &closing;
      const int32_t id = (*pool)[std::uniform_int_distribution<size_t>(0, pool->size() - 1)(rng)];
      ids.push_back(id);
      (*c)->Accept(id);
      EXPECT_FALSE((*c)->failed());
      if (id == Special(kEndOfMsg)) {
        EXPECT_TRUE((*c)->finished());
        return ids;
      }
    }
    return {};
  }

  static Turn WalkAndParse(const OutputSpec& spec, std::mt19937& rng, int* unfinished) {
    const std::vector<int32_t> ids = Walk(spec, rng);
    if (ids.empty()) {
      ++*unfinished;
      return {};
    }
    EXPECT_EQ(ids.back(), Special(kEndOfMsg));
    Turn turn = ParseTurn(IdSymbols(*trie(), ids), spec.thinking);
    EXPECT_TRUE(turn.ended);
    return turn;
  }

  static const ToolSpec* Find(const OutputSpec& spec, const std::string& name) {
    for (const ToolSpec& t : spec.tools) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
};

TEST_F(TokenMaskTest, ExampleEPassesTheMaskTokenByToken) {
  OutputSpec spec;
  spec.tools = {GetWeather()};
  auto c = GrammarConstraint::ForOutput(spec, trie());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<TokenId> ids = Ids(
      "Check.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools"
      "<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" "
      "type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" "
      "type=\"number\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>");
  for (const TokenId id : ids) {
    std::vector<float> logits(tok().vocab_size(), 1.0f);
    (*c)->Mask(logits);
    ASSERT_FALSE(std::isinf(logits[id])) << "token " << id << " " << trie()->bytes(id);
    (*c)->Accept(id);
  }
  EXPECT_TRUE((*c)->finished());
  // Done: only <|end_of_msg|> stays possible (the caller's stop id).
  const std::vector<int32_t> after = Allowed(**c);
  EXPECT_EQ(after, std::vector<int32_t>{Special(kEndOfMsg)});
}

TEST_F(TokenMaskTest, RandomToolCallsValidateAgainstTheirSchemas) {
  OutputSpec two;
  two.tools = {GetWeather(), GetTime()};
  two.tools.push_back({"plan", Json::parse(R"({"type":"object","properties":{
      "steps":{"type":"array","items":{"type":"object","properties":{"n":{"type":"integer"},
      "done":{"type":"boolean"}},"required":["n"]},"maxItems":3},
      "mode":{"enum":["fast","slow"]},"note":{"type":["string","null"]}},
      "required":["mode"]})"),
                       true});
  two.tool_choice = ToolChoice::kRequired;
  OutputSpec named = two;
  named.tool_choice = ToolChoice::kNamed;
  named.named_tool = "plan";
  named.thinking = false;
  std::mt19937 rng(7);
  int unfinished = 0, calls = 0;
  for (int walk = 0; walk < 40; ++walk) {
    const OutputSpec& spec = walk % 2 == 0 ? two : named;
    const Turn turn = WalkAndParse(spec, rng, &unfinished);
    if (!turn.ended) continue;
    ASSERT_FALSE(turn.calls.empty());
    if (&spec == &named) {
      EXPECT_EQ(turn.calls.size(), 1u);
    }
    for (const Turn::Call& call : turn.calls) {
      const ToolSpec* tool = Find(spec, call.tool);
      ASSERT_NE(tool, nullptr) << call.tool;
      if (&spec == &named) {
        EXPECT_EQ(call.tool, "plan");
      }
      EXPECT_TRUE(Valid(call.arguments, tool->parameters))
          << call.tool << " " << call.arguments.dump();
      ++calls;
    }
  }
  EXPECT_LE(unfinished, 4);
  EXPECT_GE(calls, 30);
}

TEST_F(TokenMaskTest, RandomJsonResponsesValidate) {
  OutputSpec schema;
  schema.response_format = ResponseFormat::kJsonSchema;
  schema.response_schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},
      "tags":{"type":"array","items":{"enum":["a","b",1]},"minItems":1,"maxItems":4},
      "address":{"type":"object","properties":{"zip":{"type":"string"},
                  "geo":{"type":"array","items":{"type":"number"},"maxItems":2}},
                 "required":["zip","geo"],"additionalProperties":false}},
      "required":["name","age","ok","tags","address"]})");
  OutputSpec object;
  object.response_format = ResponseFormat::kJsonObject;
  object.thinking = false;
  std::mt19937 rng(11);
  int unfinished = 0, valid = 0;
  for (int walk = 0; walk < 30; ++walk) {
    const OutputSpec& spec = walk % 2 == 0 ? schema : object;
    const Turn turn = WalkAndParse(spec, rng, &unfinished);
    if (!turn.ended) continue;
    EXPECT_TRUE(turn.calls.empty());
    const Json body = ParseJson(turn.response);
    ASSERT_FALSE(body.is_discarded()) << ::testing::PrintToString(turn.response);
    EXPECT_TRUE(body.is_object()) << turn.response;
    if (&spec == &schema) {
      EXPECT_TRUE(Valid(body, schema.response_schema)) << turn.response;
    }
    ++valid;
  }
  EXPECT_LE(unfinished, 3);
  EXPECT_GE(valid, 27);
}

TEST_F(TokenMaskTest, RandomPlainTurnsWithThinkingOnAndOff) {
  std::mt19937 rng(3);
  int unfinished = 0;
  for (const bool thinking : {true, false}) {
    OutputSpec spec;
    spec.thinking = thinking;
    spec.tools = {GetWeather()};
    spec.tool_choice = ToolChoice::kNone;
    for (int walk = 0; walk < 10; ++walk) {
      const Turn turn = WalkAndParse(spec, rng, &unfinished);
      EXPECT_TRUE(turn.calls.empty());
    }
  }
  EXPECT_EQ(unfinished, 0);
}

// Mask against a per-token simulation on a second matcher (no trie, no free-text shortcut), at
// every step of random walks through the demanding grammars.
TEST_F(TokenMaskTest, MaskEqualsBruteForce) {
  OutputSpec spec;
  spec.tools = {GetWeather(), GetTime(), {"loose", Json::object(), false}};
  spec.response_format = ResponseFormat::kJsonObject;
  auto grammar = std::make_shared<Grammar>(MustBuild(spec));
  std::mt19937 rng(5);
  int states = 0;
  for (int walk = 0; walk < 6; ++walk) {
    GrammarConstraint c(grammar, trie());
    // Half the walks forget every State but the current one after almost every token.
    if (walk % 2 == 1) c.set_max_states(2);
    Matcher m(grammar);
    Matcher::State s = m.start();
    for (int step = 0; step < 150 && !c.finished(); ++step) {
      const std::vector<int32_t> got = Allowed(c);
      std::vector<int32_t> want;
      for (int32_t id = 0; id < tok().vocab_size(); ++id) {
        const int16_t symbol = trie()->symbol(id);
        Matcher::State next = Matcher::kDead;
        if (symbol == TokenTrie::kOrdinary) next = m.NextBytes(s, trie()->bytes(id));
        if (symbol >= kEndOfMsg) next = m.Next(s, symbol);
        if (next != Matcher::kDead) want.push_back(id);
      }
      ASSERT_EQ(got, want) << "walk " << walk << " step " << step;
      ++states;
      // Specials often, so that the walk gets past the free bodies.
      std::vector<int32_t> specials;
      for (const int32_t id : got) {
        if (tok().IsSpecial(id)) specials.push_back(id);
      }
      const auto& pool = !specials.empty() && rng() % 3 == 0 ? specials : got;
      const int32_t id = pool[rng() % pool.size()];
      c.Accept(id);
      s = tok().IsSpecial(id) ? m.Next(s, trie()->symbol(id)) : m.NextBytes(s, trie()->bytes(id));
    }
  }
  EXPECT_GE(states, 200);
}

TEST_F(TokenMaskTest, AForbiddenTokenStopsConstrainingWithoutHarm) {
  OutputSpec spec;
  spec.tools = {GetWeather()};
  spec.tool_choice = ToolChoice::kRequired;
  auto c = GrammarConstraint::ForOutput(spec, trie());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->free_text());  // the think body
  for (const TokenId id :
       Ids("x<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>")) {
    (*c)->Accept(id);
  }
  ASSERT_FALSE((*c)->failed());
  // Required: only the tools block may open now.
  std::vector<float> logits(tok().vocab_size(), 0.0f);
  (*c)->Mask(logits);
  EXPECT_TRUE(std::isinf(logits[Special(kClose)]));
  EXPECT_FALSE(std::isinf(logits[Special(kOpen)]));
  (*c)->Accept(Special(kClose));  // forbidden
  EXPECT_TRUE((*c)->failed());
  std::fill(logits.begin(), logits.end(), 0.5f);
  (*c)->Mask(logits);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return x == 0.5f; }));
  (*c)->Accept(-1);  // out of range: still no crash
}

TEST_F(TokenMaskTest, TrieHoldsEveryOrdinaryTokenOnce) {
  std::vector<int> seen(tok().vocab_size(), 0);
  const auto& nodes = trie()->nodes();
  for (size_t i = 1; i < nodes.size(); ++i) {
    std::string path;
    for (int32_t n = static_cast<int32_t>(i); n > 0; n = nodes[n].parent) {
      path.insert(path.begin(), static_cast<char>(nodes[n].byte));
    }
    for (int32_t t = nodes[i].first_token; t < nodes[i].last_token; ++t) {
      const int32_t id = trie()->tokens()[t];
      ++seen[id];
      EXPECT_EQ(path, *tok().TokenBytes(id));
    }
    EXPECT_GT(nodes[i].end, static_cast<int32_t>(i));
  }
  int ordinary = 0;
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    const bool is_ordinary = trie()->symbol(id) == TokenTrie::kOrdinary;
    ordinary += is_ordinary;
    EXPECT_EQ(seen[id], is_ordinary ? 1 : 0) << id;
    EXPECT_EQ(is_ordinary, !tok().IsSpecial(id)) << id;
  }
  EXPECT_GT(ordinary, 3000);
  EXPECT_EQ(Symbols("<|open|>"), std::vector<int>{kOpen});
}

}  // namespace
}  // namespace k3::grammar
