// The constraints of one chat reply, shared by `k3 serve` and `k3 chat`: the turn's grammar
// (core/text/grammar) when tools or a JSON format are asked for, with a token budget so that a forced
// call or document ends whole, and the thinking budget (thinking_budget.h) on top.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/model/token_constraint.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"

namespace k3 {

namespace grammar {
class TokenTrie;
}  // namespace grammar

// Null when nothing constrains the reply. `trie` is needed when output.constrained();
// `token_room` is the most tokens the reply may take (max_tokens, and the context's room);
// `reasoning_budget` < 0 means no limit.
absl::StatusOr<std::shared_ptr<TokenConstraint>> MakeReplyConstraint(
    const Tokenizer& tokenizer, const OutputSpec& output,
    std::shared_ptr<const grammar::TokenTrie> trie, int64_t token_room, int32_t reasoning_budget);

}  // namespace k3
