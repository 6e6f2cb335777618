// The identity of a routed expert in the cache: (MoE layer, expert index), as the router and
// the recorded traces name them.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace k3 {

struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;

  friend bool operator==(const ExpertKey& a, const ExpertKey& b) = default;
  friend auto operator<=>(const ExpertKey& a, const ExpertKey& b) = default;

  template <typename H>
  friend H AbslHashValue(H h, const ExpertKey& k) {
    return H::combine(std::move(h), k.layer, k.expert);
  }

  std::string ToString() const { return absl::StrCat("layer ", layer, " expert ", expert); }
};

// Whether a computation waits for the expert now or a predictor guessed it will be needed.
// Layer-aware policies track the position of the forward pass from demand requests only, so
// prefetches for layer l+d do not make layers l..l+d-1 look already passed.
enum class RequestKind : uint8_t { kDemand, kPrefetch };

}  // namespace k3
