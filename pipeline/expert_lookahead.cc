// The lookahead of the streaming expert provider (expert_stream.h): at layer l the routers of
// l+1..l+D run on l's hidden state, their predicted experts are read at prefetch priority, and the
// predictions are scored when their layer's router has chosen.
#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "core/model/weights.h"
#include "kernels/model_ops.h"
#include "pipeline/expert_stream.h"  // the class whose lookahead this is

namespace k3 {

void StreamingExpertProvider::ScorePredictions(int64_t layer, std::span<const int32_t> experts) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = predictions_.find(layer);
  if (it != predictions_.end()) {
    absl::flat_hash_set<int32_t> actual(experts.begin(), experts.end()), any;
    for (const auto& [distance, predicted] : it->second) {
      any.insert(predicted.begin(), predicted.end());
      // The figures by distance describe decoding (a prompt's distance may be larger).
      if (prefill_pass_ || distance > static_cast<int>(accuracy_.size())) continue;
      PrefetchAccuracy& a = accuracy_[distance - 1];
      a.predicted += predicted.size();
      a.actual += actual.size();
      for (int32_t e : predicted) a.correct += actual.contains(e);
    }
    metrics_.prefetch_predicted += any.size();
    metrics_.routed_experts += actual.size();
    for (int32_t e : any) metrics_.prefetch_correct += actual.contains(e);
  }
  predictions_.erase(predictions_.begin(), predictions_.upper_bound(layer));
}

void StreamingExpertProvider::CancelStalePrefetches(int64_t layer) {
  std::vector<io::ReadId> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, p] : pending_) {
      if (p.prefetch && !p.demanded && key.layer < layer && p.id != 0) stale.push_back(p.id);
    }
  }
  for (io::ReadId id : stale) reads_.Cancel(id);
}

void StreamingExpertProvider::TryPrefetch(const ExpertKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.contains(key) || cache_.Contains(key)) return;
  if (!ckpt_.expert(key.layer, key.expert).contiguous()) return;
  if (prefetch_bytes_in_flight_ + ExpertBytes() > options_.prefetch_cap_bytes) return;
  // Leave room for the next layer's demands: guesses never take the last top-k slots.
  const CacheStats s = cache_.stats();
  if (s.pinned_slots + s.filling_slots + ckpt_.config().num_experts_per_token >= s.slots) return;
  auto grant = cache_.Request(key, {.kind = RequestKind::kPrefetch, .pin = true});
  if (!grant.ok()) return;
  if (grant->outcome != CacheOutcome::kFill) {
    if (grant->outcome == CacheOutcome::kHit) (void)cache_.Unpin(key);
    return;
  }
  prefetch_bytes_in_flight_ += ExpertBytes();
  SubmitRead(key, grant->bytes, /*prefetch=*/true);
  if (pending_.contains(key)) {
    guarded_.insert(key);
  } else {
    prefetch_bytes_in_flight_ -= ExpertBytes();
  }
}

void StreamingExpertProvider::Predict(int64_t layer, int distance, std::span<const float> x,
                                      size_t tokens) {
  const ModelConfig& c = ckpt_.config();
  const MoeWeights& w = trunk_.layers[layer].moe;
  const size_t experts = c.num_experts;
  const size_t width = std::min<size_t>(
      experts, options_.prefetch_width > 0 ? options_.prefetch_width : c.num_experts_per_token);
  std::vector<float> logits(tokens * experts);
  MatMul(w.router, x, tokens, logits);
  // The union over the chunk's tokens, best-scored first within each token.
  std::vector<int32_t> predicted;
  absl::flat_hash_set<int32_t> seen;
  std::vector<kernels::RoutedExpert> top;
  for (size_t t = 0; t < tokens; ++t) {
    kernels::RouteTopK(std::span<const float>(logits).subspan(t * experts, experts), w.router_bias,
                       width, false, 1.0f, top);
    for (const auto& r : top) {
      if (seen.insert(r.expert).second) predicted.push_back(r.expert);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    predictions_[layer][distance] = predicted;
  }
  std::vector<int32_t> away;
  for (int32_t e : predicted) {
    if (elsewhere_ && elsewhere_(layer, e)) {
      away.push_back(e);
    } else {
      TryPrefetch({static_cast<int32_t>(layer), e});
    }
  }
  if (!away.empty() && forward_) forward_(layer, std::move(away));
}

void StreamingExpertProvider::Prefetch(int64_t layer, std::span<const int32_t> experts) {
  for (int32_t e : experts) TryPrefetch({static_cast<int32_t>(layer), e});
}

void StreamingExpertProvider::Lookahead(int64_t layer, std::span<const float> x, size_t tokens) {
  const int distance = tokens > 1 ? options_.prefill_prefetch_distance : options_.prefetch_distance;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_pass_ = tokens > 1;  // the predictions StartFetch scores in this pass are ours
    // A pass that ended early (every sequence of the step cancelled, or a failed read) left
    // predictions for layers it never reached: a new pass starts without them.
    if (layer == 0) predictions_.clear();
  }
  if (!options_.overlap || distance == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  CancelStalePrefetches(layer);
  const ModelConfig& c = ckpt_.config();
  for (int d = 1; d <= distance; ++d) {
    const int64_t target = layer + d;
    if (target >= c.num_layers) break;
    // A router that is not resident (it streams with its layer) cannot look ahead.
    if (!c.is_dense(target) && !trunk_.layers[target].moe.router.streamed()) {
      Predict(target, d, x, tokens);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.lookahead_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace k3
