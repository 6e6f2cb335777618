// Belady's MIN: evict the resident key whose next request is farthest in the future (or never
// comes). Optimal for hit rate when every miss must be cached; needs the whole future request
// sequence, so it exists for the simulator, as the ceiling the online policies are judged by.
#include <cstdint>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

class BeladyPolicy final : public ReplacementPolicy {
 public:
  explicit BeladyPolicy(std::span<const ExpertKey> future) : future_(future) {
    next_use_.resize(future.size());
    absl::flat_hash_map<ExpertKey, int64_t> later;
    for (int64_t i = static_cast<int64_t>(future.size()) - 1; i >= 0; --i) {
      auto it = later.find(future[i]);
      next_use_[i] = it == later.end() ? kNever : it->second;
      later[future[i]] = i;
    }
  }

  std::string_view name() const override { return "belady"; }

  // The request at position_ must be future_[position_]; if the caller strays from the sequence
  // it promised, the key is treated as never requested again (still correct, no longer optimal).
  void OnRequest(const ExpertKey& key, RequestKind) override {
    const size_t i = position_++;
    current_next_ = (i < future_.size() && future_[i] == key) ? next_use_[i] : kNever;
  }
  void OnHit(const ExpertKey& key) override {
    auto it = resident_.find(key);
    if (it == resident_.end()) return;
    order_.erase({it->second, key});
    it->second = current_next_;
    order_.insert({current_next_, key});
  }
  void OnInsert(const ExpertKey& key) override {
    resident_[key] = current_next_;
    order_.insert({current_next_, key});
  }
  void OnRemove(const ExpertKey& key, RemovalCause) override {
    auto it = resident_.find(key);
    if (it == resident_.end()) return;
    order_.erase({it->second, key});
    resident_.erase(it);
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (evictable(it->second)) return it->second;
    }
    return std::nullopt;
  }

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  std::span<const ExpertKey> future_;
  std::vector<int64_t> next_use_;  // position of the next request for the same key
  size_t position_ = 0;
  int64_t current_next_ = kNever;
  absl::flat_hash_map<ExpertKey, int64_t> resident_;  // key -> its next use
  std::set<std::pair<int64_t, ExpertKey>> order_;     // by next use; last = farthest
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeBelady(const PolicyOptions& options) {
  return std::make_unique<BeladyPolicy>(options.future);
}

}  // namespace k3::cache_internal
