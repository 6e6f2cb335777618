#include "core/text/tools/reply_constraint.h"

#include <algorithm>

#include "core/text/grammar/token_mask.h"
#include "core/text/tools/thinking_budget.h"

namespace k3 {

absl::StatusOr<std::shared_ptr<TokenConstraint>> MakeReplyConstraint(
    const Tokenizer& tokenizer, const OutputSpec& output,
    std::shared_ptr<const grammar::TokenTrie> trie, int64_t token_room, int32_t reasoning_budget) {
  std::shared_ptr<TokenConstraint> constraint;
  if (output.constrained()) {
    if (trie == nullptr) {
      return absl::FailedPreconditionError("no vocabulary trie to constrain the output with");
    }
    auto grammar = grammar::GrammarConstraint::ForOutput(output, std::move(trie));
    if (!grammar.ok()) return grammar.status();
    // A forced call or JSON document ends whole within the tokens the reply may take.
    if (output.forced()) {
      (*grammar)->set_token_budget(static_cast<int>(std::clamp<int64_t>(token_room, 0, INT32_MAX)));
    }
    constraint = std::shared_ptr<grammar::GrammarConstraint>(*std::move(grammar));
  }
  if (output.thinking && reasoning_budget >= 0) {
    auto thinking = ThinkingBudget::Create(tokenizer, reasoning_budget, std::move(constraint));
    if (!thinking.ok()) return thinking.status();
    constraint = std::shared_ptr<ThinkingBudget>(*std::move(thinking));
  }
  return constraint;
}

}  // namespace k3
