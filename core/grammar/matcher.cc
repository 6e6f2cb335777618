#include "core/grammar/matcher.h"

#include <algorithm>

namespace k3::grammar {

namespace {

int32_t SaturatingAdd(int32_t a, int32_t b) { return std::min(a + b, Matcher::kUnreachable); }

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  ComputeSuffixCosts();
  Reset();
  std::vector<int32_t> tops;
  for (const uint32_t alt : grammar_->alternatives[grammar_->start]) {
    visited_.clear();
    Expand(alt, kEmpty, tops);
  }
  start_ = Intern(std::move(tops));
}

void Matcher::ComputeSuffixCosts() {
  const std::vector<Element>& elements = grammar_->elements;
  std::vector<int32_t> rule_cost(grammar_->alternatives.size(), kUnreachable);
  suffix_cost_.assign(elements.size(), kUnreachable);
  // Rules refer to one another, recursively too, so their costs (the least over their
  // alternatives) are lowered round by round until none changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t pos = elements.size(); pos-- > 0;) {
      const Element& e = elements[pos];
      int32_t cost = 0;
      if (e.kind == Element::kSet) {
        const SymbolSet& set = grammar_->sets[e.arg];
        cost = SaturatingAdd(set == SymbolSet() ? kUnreachable : 1, suffix_cost_[pos + 1]);
      } else if (e.kind == Element::kRef) {
        cost = SaturatingAdd(rule_cost[e.arg], suffix_cost_[pos + 1]);
      }
      suffix_cost_[pos] = cost;
    }
    for (size_t rule = 0; rule < rule_cost.size(); ++rule) {
      for (const uint32_t alt : grammar_->alternatives[rule]) {
        if (suffix_cost_[alt] < rule_cost[rule]) {
          rule_cost[rule] = suffix_cost_[alt];
          changed = true;
        }
      }
    }
  }
}

void Matcher::Reset() {
  frames_.assign(1, {0, kEmpty, 0, 0});
  frame_ids_.clear();
  states_.clear();
  state_ids_.clear();
  next_.clear();
  free_text_.clear();
  min_completion_.clear();
}

int32_t Matcher::FrameId(uint32_t pos, int32_t parent) {
  auto [it, added] = frame_ids_.try_emplace({pos, parent}, static_cast<int32_t>(frames_.size()));
  if (added) {
    const Frame& below = frames_[parent];
    frames_.push_back({pos, parent, below.depth + 1, SaturatingAdd(suffix_cost_[pos], below.cost)});
  }
  return it->second;
}

void Matcher::Expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out) {
  // A path that comes back to where it was consumed nothing on the way (x* of an x that may be
  // empty): following it again adds no stack, and would never end.
  const std::pair<uint32_t, int32_t> key{pos, parent};
  if (std::find(visited_.begin(), visited_.end(), key) != visited_.end()) return;
  visited_.push_back(key);
  const Element& e = grammar_->elements[pos];
  switch (e.kind) {
    case Element::kSet: {
      if (frames_[parent].depth + 1 > kMaxDepth) {
        overflowed_ = true;
        return;
      }
      out.push_back(FrameId(pos, parent));
      return;
    }
    case Element::kRef: {
      // A reference last in its alternative returns straight to `parent` (a tail call), which
      // keeps repetition (right recursion) from deepening the stack.
      const int32_t back =
          grammar_->elements[pos + 1].kind == Element::kEnd ? parent : FrameId(pos + 1, parent);
      for (const uint32_t alt : grammar_->alternatives[e.arg]) Expand(alt, back, out);
      return;
    }
    case Element::kEnd: {
      if (parent == kEmpty) {
        out.push_back(kEmpty);
        return;
      }
      const Frame f = frames_[parent];
      Expand(f.pos, f.parent, out);
      return;
    }
  }
}

Matcher::State Matcher::Intern(std::vector<int32_t> tops) {
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  if (tops.empty()) return kDead;
  if (tops.size() > static_cast<size_t>(kMaxStacks)) {
    overflowed_ = true;
    tops.resize(kMaxStacks);
  }
  auto [it, added] = state_ids_.try_emplace(tops, static_cast<State>(states_.size()));
  if (added) {
    states_.push_back(std::move(tops));
    next_.resize(next_.size() + kNumSymbols, kUnknown);
    free_text_.push_back(-1);
    int32_t least = kUnreachable;
    for (const int32_t top : states_.back()) least = std::min(least, frames_[top].cost);
    min_completion_.push_back(least);
  }
  return it->second;
}

Matcher::State Matcher::Compute(State state, int symbol) {
  std::vector<int32_t> tops;
  const std::vector<int32_t> from = states_[state];  // Intern may grow states_
  for (const int32_t top : from) {
    if (top == kEmpty) continue;
    const Frame f = frames_[top];
    if (!grammar_->sets[grammar_->elements[f.pos].arg].Has(symbol)) continue;
    visited_.clear();
    Expand(f.pos + 1, f.parent, tops);
  }
  const State next = Intern(std::move(tops));
  next_[static_cast<size_t>(state) * kNumSymbols + symbol] = next;
  return next;
}

Matcher::State Matcher::NextBytes(State state, std::string_view bytes) {
  for (const char c : bytes) {
    if (state == kDead) break;
    state = Next(state, static_cast<unsigned char>(c));
  }
  return state;
}

bool Matcher::Accepting(State state) const {
  return state != kDead && states_[state].front() == kEmpty;  // sorted: kEmpty (0) first
}

bool Matcher::FreeText(State state) {
  if (free_text_[state] < 0) {
    bool all = true;
    for (int b = 0; b < 256 && all; ++b) all = Next(state, b) == state;
    free_text_[state] = all ? 1 : 0;
  }
  return free_text_[state] == 1;
}

Matcher::State Matcher::Compact(State keep) {
  if (keep == kDead) {
    Reset();
    return kDead;
  }
  // Each stack as its positions, bottom first, then interned again from scratch.
  std::vector<std::vector<uint32_t>> stacks;
  for (int32_t top : states_[keep]) {
    std::vector<uint32_t>& positions = stacks.emplace_back();
    for (; top != kEmpty; top = frames_[top].parent) positions.push_back(frames_[top].pos);
    std::reverse(positions.begin(), positions.end());
  }
  const bool start_kept = start_ == keep;
  Reset();
  std::vector<int32_t> tops;
  for (const std::vector<uint32_t>& positions : stacks) {
    int32_t frame = kEmpty;
    for (const uint32_t pos : positions) frame = FrameId(pos, frame);
    tops.push_back(frame);
  }
  const State kept = Intern(std::move(tops));
  // The start State is gone unless it was the one kept; a matcher restarted after Compact must
  // be built anew.
  start_ = start_kept ? kept : kDead;
  return kept;
}

}  // namespace k3::grammar
