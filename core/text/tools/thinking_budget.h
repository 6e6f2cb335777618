// A thinking budget: after N tokens of the think channel, the reply's next tokens are forced to
// close it and open the response (`<|close|>think<|sep|><|open|>response<|sep|>`), so that an
// answer still comes. At tens of seconds a token on a small machine, an unbounded think channel
// costs hours. The cut depends only on the tokens sampled, so it falls on the same ids at every
// memory budget and batch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/token_constraint.h"
#include "core/text/tokenizer/tokenizer.h"

namespace k3 {

class ThinkingBudget : public TokenConstraint {
 public:
  // `budget` think tokens at most (>= 0); `inner` (may be null) is the turn's grammar, applied
  // first: the forced ids are a valid continuation of any turn grammar in the think channel.
  // FailedPrecondition when the tokenizer lacks the XTML markers.
  static absl::StatusOr<std::unique_ptr<ThinkingBudget>> Create(
      const Tokenizer& tokenizer, int32_t budget, std::shared_ptr<TokenConstraint> inner);

  void Mask(std::span<float> logits) override;
  void Accept(int32_t id) override;

  int32_t think_tokens() const { return think_tokens_; }
  bool in_think() const { return in_think_; }

 private:
  ThinkingBudget(int32_t budget, std::vector<int32_t> closing, int32_t open, int32_t close,
                 std::shared_ptr<TokenConstraint> inner);

  int32_t budget_;
  std::vector<int32_t> closing_;  // <|close|>think<|sep|><|open|>response<|sep|>
  int32_t open_, close_;
  std::shared_ptr<TokenConstraint> inner_;
  bool in_think_ = true;  // the generation prompt opened think
  int32_t think_tokens_ = 0;
  size_t forced_ = 0;  // ids of `closing_` already emitted (0: not forcing)
};

}  // namespace k3
