#include "core/text/tools/thinking_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<ThinkingBudget>> ThinkingBudget::Create(
    const Tokenizer& tokenizer, int32_t budget, std::shared_ptr<TokenConstraint> inner) {
  std::vector<int32_t> closing;
  int32_t open = -1, close = -1;
  for (const char* name : {"<|open|>", "<|close|>", "<|sep|>"}) {
    if (!tokenizer.SpecialTokenId(name).has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a thinking budget needs the special token ", name));
    }
  }
  open = *tokenizer.SpecialTokenId("<|open|>");
  close = *tokenizer.SpecialTokenId("<|close|>");
  const int32_t sep = *tokenizer.SpecialTokenId("<|sep|>");
  auto add = [&](int32_t marker, const char* tag) {
    closing.push_back(marker);
    for (int32_t id : tokenizer.Encode(tag, /*allow_special=*/false)) closing.push_back(id);
    closing.push_back(sep);
  };
  add(close, "think");
  add(open, "response");
  return std::unique_ptr<ThinkingBudget>(
      new ThinkingBudget(std::max(budget, 0), std::move(closing), open, close, std::move(inner)));
}

ThinkingBudget::ThinkingBudget(int32_t budget, std::vector<int32_t> closing, int32_t open,
                               int32_t close, std::shared_ptr<TokenConstraint> inner)
    : budget_(budget),
      closing_(std::move(closing)),
      open_(open),
      close_(close),
      inner_(std::move(inner)) {}

void ThinkingBudget::Mask(std::span<float> logits) {
  if (inner_ != nullptr) inner_->Mask(logits);
  const bool forcing = forced_ > 0 || (in_think_ && think_tokens_ >= budget_);
  if (!forcing || forced_ >= closing_.size()) return;
  const int32_t next = closing_[forced_];
  if (next < 0 || next >= static_cast<int32_t>(logits.size())) return;
  // The one id left keeps its logit: a sampler over it picks it whatever the temperature.
  const float kept = logits[next];
  std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
  logits[next] = std::isfinite(kept) ? kept : 0.0f;
}

void ThinkingBudget::Accept(int32_t id) {
  if (inner_ != nullptr) inner_->Accept(id);
  if (forced_ > 0 || (in_think_ && think_tokens_ >= budget_)) {
    ++forced_;
    in_think_ = false;
    return;
  }
  if (!in_think_) return;
  // Any marker ends the think body (its close, or a recovery the parser accepts).
  if (id == close_ || id == open_) {
    in_think_ = false;
    return;
  }
  ++think_tokens_;
}

}  // namespace k3
