// Frequency-based policies: LFU with ageing, and W-TinyLFU (Einziger et al., 2017): a small LRU
// window in front of a segmented-LRU main area that admits a key only when it has been requested
// more often than the main area's victim.
#include <cstdint>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/key_list.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

// Evicts the resident key with the fewest (aged) requests, the least recently used among equals.
// Counts survive eviction ("perfect" LFU), so a key that comes back keeps its history.
class LfuPolicy final : public ReplacementPolicy {
 public:
  explicit LfuPolicy(const PolicyOptions& options) : freq_(AgeingPeriod(options)) {}

  std::string_view name() const override { return "lfu"; }
  void OnRequest(const ExpertKey& key, RequestKind) override {
    ++tick_;
    if (freq_.Add(key)) Reorder();
  }
  void OnHit(const ExpertKey& key) override { Place(key); }
  void OnInsert(const ExpertKey& key) override { Place(key); }
  void OnRemove(const ExpertKey& key, RemovalCause) override {
    auto it = resident_.find(key);
    if (it == resident_.end()) return;
    order_.erase(it->second);
    resident_.erase(it);
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    for (const Rank& r : order_) {
      if (evictable(std::get<2>(r))) return std::get<2>(r);
    }
    return std::nullopt;
  }

 private:
  using Rank = std::tuple<uint32_t, int64_t, ExpertKey>;  // (count, last request, key)

  void Place(const ExpertKey& key) {
    auto [it, inserted] = resident_.try_emplace(key);
    if (!inserted) order_.erase(it->second);
    it->second = {freq_.Get(key), tick_, key};
    order_.insert(it->second);
  }
  // Ageing changed every count: rebuild the order from the halved counts.
  void Reorder() {
    order_.clear();
    for (auto& [key, rank] : resident_) {
      std::get<0>(rank) = freq_.Get(key);
      order_.insert(rank);
    }
  }

  FrequencyTable freq_;
  int64_t tick_ = 0;
  absl::flat_hash_map<ExpertKey, Rank> resident_;
  std::set<Rank> order_;  // first: the victim
};

// Window 1 % of the slots (LRU); main 99 %, split into probation (20 %) and protected (80 %)
// segments. These are the paper's defaults, not tuned to any trace.
class WTinyLfuPolicy final : public ReplacementPolicy {
 public:
  explicit WTinyLfuPolicy(const PolicyOptions& options)
      : freq_(AgeingPeriod(options)),
        window_cap_(std::max<int64_t>(1, options.capacity / 100)),
        protected_cap_(std::max<int64_t>(1, (options.capacity - window_cap_) * 8 / 10)) {}

  std::string_view name() const override { return "wtinylfu"; }
  void OnRequest(const ExpertKey& key, RequestKind) override { freq_.Add(key); }
  void OnHit(const ExpertKey& key) override {
    if (window_.Contains(key)) {
      window_.MoveToBack(key);
    } else if (protected_.Contains(key)) {
      protected_.MoveToBack(key);
    } else if (probation_.Erase(key)) {
      protected_.PushBack(key);
      // The protected segment overflowed: its LRU key goes back on probation.
      if (static_cast<int64_t>(protected_.size()) > protected_cap_) {
        probation_.PushBack(protected_.PopFront().key);
      }
    }
  }
  // While the cache fills up, keys leaving the window enter main unopposed.
  void OnInsert(const ExpertKey& key) override {
    window_.PushBack(key);
    if (static_cast<int64_t>(window_.size()) > window_cap_) {
      probation_.PushBack(window_.PopFront().key);
    }
  }
  void OnRemove(const ExpertKey& key, RemovalCause) override {
    if (!window_.Erase(key) && !probation_.Erase(key)) protected_.Erase(key);
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    std::optional<ExpertKey> main_victim = probation_.FirstFromFront(evictable);
    if (!main_victim) main_victim = protected_.FirstFromFront(evictable);
    if (static_cast<int64_t>(window_.size()) < window_cap_ && main_victim) return main_victim;
    // The newcomer will push the window's LRU key out: it competes with main's victim.
    std::optional<ExpertKey> candidate = window_.FirstFromFront(evictable);
    if (!candidate || !main_victim) return candidate ? candidate : main_victim;
    if (freq_.Get(*candidate) <= freq_.Get(*main_victim)) return candidate;
    window_.Erase(*candidate);
    probation_.PushBack(*candidate);
    return main_victim;
  }

 private:
  FrequencyTable freq_;
  int64_t window_cap_;
  int64_t protected_cap_;
  KeyList<> window_;
  KeyList<> probation_;
  KeyList<> protected_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLfu(const PolicyOptions& options) {
  return std::make_unique<LfuPolicy>(options);
}
std::unique_ptr<ReplacementPolicy> MakeWTinyLfu(const PolicyOptions& options) {
  return std::make_unique<WTinyLfuPolicy>(options);
}

}  // namespace k3::cache_internal
