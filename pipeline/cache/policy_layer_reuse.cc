// layer-reuse: evict the resident expert expected to be needed last.
//
// A forward pass visits the MoE layers in order, so a key of layer l can next be requested at
// the next visit of l, which is Ahead(l) layers away, and then again one pass later, and so on.
// If p is the probability that a visit of l requests the key, the expected wait is
//     Ahead(l) / L + (1 - p) / p   passes,
// and the policy evicts the key with the largest one. A key the current visit already requested
// may be requested again before the visit ends (in prefill or full recompute several tokens
// share experts; in incremental decoding a token's top-k are distinct); with q the learned
// probability of such a repeat, its expected wait is (1 - q) (1 + (1 - p') / p'), p' being its
// probability at the next visit. q is learned the same way, by how many times the key has been
// requested so far in this visit compared with how many times in its previous visit (in full
// recompute the same tokens ask for it again, so a key short of its previous count comes back).
//
// p is learned online from the workload rather than assumed: every key is described by two
// small numbers, its age (visits of its layer since it was last requested, log2 buckets) and
// its decayed request count (log2 buckets), and a table over those 8 x 8 cells counts, pooled
// over all layers, how often a key in a cell was requested at the next visit. No expert is
// known in advance; what is learned is how reuse depends on recency and frequency, e.g.
//   full-recompute traces: every key of the previous pass comes back (age 1 -> p ~ 1), so the
//     order reduces to the layer distance and the cache keeps a stable set, as Belady does;
//   incremental decoding with skewed routing: the count bucket predicts reuse (LFU-like);
//   incremental decoding with token-to-token correlation: age 1 predicts reuse (LRU-like);
//   and q is near 1 when tokens of a visit share experts, 0 when a visit is a single token.
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
// Repeat classes: a key new to its layer, requested once or more so far in the visit (2), or
// with a previous visit, by (requests in the previous visit - requests so far) in -3..4 (8).
constexpr int kRepeatClasses = 10;
// Weight (in observations) of the initial belief that a key is requested again within its
// visit: until the workload shows otherwise the current visit's keys are kept, as a
// conventional cache would keep them.
constexpr double kRepeatPrior = 1.0;

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
      candidates_.erase(previous);  // its keys are no longer in the current visit
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
      std::optional<Candidate> c = id == pos_.current() ? CurrentLayerCandidate(keys, evictable)
                                                        : LayerCandidate(id, keys, evictable);
      if (c && (!victim || c->wait > worst)) {
        victim = c->key;
        worst = c->wait;
      }
    }
    return victim;
  }

 private:
  struct KeyState {
    int64_t last_visit = 0;  // visit of its layer that last requested it
    double count = 0;        // decayed requests (one per visit), as of count_visit
    int64_t count_visit = 0;
    int64_t exposed_visit = -1;      // visit at whose start it was counted in cell
    int32_t visit_requests = 0;      // requests in last_visit
    int32_t previous_requests = -1;  // requests in the visit before that (-1: none)
    int cell = 0;
    int64_t tick = 0;  // last request, for ties
  };
  struct Cell {
    double exposures = 0;  // a key was in this cell at the start of a visit of its layer
    double hits = 0;       // ... and that visit requested it
  };
  struct Candidate {
    ExpertKey key;
    double p = 1;      // reuse probability at the next visit of its layer
    int64_t tick = 0;  // last request
    double wait = 0;   // expected passes until its next request
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
      s.visit_requests = 1;
      repeats_[RepeatClass(s)].exposures += 1;
      return;
    }
    if (s.last_visit == visit) {  // requested earlier in this visit: a repeat
      repeats_[RepeatClass(s)].hits += 1;
      s.visit_requests += 1;
      repeats_[RepeatClass(s)].exposures += 1;
      return;
    }
    s.previous_requests = s.visit_requests;
    s.visit_requests = 1;
    repeats_[RepeatClass(s)].exposures += 1;
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
    double repeat_exposures = 0;
    for (const Cell& c : repeats_) repeat_exposures += c.exposures;
    if (repeat_exposures > kTableMemory) {
      for (Cell& c : repeats_) c = {c.exposures / 2, c.hits / 2};
    }
    candidates_.clear();
  }

  static int RepeatClass(const KeyState& s) {
    if (s.previous_requests < 0) return s.visit_requests <= 1 ? 0 : 1;
    return 2 + std::clamp(s.previous_requests - s.visit_requests, -3, 4) + 3;
  }
  // Probability that a key the current visit requested is requested again in the same visit.
  double RepeatProbability(const KeyState& s) const {
    const Cell& c = repeats_[RepeatClass(s)];
    return (c.hits + kRepeatPrior) / (c.exposures + kRepeatPrior);
  }

  // The layer's key least likely to be requested at the layer's next visit (the most recently
  // requested among equals). The estimates of a layer the pass is not in change only with a
  // request, insert or removal in that layer or a refresh, so the choice is cached until then;
  // not when the predicate turned a key down.
  std::optional<Candidate> LayerCandidate(int32_t id, const LayerResidents::Layer& keys,
                                          EvictablePredicate evictable) {
    std::optional<Candidate> best;
    if (auto it = candidates_.find(id); it != candidates_.end() && evictable(it->second.key)) {
      best = it->second;
    } else {
      bool skipped = false;
      const int64_t next_visit = pos_.visits(id) + 1;
      for (const auto& [key, unused] : keys) {
        if (!evictable(key)) {
          skipped = true;
          continue;
        }
        const KeyState& s = State(key);
        const double p = Probability(s, next_visit);
        if (!best || p < best->p || (p == best->p && s.tick > best->tick)) {
          best = Candidate{key, p, s.tick, 0};
        }
      }
      if (!best) return std::nullopt;
      if (!skipped) candidates_[id] = *best;
    }
    const double ahead = static_cast<double>(pos_.Ahead(id)) / pos_.span();
    best->wait = ahead + (1 - best->p) / best->p;
    return best;
  }

  // In the layer the pass is in: keys this visit requested may come back before it ends (the
  // repeat probability q), the others may still be requested in it.
  std::optional<Candidate> CurrentLayerCandidate(const LayerResidents::Layer& keys,
                                                 EvictablePredicate evictable) const {
    const int64_t visit = pos_.visits(pos_.current());
    std::optional<Candidate> best;
    for (const auto& [key, unused] : keys) {
      if (!evictable(key)) continue;
      const KeyState& s = State(key);
      double wait;
      if (s.last_visit == visit) {
        const double p_next = Probability(s, visit + 1);
        wait = (1 - RepeatProbability(s)) * (1 + (1 - p_next) / p_next);
      } else {
        const double p = Probability(s, visit);
        wait = (1 - p) / p;
      }
      if (!best || wait > best->wait || (wait == best->wait && s.tick < best->tick)) {
        best = Candidate{key, 0, s.tick, wait};
      }
    }
    return best;
  }

  const KeyState& State(const ExpertKey& key) const {
    static const KeyState kNone = {.last_visit = -1};  // only ever prefetched: no history
    auto it = stats_.find(key);
    return it == stats_.end() ? kNone : it->second;
  }
  // The key's reuse probability at `visit` of its layer: its cell's, or the table-wide
  // average for a key without history.
  double Probability(const KeyState& s, int64_t visit) const {
    return s.last_visit < 0 ? p_average_ : p_[CellAt(s, visit)];
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
  std::array<Cell, kRepeatClasses> repeats_ = {};  // requested again within the visit?
  LayerResidents residents_;
  absl::flat_hash_map<int32_t, Candidate> candidates_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeLayerReuse(const PolicyOptions& options) {
  return std::make_unique<LayerReusePolicy>(options);
}

}  // namespace k3::cache_internal
