// layer-reuse: evict the resident expert expected to be needed last.
//
// A forward pass visits the MoE layers in order, so a key of layer l can next be requested at
// the next visit of l, which is Ahead(l) layers away, and then again one pass later, and so on.
// If p is the probability that a visit of l requests the key, the expected wait is
//     Ahead(l) / L + (1 - p) / p   passes,
// and the policy evicts the key with the largest one (the current layer's keys already
// requested in this visit are kept: the visit may ask for them again).
//
// p is learned online from the workload rather than assumed: every key is described by two
// small numbers, its age (visits of its layer since it was last requested, log2 buckets) and
// its decayed request count (log2 buckets), and a table over those 8 x 8 cells counts, pooled
// over all layers, how often a key in a cell was requested at the next visit. No expert is
// known in advance; what is learned is how reuse depends on recency and frequency, e.g.
//   full-recompute traces: every key of the previous pass comes back (age 1 -> p ~ 1), so the
//     order reduces to the layer distance and the cache keeps a stable set, as Belady does;
//   incremental decoding with skewed routing: the count bucket predicts reuse (LFU-like);
//   incremental decoding with token-to-token correlation: age 1 predicts reuse (LRU-like).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/layer_position.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

constexpr int kAgeBuckets = 8;   // ages 1, 2-3, 4-7, ..., 128+ visits
constexpr int kFreqBuckets = 8;  // decayed counts 0, ~0.5-1, ~1.5-3, ..., 32+
constexpr int kCells = kAgeBuckets * kFreqBuckets;
// Request counts fade by this factor per visit of the key's layer: a memory of ~64 visits.
constexpr double kCountDecay = 1.0 - 1.0 / 64;
// Weight (in exposures) of the table-wide reuse rate in each cell's estimate, so that a cell
// with few observations starts near the average rather than at 0 or 1.
constexpr double kCellPrior = 1.0;
// When this many exposures have been counted, all cells are halved: the table follows a
// workload that changes (a new conversation, another language) instead of averaging forever.
constexpr double kTableMemory = 1 << 20;

class LayerReusePolicy final : public ReplacementPolicy {
 public:
  explicit LayerReusePolicy(const PolicyOptions& options) : pos_(options.num_layers) { Refresh(); }

  std::string_view name() const override { return "layer-reuse"; }
  void OnRequest(const ExpertKey& key, RequestKind kind) override {
    ++tick_;
    const int32_t previous = pos_.current();
    const bool new_visit = pos_.Observe(key, kind);
    if (kind != RequestKind::kDemand) return;  // a guess teaches the model nothing
    if (new_visit) {
      candidates_.erase(previous);  // its keys are no longer protected
      StartVisit(key.layer);
    }
    candidates_.erase(key.layer);
    Record(key);
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
    std::optional<ExpertKey> victim;
    double worst = -std::numeric_limits<double>::infinity();
    for (const auto& [id, keys] : residents_.all()) {
      std::optional<Candidate> c = LayerCandidate(id, keys, evictable);
      if (!c) continue;
      const double wait = static_cast<double>(pos_.Ahead(id)) / pos_.span() + (1 - c->p) / c->p;
      if (!victim || wait > worst) {
        victim = c->key;
        worst = wait;
      }
    }
    if (victim) return victim;
    return residents_.LeastRecent(evictable);  // only keys the current visit requested remain
  }

 private:
  struct KeyState {
    int64_t last_visit = 0;  // visit of its layer that last requested it
    double count = 0;        // decayed requests (one per visit), as of count_visit
    int64_t count_visit = 0;
    int64_t exposed_visit = -1;  // visit at whose start it was counted in cell
    int cell = 0;
    int64_t tick = 0;  // last request, for ties
  };
  struct Cell {
    double exposures = 0;  // a key was in this cell at the start of a visit of its layer
    double hits = 0;       // ... and that visit requested it
  };
  struct Candidate {
    ExpertKey key;
    double p = 1;
    int64_t tick = 0;
  };

  // The cell of a key at the start of `visit` of its layer.
  static int CellAt(const KeyState& s, int64_t visit) {
    const uint64_t age = static_cast<uint64_t>(std::max<int64_t>(1, visit - s.last_visit));
    const double count =
        s.count * std::pow(kCountDecay, static_cast<double>(visit - s.count_visit));
    const int age_bucket = std::min(kAgeBuckets - 1, static_cast<int>(std::bit_width(age)) - 1);
    const uint64_t scaled = static_cast<uint64_t>(2 * count + 1);
    const int count_bucket =
        std::min(kFreqBuckets - 1, static_cast<int>(std::bit_width(scaled)) - 1);
    return age_bucket * kFreqBuckets + count_bucket;
  }

  // Every key of the layer seen so far is exposed to this visit in its current cell.
  void StartVisit(int32_t layer) {
    const int64_t visit = pos_.visits(layer);
    for (const ExpertKey& k : known_[layer]) {
      KeyState& s = stats_[k];
      s.cell = CellAt(s, visit);
      s.exposed_visit = visit;
      table_[s.cell].exposures += 1;
      exposures_ += 1;
    }
    if (++visits_since_refresh_ >= pos_.span()) Refresh();
  }

  void Record(const ExpertKey& key) {
    const int64_t visit = pos_.visits(key.layer);
    auto [it, fresh] = stats_.try_emplace(key);
    KeyState& s = it->second;
    s.tick = tick_;
    if (fresh) {
      known_[key.layer].push_back(key);
      s = {.last_visit = visit, .count = 1, .count_visit = visit, .tick = tick_};
      return;
    }
    if (s.last_visit == visit) return;  // requested earlier in this visit
    if (s.exposed_visit == visit) table_[s.cell].hits += 1;
    s.count = s.count * std::pow(kCountDecay, static_cast<double>(visit - s.count_visit)) + 1;
    s.count_visit = visit;
    s.last_visit = visit;
  }

  // Re-estimates every cell's reuse probability, once per pass: the estimates the victims are
  // ranked by stay fixed in between, which lets each layer's best candidate be cached.
  void Refresh() {
    visits_since_refresh_ = 0;
    double hits = 0;
    for (const Cell& c : table_) hits += c.hits;
    const double average = exposures_ > 0 ? hits / exposures_ : 1.0;
    p_average_ = std::clamp(average, 1e-6, 1.0);
    for (int i = 0; i < kCells; ++i) {
      p_[i] = (table_[i].hits + kCellPrior * average) / (table_[i].exposures + kCellPrior);
      p_[i] = std::clamp(p_[i], 1e-6, 1.0);
    }
    if (exposures_ > kTableMemory) {
      for (Cell& c : table_) c = {c.exposures / 2, c.hits / 2};
      exposures_ /= 2;
    }
    candidates_.clear();
  }

  bool Protected(const ExpertKey& key, const KeyState& s) const {
    return key.layer == pos_.current() && s.last_visit == pos_.visits(key.layer);
  }

  // Probability that the next visit of the key's layer (the current visit, for the current
  // layer) requests it.
  double ReuseProbability(const ExpertKey& key, const KeyState& s) const {
    const int64_t visits = pos_.visits(key.layer);
    return p_[CellAt(s, key.layer == pos_.current() ? visits : visits + 1)];
  }

  // The layer's key least likely to be reused (the most recently requested among equals), among
  // the evictable unprotected ones. Cached per layer until a request, insert or removal in that
  // layer or a refresh; not cached when the predicate turned a key down.
  std::optional<Candidate> LayerCandidate(int32_t id, const LayerResidents::Layer& keys,
                                          EvictablePredicate evictable) {
    if (auto it = candidates_.find(id); it != candidates_.end() && evictable(it->second.key)) {
      return it->second;
    }
    std::optional<Candidate> best;
    bool skipped = false;
    for (const auto& [key, unused] : keys) {
      auto st = stats_.find(key);
      const KeyState none;
      const KeyState& s = st == stats_.end() ? none : st->second;
      if (st != stats_.end() && Protected(key, s)) continue;
      if (!evictable(key)) {
        skipped = true;
        continue;
      }
      // A key only ever prefetched has no history: it gets the table-wide average.
      const double p = st == stats_.end() ? p_average_ : ReuseProbability(key, s);
      if (!best || p < best->p || (p == best->p && s.tick > best->tick)) {
        best = Candidate{key, p, s.tick};
      }
    }
    if (best && !skipped) candidates_[id] = *best;
    return best;
  }

  PassPosition pos_;
  int64_t tick_ = 0;
  absl::flat_hash_map<ExpertKey, KeyState> stats_;
  absl::flat_hash_map<int32_t, std::vector<ExpertKey>> known_;  // keys seen, by layer
  std::array<Cell, kCells> table_ = {};
  double exposures_ = 0;
  std::array<double, kCells> p_ = {};
  double p_average_ = 1.0;
  int64_t visits_since_refresh_ = 0;
  LayerResidents residents_;
  absl::flat_hash_map<int32_t, Candidate> candidates_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLayerReuse(const PolicyOptions& options) {
  return std::make_unique<LayerReusePolicy>(options);
}

}  // namespace k3::cache_internal
