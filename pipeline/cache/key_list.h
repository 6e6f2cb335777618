// An ordered set of expert keys with O(1) insert, erase, move-to-back and membership: the
// building block of the list-based policies (LRU, FIFO, ARC, 2Q, S3-FIFO, LIRS, W-TinyLFU).
// Front is the oldest end.
#pragma once

#include <cstddef>
#include <list>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/expert_key.h"
#include "pipeline/cache/policy.h"

namespace k3::cache_internal {

template <typename Value = char>
class KeyList {
 public:
  struct Entry {
    ExpertKey key;
    Value value;
  };
  using Iterator = typename std::list<Entry>::iterator;

  bool Contains(const ExpertKey& key) const { return index_.contains(key); }
  size_t size() const { return list_.size(); }
  bool empty() const { return list_.empty(); }

  void PushBack(const ExpertKey& key, Value value = Value()) {
    list_.push_back({key, value});
    index_[key] = std::prev(list_.end());
  }
  // Returns whether the key was present.
  bool Erase(const ExpertKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    list_.erase(it->second);
    index_.erase(it);
    return true;
  }
  void MoveToBack(const ExpertKey& key) {
    auto it = index_.find(key);
    if (it != index_.end()) list_.splice(list_.end(), list_, it->second);
  }
  const ExpertKey& Front() const { return list_.front().key; }
  Entry PopFront() {
    Entry e = list_.front();
    index_.erase(e.key);
    list_.pop_front();
    return e;
  }
  Value* Find(const ExpertKey& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->value;
  }

  // The first key from the front (oldest) that `evictable` accepts.
  std::optional<ExpertKey> FirstFromFront(EvictablePredicate evictable) const {
    for (const Entry& e : list_) {
      if (evictable(e.key)) return e.key;
    }
    return std::nullopt;
  }
  // The first key from the back (newest) that `evictable` accepts.
  std::optional<ExpertKey> FirstFromBack(EvictablePredicate evictable) const {
    for (auto it = list_.rbegin(); it != list_.rend(); ++it) {
      if (evictable(it->key)) return it->key;
    }
    return std::nullopt;
  }

  typename std::list<Entry>::const_iterator begin() const { return list_.begin(); }
  typename std::list<Entry>::const_iterator end() const { return list_.end(); }

 private:
  std::list<Entry> list_;
  absl::flat_hash_map<ExpertKey, Iterator> index_;
};

}  // namespace k3::cache_internal
