// LIRS (Jiang and Zhang, 2002): ranks keys by inter-reference recency (IRR), the number of
// distinct keys requested between a key's last two requests, instead of by plain recency. Keys
// with a low IRR (LIR) hold 99 % of the slots; the others (HIR) share the remaining 1 % in a
// FIFO queue Q and are the eviction candidates. The recency stack S also keeps non-resident HIR
// keys (ghosts, up to twice the capacity) so that a key coming back soon is promoted to LIR.
#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "pipeline/cache/key_list.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

class LirsPolicy final : public ReplacementPolicy {
 public:
  explicit LirsPolicy(const PolicyOptions& options)
      : lir_cap_(
            std::max<int64_t>(1, options.capacity - std::max<int64_t>(1, options.capacity / 100))),
        stack_cap_(3 * options.capacity) {}

  std::string_view name() const override { return "lirs"; }
  void OnHit(const ExpertKey& key) override {
    if (lir_.contains(key)) {
      stack_.MoveToBack(key);
      Prune();
    } else if (stack_.Contains(key)) {
      // A resident HIR key with a small IRR: it becomes LIR, the bottom LIR key becomes HIR.
      queue_.Erase(key);
      Promote(key);
    } else {
      stack_.PushBack(key);
      queue_.MoveToBack(key);
    }
  }
  void OnInsert(const ExpertKey& key) override {
    resident_.insert(key);
    if (static_cast<int64_t>(lir_.size()) < lir_cap_) {  // warming up: everything is LIR
      stack_.Erase(key);
      stack_.PushBack(key);
      lir_.insert(key);
      return;
    }
    if (stack_.Contains(key)) {  // a ghost still in S: its IRR is below the LIR set's
      Promote(key);
    } else {
      stack_.PushBack(key);
      queue_.PushBack(key);
    }
    BoundStack();
  }
  void OnRemove(const ExpertKey& key, RemovalCause cause) override {
    resident_.erase(key);
    if (lir_.erase(key) > 0 || cause == RemovalCause::kAbandoned) {
      stack_.Erase(key);  // an LIR key evicted under pinning pressure, or a failed fill
      Prune();
    }
    queue_.Erase(key);
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    std::optional<ExpertKey> victim = queue_.FirstFromFront(evictable);
    if (victim) return victim;
    // No resident HIR key may go (all pinned or none): take the LIR key deepest in S.
    for (const auto& entry : stack_) {
      if (lir_.contains(entry.key) && evictable(entry.key)) return entry.key;
    }
    return std::nullopt;
  }

 private:
  void Promote(const ExpertKey& key) {
    stack_.MoveToBack(key);
    lir_.insert(key);
    if (static_cast<int64_t>(lir_.size()) > lir_cap_) {
      const ExpertKey bottom = stack_.PopFront().key;  // Prune keeps an LIR key at the bottom
      lir_.erase(bottom);
      queue_.PushBack(bottom);
    }
    Prune();
  }
  // The bottom of S is always an LIR key: HIR entries below the deepest LIR key can never be
  // promoted by their current IRR, so they go (resident ones stay in Q).
  void Prune() {
    while (!stack_.empty() && !lir_.contains(stack_.Front())) stack_.PopFront();
  }
  // Ghost entries are bounded: drop the oldest non-resident HIR keys beyond 3x the capacity.
  void BoundStack() {
    if (static_cast<int64_t>(stack_.size()) <= stack_cap_) return;
    std::vector<ExpertKey> drop;
    int64_t excess = static_cast<int64_t>(stack_.size()) - stack_cap_;
    for (const auto& entry : stack_) {
      if (excess <= 0) break;
      if (!resident_.contains(entry.key)) {
        drop.push_back(entry.key);
        --excess;
      }
    }
    for (const ExpertKey& k : drop) stack_.Erase(k);
    Prune();
  }

  int64_t lir_cap_;
  int64_t stack_cap_;
  KeyList<> stack_;  // S, front: bottom (least recent)
  KeyList<> queue_;  // Q: resident HIR keys, front: next victim
  absl::flat_hash_set<ExpertKey> lir_;
  absl::flat_hash_set<ExpertKey> resident_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLirs(const PolicyOptions& options) {
  return std::make_unique<LirsPolicy>(options);
}

}  // namespace k3::cache_internal
