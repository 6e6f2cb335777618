// Where a forward pass is, and resident keys grouped by layer: shared by the layer-aware
// policies (policy_layer.cc, policy_layer_reuse.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/expert_key.h"
#include "pipeline/cache/policy.h"

namespace k3::cache_internal {

// Where the forward pass is: the layer of the latest demand request, and visits per layer (a
// visit starts when a demand request names a layer other than the previous demand request's).
class PassPosition {
 public:
  explicit PassPosition(int32_t num_layers) : num_layers_(num_layers) {}

  // Returns true when the request starts a new visit of its layer.
  bool Observe(const ExpertKey& key, RequestKind kind) {
    min_layer_ = std::min(min_layer_, key.layer);
    max_layer_ = std::max(max_layer_, key.layer);
    if (kind != RequestKind::kDemand) return false;
    const bool new_visit = !started_ || key.layer != current_;
    started_ = true;
    current_ = key.layer;
    if (new_visit) ++visits_[key.layer];
    return new_visit;
  }
  int32_t current() const { return current_; }
  // Layers in one pass: the configured count, or the range of layer ids seen so far.
  int32_t span() const { return std::max(num_layers_, max_layer_ - min_layer_ + 1); }
  // Layers the pass must advance before it reaches `layer` again: 0 for the current layer,
  // span() - 1 for the layer just passed.
  int32_t Ahead(int32_t layer) const {
    const int32_t s = span();
    return ((layer - current_) % s + s) % s;
  }
  int64_t visits(int32_t layer) const {
    auto it = visits_.find(layer);
    return it == visits_.end() ? 0 : it->second;
  }

 private:
  int32_t num_layers_;
  bool started_ = false;
  int32_t current_ = 0;
  int32_t min_layer_ = std::numeric_limits<int32_t>::max();
  int32_t max_layer_ = std::numeric_limits<int32_t>::min();
  absl::flat_hash_map<int32_t, int64_t> visits_;
};

// Resident keys grouped by layer, with the last request tick of each.
class LayerResidents {
 public:
  using Layer = absl::flat_hash_map<ExpertKey, int64_t>;  // key -> last request tick

  void Touch(const ExpertKey& key, int64_t tick) {
    auto it = layers_.find(key.layer);
    if (it == layers_.end()) return;
    auto k = it->second.find(key);
    if (k != it->second.end()) k->second = tick;
  }
  void Insert(const ExpertKey& key, int64_t tick) { layers_[key.layer][key] = tick; }
  void Erase(const ExpertKey& key) {
    auto it = layers_.find(key.layer);
    if (it == layers_.end()) return;
    it->second.erase(key);
    if (it->second.empty()) layers_.erase(it);
  }
  // Layer ids holding residents, farthest ahead of the pass first (the current layer last).
  std::vector<int32_t> ByDistance(const PassPosition& pos) const {
    std::vector<int32_t> ids;
    ids.reserve(layers_.size());
    for (const auto& [id, keys] : layers_) ids.push_back(id);
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return pos.Ahead(a) > pos.Ahead(b); });
    return ids;
  }
  const Layer& layer(int32_t id) const { return layers_.at(id); }
  // The least recently requested key `evictable` accepts, over all layers.
  std::optional<ExpertKey> LeastRecent(EvictablePredicate evictable) const {
    std::optional<ExpertKey> best;
    int64_t best_tick = 0;
    for (const auto& [id, keys] : layers_) {
      for (const auto& [key, tick] : keys) {
        if ((!best || tick < best_tick) && evictable(key)) {
          best = key;
          best_tick = tick;
        }
      }
    }
    return best;
  }
  const absl::flat_hash_map<int32_t, Layer>& all() const { return layers_; }

 private:
  absl::flat_hash_map<int32_t, Layer> layers_;
};

}  // namespace k3::cache_internal
