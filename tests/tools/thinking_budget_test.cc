// The thinking budget: the think channel holds at most N tokens, then the reply closes it and
// opens the response, under a grammar too, and the parse of the reply shows the answer after it.
#include "core/text/tools/thinking_budget.h"

#include <random>

#include "core/text/grammar/token_mask.h"
#include "tests/tools/turn_fixture.h"

namespace k3 {
namespace {

class ThinkingBudgetTest : public testing::TurnFixture {
 protected:
  // Samples `n` ids under `c` from random logits that favour ordinary tokens (a model that would
  // think forever), greedily.
  static std::vector<int32_t> Run(TokenConstraint& c, int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<int32_t> ids;
    std::vector<float> logits(tok_->vocab_size());
    for (int i = 0; i < n; ++i) {
      for (size_t t = 0; t < logits.size(); ++t) {
        logits[t] = u(rng) + (static_cast<int>(t) < tok_->num_base_tokens() ? 8.0f : 0.0f);
      }
      c.Mask(logits);
      const int32_t id =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      c.Accept(id);
      ids.push_back(id);
      if (id == Special("<|end_of_msg|>")) break;  // the turn is over
    }
    return ids;
  }
  static std::vector<int32_t> Closing() {
    return Ids("<|close|>think<|sep|><|open|>response<|sep|>", Split::kBpe);
  }
};

TEST_F(ThinkingBudgetTest, AfterNThinkTokensTheResponseOpens) {
  for (int32_t budget : {0, 1, 5, 17}) {
    auto c = ThinkingBudget::Create(*tok_, budget, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    const std::vector<int32_t> closing = Closing();
    const std::vector<int32_t> ids = Run(**c, budget + static_cast<int>(closing.size()) + 10, 7);
    // The first `budget` ids are the model's, then the closing, then the model's again.
    EXPECT_TRUE(std::equal(closing.begin(), closing.end(), ids.begin() + budget)) << budget;
    for (int i = 0; i < budget; ++i) EXPECT_LT(ids[i], tok_->num_base_tokens());
    EXPECT_EQ((*c)->think_tokens(), budget);
    EXPECT_FALSE((*c)->in_think());
    TurnParser parser(*tok_, OutputSpec{});
    for (int32_t id : ids) parser.Feed(id);
    parser.Finish();
    EXPECT_FALSE(parser.result().content.value_or("").empty()) << budget;
  }
}

TEST_F(ThinkingBudgetTest, AThinkChannelThatClosesInTimeIsLeftAlone) {
  auto c = ThinkingBudget::Create(*tok_, 50, nullptr);
  ASSERT_TRUE(c.ok());
  const std::vector<int32_t> own =
      Ids("ok<|close|>think<|sep|><|open|>response<|sep|>hi", Split::kBytes);
  std::vector<float> logits(tok_->vocab_size(), 0.0f);
  for (int32_t id : own) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    (*c)->Mask(logits);
    EXPECT_EQ(logits[id], 0.0f);  // nothing forced
    (*c)->Accept(id);
  }
  EXPECT_EQ((*c)->think_tokens(), 2);
  EXPECT_FALSE((*c)->in_think());
}

TEST_F(ThinkingBudgetTest, UnderATurnGrammarTheForcedIdsAreAllowedAndTheTurnGoesOn) {
  auto trie = grammar::TokenTrie::Build(*tok_);
  ASSERT_TRUE(trie.ok());
  OutputSpec spec;
  spec.tools = {
      {"get_weather",
       nlohmann::ordered_json::parse(
           R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")}};
  spec.tool_choice = ToolChoice::kRequired;
  auto grammar = grammar::GrammarConstraint::ForOutput(spec, *trie);
  ASSERT_TRUE(grammar.ok());
  (*grammar)->set_token_budget(400);
  std::shared_ptr<grammar::GrammarConstraint> inner(std::move(*grammar));
  auto c = ThinkingBudget::Create(*tok_, 4, inner);
  ASSERT_TRUE(c.ok());
  const std::vector<int32_t> ids = Run(**c, 400, 3);
  EXPECT_FALSE(inner->failed());
  const std::vector<int32_t> closing = Closing();
  EXPECT_TRUE(std::equal(closing.begin(), closing.end(), ids.begin() + 4));
  TurnParser parser(*tok_, spec);
  for (int32_t id : ids) parser.Feed(id);
  parser.Finish();
  EXPECT_EQ(parser.result().tool_calls.size(), 1u);
}

}  // namespace
}  // namespace k3
