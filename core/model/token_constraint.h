// A rule on which token may come next, applied to the logits before sampling (a grammar that
// keeps the output a valid prefix of a tool call or a JSON schema, core/text/grammar/).
#pragma once

#include <cstdint>
#include <span>

namespace k3 {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of the tokens that may not come next to -infinity. If none may, leaves
  // only the ids that end the turn (the caller's stop ids) possible.
  virtual void Mask(std::span<float> logits) = 0;
  // The token that was sampled (always one Mask allowed).
  virtual void Accept(int32_t id) = 0;
};

}  // namespace k3
