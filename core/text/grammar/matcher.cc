#include "core/text/grammar/matcher.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

namespace k3::grammar {

namespace {

int32_t SaturatingAdd(int32_t a, int32_t b) { return std::min(a + b, Matcher::kUnreachable); }

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
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
  const size_t num_rules = grammar_->alternatives.size();
  // Knuth's generalization of Dijkstra's algorithm: an alternative's cost is known once all
  // the rules it refers to are, and the cheapest alternative not yet settled settles its rule
  // (rounds of relaxation over every element would take several times longer).
  struct Alt {
    uint32_t rule;
    int32_t cost = 0;     // its sets and the settled rules it refers to
    int32_t pending = 0;  // references to rules not settled yet
  };
  std::vector<Alt> alts;
  std::vector<std::vector<uint32_t>> referrers(num_rules);  // per rule, an alt per reference
  for (uint32_t rule = 0; rule < num_rules; ++rule) {
    for (const uint32_t start : grammar_->alternatives[rule]) {
      Alt alt{rule};
      for (uint32_t pos = start; elements[pos].kind != Element::kEnd; ++pos) {
        const Element& e = elements[pos];
        if (e.kind == Element::kRef) {
          ++alt.pending;
          referrers[e.arg].push_back(static_cast<uint32_t>(alts.size()));
        } else {
          alt.cost =
              SaturatingAdd(alt.cost, grammar_->sets[e.arg] == SymbolSet() ? kUnreachable : 1);
        }
      }
      alts.push_back(alt);
    }
  }
  std::vector<int32_t> rule_cost(num_rules, kUnreachable);
  std::vector<bool> settled(num_rules, false);
  using Entry = std::pair<int32_t, uint32_t>;  // cost, rule
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  for (const Alt& alt : alts) {
    if (alt.pending == 0) queue.push({alt.cost, alt.rule});
  }
  while (!queue.empty()) {
    const auto [cost, rule] = queue.top();
    queue.pop();
    if (settled[rule]) continue;
    settled[rule] = true;
    rule_cost[rule] = cost;
    for (const uint32_t a : referrers[rule]) {
      Alt& alt = alts[a];
      alt.cost = SaturatingAdd(alt.cost, cost);
      if (--alt.pending == 0 && !settled[alt.rule]) queue.push({alt.cost, alt.rule});
    }
  }
  suffix_cost_.assign(elements.size(), 0);
  for (size_t pos = elements.size(); pos-- > 0;) {
    const Element& e = elements[pos];
    if (e.kind == Element::kEnd) continue;
    const int32_t own = e.kind == Element::kRef                ? rule_cost[e.arg]
                        : grammar_->sets[e.arg] == SymbolSet() ? kUnreachable
                                                               : 1;
    suffix_cost_[pos] = SaturatingAdd(own, suffix_cost_[pos + 1]);
  }
}

void Matcher::Reset() {
  frames_.assign(1, {0, kEmpty, 0});
  frame_ids_.clear();
  states_.clear();
  state_ids_.clear();
  next_.clear();
  free_text_.clear();
  min_completion_.clear();
  frame_cost_.assign(1, 0);  // the empty stack: nothing left to match
}

int32_t Matcher::FrameId(uint32_t pos, int32_t parent) {
  auto [it, added] = frame_ids_.try_emplace({pos, parent}, static_cast<int32_t>(frames_.size()));
  if (added) frames_.push_back({pos, parent, frames_[parent].depth + 1});
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
    min_completion_.push_back(-1);
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

int32_t Matcher::FrameCost(int32_t frame) {
  if (suffix_cost_.empty()) ComputeSuffixCosts();
  if (frame_cost_.size() < frames_.size()) frame_cost_.resize(frames_.size(), -1);
  // The frames down to one whose cost is known (the empty stack's is), then theirs upwards.
  std::vector<int32_t>& chain = chain_;
  chain.clear();
  for (int32_t f = frame; frame_cost_[f] < 0; f = frames_[f].parent) chain.push_back(f);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Frame& f = frames_[*it];
    frame_cost_[*it] = SaturatingAdd(suffix_cost_[f.pos], frame_cost_[f.parent]);
  }
  return frame_cost_[frame];
}

int32_t Matcher::ComputeMinCompletion(State state) {
  int32_t least = kUnreachable;
  for (const int32_t top : states_[state]) least = std::min(least, FrameCost(top));
  min_completion_[state] = least;
  return least;
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
