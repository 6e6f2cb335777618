// Layer-aware policies. A forward pass visits the MoE layers in order, 1..L, then starts over
// for the next token (or, in full-recompute mode, the next prefix). So the next request for an
// expert of layer l cannot come before the pass is back at layer l: experts of the layer just
// passed are the farthest from their next use, those of the next layers the nearest. When the
// set of experts a pass touches is larger than the cache (17.5 MB each, 1,472 per token), LRU
// evicts each expert shortly before its next use and gets no reuse across passes at all.
//
// The policies learn nothing about particular experts ahead of time; they see the layer of each
// request, the order of demand requests and online request counts.
//   layer-mru:  evict from the layer farthest ahead of the pass (the one just passed), its most
//               recently used expert first; the current layer goes last.
//   layer-lfu:  the same layer order; within the layer the expert with the fewest aged requests
//               (most recently used among equals).
//   layer-freq: evicts the key with the largest expected wait until its next use, in passes:
//               layers to its next visit / L + (1 - p) / p, where p is the key's decayed
//               fraction of visits that requested it, with a prior at the layer's base rate.
// layer-reuse (policy_layer_reuse.cc, the default) ranks by the same expected wait with p
// learned from recency and frequency; these three are the steps that led to it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/layer_position.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

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
      const bool current = id == pos_.current();
      std::optional<ExpertKey> victim = WithinLayer(residents_.layer(id), current, evictable);
      if (victim) return victim;
    }
    return std::nullopt;
  }

 private:
  // Fewest requests first (layer-lfu only), then by recency: in a layer the pass has left, the
  // most recently used key is the one whose next use is farthest away (cyclic access); in the
  // current layer, whose visit may still ask for its keys again, the least recently used.
  std::optional<ExpertKey> WithinLayer(const LayerResidents::Layer& keys, bool current,
                                       EvictablePredicate evictable) const {
    std::optional<ExpertKey> best;
    uint32_t best_freq = 0;
    int64_t best_tick = 0;
    for (const auto& [key, tick] : keys) {
      if (!evictable(key)) continue;
      const uint32_t f = by_frequency_ ? freq_.Get(key) : 0;
      const bool newer = current ? tick < best_tick : tick > best_tick;
      if (!best || f < best_freq || (f == best_freq && newer)) {
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

// layer-freq. Per key: a decayed count of the visits of its layer that requested it (hits)
// and of the visits since it was first seen (visits), both multiplied by kDecay at every later
// visit of the layer, so the estimate follows a drifting workload with a memory of about
// 1 / (1 - kDecay) visits. The prior (kPriorVisits visits at the layer's base rate: distinct
// keys per visit / distinct keys seen) keeps a key seen once from looking certain.
class LayerFreqPolicy final : public ReplacementPolicy {
 public:
  explicit LayerFreqPolicy(const PolicyOptions& options) : pos_(options.num_layers) {}

  std::string_view name() const override { return "layer-freq"; }
  void OnRequest(const ExpertKey& key, RequestKind kind) override {
    ++tick_;
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
  void OnHit(const ExpertKey& key) override { residents_.Touch(key, tick_); }
  void OnInsert(const ExpertKey& key) override {
    residents_.Insert(key, tick_);
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
    return residents_.LeastRecent(evictable);  // only keys the current visit requested remain
  }

 private:
  // A memory of about 64 visits; a prior worth 10 visits (chosen on the synthetic
  // incremental-decode traces of docs/CACHE.md; the recorded trace is insensitive to both).
  static constexpr double kDecay = 1.0 - 1.0 / 64;
  static constexpr double kPriorVisits = 10.0;

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

  static void Decay(KeyStats& s, int64_t visit) {
    const int64_t elapsed = visit - s.visit;
    if (elapsed <= 0) return;
    const double d = std::pow(kDecay, static_cast<double>(elapsed));
    s.hits *= d;
    s.visits = s.visits * d + (1 - d) / (1 - kDecay);
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
    const double base =
        std::min(1.0, per_visit / static_cast<double>(std::max<int64_t>(1, layer.distinct_keys)));
    return std::max(1e-6, (s.hits + kPriorVisits * base) / (s.visits + kPriorVisits));
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

  PassPosition pos_;
  int64_t tick_ = 0;
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
std::unique_ptr<ReplacementPolicy> MakeLayerFreq(const PolicyOptions& options) {
  return std::make_unique<LayerFreqPolicy>(options);
}

}  // namespace k3::cache_internal
