#include "apps/server/saved_states.h"

#include <algorithm>

namespace k3::server {

std::optional<SequenceState> SavedStates::Longest(std::span<const int32_t> ids) {
  auto best = states_.end();
  for (auto it = states_.begin(); it != states_.end(); ++it) {
    const auto& tokens = it->tokens();
    if (tokens.empty() || tokens.size() >= ids.size()) continue;
    if (best != states_.end() && best->tokens().size() >= tokens.size()) continue;
    if (std::equal(tokens.begin(), tokens.end(), ids.begin())) best = it;
  }
  if (best == states_.end()) return std::nullopt;
  states_.splice(states_.begin(), states_, best);
  return states_.front();
}

void SavedStates::Save(SequenceState state) {
  if (capacity_ == 0 || state.tokens().empty()) return;
  states_.remove_if([&](const SequenceState& s) { return s.tokens() == state.tokens(); });
  states_.push_front(std::move(state));
  while (states_.size() > capacity_) states_.pop_back();
}

}  // namespace k3::server
