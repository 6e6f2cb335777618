// Prefix reuse for the server: the sequence states of earlier requests, kept so that a request
// whose tokens extend one of them (the next turn of a chat) runs only the tokens after it.
// A state cannot be cut back, so only a saved state whose every token the new request repeats
// is of use; the longest such one wins. Bounded in number (each holds a sequence's worth of
// planned memory), least recently used out.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>

#include "core/model/sequence_state.h"

namespace k3::server {

class SavedStates {
 public:
  explicit SavedStates(size_t capacity) : capacity_(capacity) {}

  // A copy of the saved state with the most tokens that are all a proper prefix of `ids` (at
  // least one token of `ids` is left to run), which becomes the most recently used.
  std::optional<SequenceState> Longest(std::span<const int32_t> ids);
  // Keeps `state` (replacing one with the same tokens), dropping the least recently used.
  void Save(SequenceState state);

  size_t size() const { return states_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<SequenceState> states_;  // most recently used first
};

}  // namespace k3::server
