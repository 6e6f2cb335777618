// Layer-aware policies. A forward pass visits the MoE layers in order, 1..L, then starts over
// for the next token (or, in full-recompute mode, the next prefix). So the next request for an
// expert of layer l cannot come before the pass is back at layer l: experts of the layer just
// passed are the farthest from their next use, those of the next layers the nearest. When the
// set of experts a pass touches is larger than the cache (17.5 MB each, 1,472 per token), LRU
// evicts each expert shortly before its next use and gets no reuse across passes at all.
//
// The policies learn nothing about particular experts ahead of time; they see the layer of each
// request, the order of demand requests and (layer-lfu, layer-reuse) online request counts.
//   layer-mru:   evict from the layer farthest ahead of the pass (the one just passed), its most
//                recently used expert first; the current layer goes last.
//   layer-lfu:   the same layer order; within the layer the expert with the fewest aged requests
//                (most recently used among equals). The default: see policy.h and docs/CACHE.md.
//   layer-reuse: evicts the key with the largest estimated time to its next use, in passes:
//                layers to its next visit / L + (1 - p) / p, where p estimates how likely the
//                key is requested at a visit of its layer (a decayed fraction of past visits,
//                with a prior at the layer's base rate).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

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
  const absl::flat_hash_map<int32_t, Layer>& all() const { return layers_; }

 private:
  absl::flat_hash_map<int32_t, Layer> layers_;
};

// layer-mru and layer-lfu: the layer order above, then a rank within the layer.
class LayerOrderPolicy final : public ReplacementPolicy {
 public:
  LayerOrderPolicy(const PolicyOptions& options, bool by_frequency)
      : by_frequency_(by_frequency), pos_(options.num_layers), freq_(AgeingPeriod(options)) {}

  std::string_view name() const override { return by_frequency_ ? "layer-lfu" : "layer-mru"; }
  void OnRequest(const ExpertKey& key, RequestKind kind) override {
    ++tick_;
    pos_.Observe(key, kind);
    if (by_frequency_) freq_.Add(key);
  }
  void OnHit(const ExpertKey& key) override { residents_.Touch(key, tick_); }
  void OnInsert(const ExpertKey& key) override { residents_.Insert(key, tick_); }
  void OnRemove(const ExpertKey& key, RemovalCause) override { residents_.Erase(key); }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    for (int32_t id : residents_.ByDistance(pos_)) {
      std::optional<ExpertKey> victim = WithinLayer(residents_.layer(id), evictable);
      if (victim) return victim;
    }
    return std::nullopt;
  }

 private:
  // Fewest requests first (layer-lfu only), then most recently used: under a cyclic pass the
  // key used last is the one whose next use is farthest away.
  std::optional<ExpertKey> WithinLayer(const LayerResidents::Layer& keys,
                                       EvictablePredicate evictable) const {
    std::optional<ExpertKey> best;
    uint32_t best_freq = 0;
    int64_t best_tick = 0;
    for (const auto& [key, tick] : keys) {
      if (!evictable(key)) continue;
      const uint32_t f = by_frequency_ ? freq_.Get(key) : 0;
      if (!best || f < best_freq || (f == best_freq && tick > best_tick)) {
        best = key;
        best_freq = f;
        best_tick = tick;
      }
    }
    return best;
  }

  bool by_frequency_;
  PassPosition pos_;
  FrequencyTable freq_;
  int64_t tick_ = 0;
  LayerResidents residents_;
};

// layer-reuse. Per key: a decayed count of the visits of its layer that requested it (hits)
// and of the visits since it was first seen (visits), both multiplied by kDecay at every later
// visit of the layer, so the estimate follows a drifting workload with a memory of about
// 1 / (1 - kDecay) visits. The prior (kPriorVisits visits at the layer's base rate: distinct
// keys per visit / distinct keys seen) keeps a key seen once from looking certain.
class LayerReusePolicy final : public ReplacementPolicy {
 public:
  explicit LayerReusePolicy(const PolicyOptions& options) : pos_(options.num_layers) {
    if (const char* e = std::getenv("K3X_DECAY")) decay_ = std::atof(e);
    if (const char* e = std::getenv("K3X_PRIOR")) prior_ = std::atof(e);
  }

  std::string_view name() const override { return "layer-reuse"; }
  void OnRequest(const ExpertKey& key, RequestKind kind) override {
    const int32_t previous = pos_.current();
    pos_.Observe(key, kind);
    candidates_.erase(key.layer);  // its keys' estimates or protection may change
    candidates_.erase(previous);   // its keys are no longer protected
    const int64_t visit = pos_.visits(key.layer);
    auto [it, first_time] = stats_.try_emplace(key);
    KeyStats& s = it->second;
    LayerStats& layer = layer_stats_[key.layer];
    if (first_time) {
      ++layer.distinct_keys;
      s.visit = visit - 1;  // so that the current visit is counted below
    } else if (s.last_request_visit == visit) {
      return;  // counted in this visit already
    }
    Decay(s, visit);
    s.hits += 1;
    s.last_request_visit = visit;
    ++layer.distinct_requests;
  }
  void OnHit(const ExpertKey&) override {}
  void OnInsert(const ExpertKey& key) override {
    residents_.Insert(key, 0);
    candidates_.erase(key.layer);
  }
  void OnRemove(const ExpertKey& key, RemovalCause) override {
    residents_.Erase(key);
    candidates_.erase(key.layer);
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    std::optional<Candidate> best;
    for (const auto& [id, keys] : residents_.all()) {
      std::optional<Candidate> c = LayerCandidate(id, keys, evictable);
      if (!c) continue;
      const double score = static_cast<double>(pos_.Ahead(id)) / pos_.span() + (1 - c->p) / c->p;
      if (!best || score > best->score) best = Candidate{c->key, c->p, score};
    }
    if (best) return best->key;
    // Only keys of the current visit are left: any evictable one.
    for (const auto& [id, keys] : residents_.all()) {
      for (const auto& [key, unused] : keys) {
        if (evictable(key)) return key;
      }
    }
    return std::nullopt;
  }

 private:
  struct KeyStats {
    double hits = 0;
    double visits = 0;
    int64_t visit = 0;  // layer visit the two counts are current for
    int64_t last_request_visit = -1;
  };
  struct LayerStats {
    int64_t distinct_keys = 0;
    int64_t distinct_requests = 0;  // summed over visits
  };
  struct Candidate {
    ExpertKey key;
    double p = 1;
    double score = 0;
  };

  void Decay(KeyStats& s, int64_t visit) const {
    const int64_t elapsed = visit - s.visit;
    if (elapsed <= 0) return;
    const double d = std::pow(decay_, static_cast<double>(elapsed));
    s.hits *= d;
    s.visits = decay_ >= 1 ? s.visits + elapsed : s.visits * d + (1 - d) / (1 - decay_);
    s.visit = visit;
  }
  bool Protected(const ExpertKey& key) const {
    if (key.layer != pos_.current()) return false;
    auto it = stats_.find(key);
    return it != stats_.end() && it->second.last_request_visit == pos_.visits(key.layer);
  }
  double ReuseProbability(const ExpertKey& key) const {
    KeyStats s = stats_.at(key);
    Decay(s, pos_.visits(key.layer));
    const LayerStats& layer = layer_stats_.at(key.layer);
    const double per_visit = static_cast<double>(layer.distinct_requests) /
                             static_cast<double>(std::max<int64_t>(1, pos_.visits(key.layer)));
    const double base = std::min(
        1.0, per_visit / static_cast<double>(std::max<int64_t>(1, layer.distinct_keys)));
    return std::max(1e-6, (s.hits + prior_ * base) / (s.visits + prior_));
  }
  // The layer's key least likely to be reused, among the evictable unprotected ones. Cached per
  // layer until a request, insert or removal in that layer (the estimates of a layer's keys
  // change only then); not cached when the predicate turned a key down.
  std::optional<Candidate> LayerCandidate(int32_t id, const LayerResidents::Layer& keys,
                                          EvictablePredicate evictable) {
    if (auto it = candidates_.find(id); it != candidates_.end() && evictable(it->second.key)) {
      return it->second;
    }
    std::optional<Candidate> best;
    bool skipped = false;
    for (const auto& [key, unused] : keys) {
      if (Protected(key)) continue;
      if (!evictable(key)) {
        skipped = true;
        continue;
      }
      const double p = ReuseProbability(key);
      if (!best || p < best->p) best = Candidate{key, p, 0};
    }
    if (best && !skipped) candidates_[id] = *best;
    return best;
  }

  double decay_ = 1.0 - 1.0 / 64;
  double prior_ = 2.0;
  PassPosition pos_;
  absl::flat_hash_map<ExpertKey, KeyStats> stats_;
  absl::flat_hash_map<int32_t, LayerStats> layer_stats_;
  LayerResidents residents_;
  absl::flat_hash_map<int32_t, Candidate> candidates_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLayerMru(const PolicyOptions& options) {
  return std::make_unique<LayerOrderPolicy>(options, /*by_frequency=*/false);
}
std::unique_ptr<ReplacementPolicy> MakeLayerLfu(const PolicyOptions& options) {
  return std::make_unique<LayerOrderPolicy>(options, /*by_frequency=*/true);
}
std::unique_ptr<ReplacementPolicy> MakeLayerReuse(const PolicyOptions& options) {
  return std::make_unique<LayerReusePolicy>(options);
}

}  // namespace k3::cache_internal
