#include "core/model/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace k3 {

TokenLogprob LogProbs(std::span<const float> logits, int32_t id, int top) {
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);
  TokenLogprob out;
  out.id = id;
  out.logprob = static_cast<float>(static_cast<double>(logits[id]) - lse);
  if (top <= 0) return out;
  // The `top` largest logits: a partial selection over the ids, ties to the lower id.
  std::vector<int32_t> ids;
  ids.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) ids.push_back(static_cast<int32_t>(i));
  }
  const size_t k = std::min(ids.size(), static_cast<size_t>(top));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (size_t i = 0; i < k; ++i) {
    out.top.push_back({ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse)});
  }
  return out;
}

}  // namespace k3
