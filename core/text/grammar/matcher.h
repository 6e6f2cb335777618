// The pushdown matcher of a Grammar (grammar.h), llama.cpp's design: the matcher's state is a
// set of stacks, each the positions still to match, its top always a symbol set (or empty: the
// input may end there); a symbol advances every stack whose top holds it.
//
// Stacks are interned as linked frames, so that two equal stacks are one id, and every set of
// stacks reached is interned as a State; the transitions between States are cached. Matching is
// then a lazily built DFA: a State is an int, copying it is free, and advancing a known State by
// a known symbol is one array read. Stacks are bounded in depth and number (kMaxDepth,
// kMaxStacks) so that an ambiguous or deep grammar cannot explode.
//
//   Matcher m(std::make_shared<Grammar>(std::move(g)));
//   Matcher::State s = m.NextBytes(m.start(), "n=42");
//   if (s != Matcher::kDead && m.Accepting(s)) ...
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/text/grammar/grammar.h"

namespace k3::grammar {

class Matcher {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;
  static constexpr int kMaxDepth = 4096;   // frames in one stack
  static constexpr int kMaxStacks = 1024;  // stacks in one State

  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  State start() const { return start_; }
  // The State after `symbol` (a byte or a special, grammar.h), or kDead if none of the stacks
  // admits it.
  State Next(State state, int symbol) {
    const int32_t known = next_[static_cast<size_t>(state) * kNumSymbols + symbol];
    return known != kUnknown ? known : Compute(state, symbol);
  }
  State NextBytes(State state, std::string_view bytes);
  // The input may end here.
  bool Accepting(State state) const;
  // Every byte leads back to this State, so every ordinary token is allowed and keeps it.
  bool FreeText(State state);
  // The fewest symbols that take `state` to an accepting State (0 if it accepts), kUnreachable
  // if none do. Exact: a stack's shortest completion is the sum of its frames' shortest
  // remainders, which the grammar fixes; a breadth-first search over States would instead meet
  // every nesting of brackets within reach, exponentially many. Computed on first use, so that
  // a constraint without a token budget pays nothing for it.
  static constexpr int32_t kUnreachable = 1 << 29;
  int32_t MinCompletion(State state) {
    const int32_t known = min_completion_[state];
    return known >= 0 ? known : ComputeMinCompletion(state);
  }

  int num_states() const { return static_cast<int>(states_.size()); }
  // Forgets every State but `keep` and returns its new id: bounds the memory of a long run.
  State Compact(State keep);
  // Whether a stack was ever dropped for passing kMaxDepth or kMaxStacks.
  bool overflowed() const { return overflowed_; }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kEmpty = 0;  // the empty stack's frame id
  struct Frame {
    uint32_t pos;    // an element of grammar_->elements
    int32_t parent;  // the frame below, kEmpty at the bottom
    int32_t depth;
  };

  // Per element, the fewest symbols that match the rest of its alternative from it.
  void ComputeSuffixCosts();
  // The fewest symbols that match the rest of a frame and every one below it.
  int32_t FrameCost(int32_t frame);
  int32_t ComputeMinCompletion(State state);

  int32_t FrameId(uint32_t pos, int32_t parent);
  // Adds to `out` the tops of the stacks that matching `pos` over `parent` leads to: rules are
  // entered, finished alternatives popped, until each top is a symbol set or the stack is empty.
  void Expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out);
  State Intern(std::vector<int32_t> tops);
  State Compute(State state, int symbol);
  void Reset();

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Frame> frames_;
  absl::flat_hash_map<std::pair<uint32_t, int32_t>, int32_t> frame_ids_;
  std::vector<std::vector<int32_t>> states_;  // sorted stack tops
  absl::flat_hash_map<std::vector<int32_t>, State> state_ids_;
  std::vector<int32_t> next_;                          // per State, kNumSymbols transitions
  std::vector<int8_t> free_text_;                      // per State: -1 unknown
  std::vector<int32_t> min_completion_;                // per State: -1 unknown
  std::vector<int32_t> frame_cost_;                    // per frame: -1 unknown
  std::vector<int32_t> suffix_cost_;                   // per element, empty until needed
  std::vector<int32_t> chain_;                         // FrameCost's, kept for its memory
  std::vector<std::pair<uint32_t, int32_t>> visited_;  // Expand's guard against empty loops
  State start_ = kDead;
  bool overflowed_ = false;
};

}  // namespace k3::grammar
