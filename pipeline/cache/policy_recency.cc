// LRU, FIFO and MRU: one recency list, differing in whether a hit refreshes a key and which end
// is evicted. LRU is the baseline every other policy is measured against; MRU is the textbook
// answer to a cyclic scan larger than the cache, kept to show why pure MRU is not enough here.
#include "pipeline/cache/key_list.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

enum class Recency { kLru, kFifo, kMru };

class RecencyPolicy final : public ReplacementPolicy {
 public:
  explicit RecencyPolicy(Recency mode) : mode_(mode) {}

  std::string_view name() const override {
    switch (mode_) {
      case Recency::kLru:
        return "lru";
      case Recency::kFifo:
        return "fifo";
      case Recency::kMru:
        return "mru";
    }
    return "";
  }
  void OnHit(const ExpertKey& key) override {
    if (mode_ != Recency::kFifo) list_.MoveToBack(key);
  }
  void OnInsert(const ExpertKey& key) override { list_.PushBack(key); }
  void OnRemove(const ExpertKey& key, RemovalCause) override { list_.Erase(key); }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    return mode_ == Recency::kMru ? list_.FirstFromBack(evictable)
                                  : list_.FirstFromFront(evictable);
  }

 private:
  Recency mode_;
  KeyList<> list_;  // front: least recently used (or inserted, for FIFO)
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLru(const PolicyOptions&) {
  return std::make_unique<RecencyPolicy>(Recency::kLru);
}
std::unique_ptr<ReplacementPolicy> MakeFifo(const PolicyOptions&) {
  return std::make_unique<RecencyPolicy>(Recency::kFifo);
}
std::unique_ptr<ReplacementPolicy> MakeMru(const PolicyOptions&) {
  return std::make_unique<RecencyPolicy>(Recency::kMru);
}

}  // namespace k3::cache_internal
