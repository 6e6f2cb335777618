#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::Status ValidateSamplerOptions(const SamplerOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("--temp must be >= 0, not ", o.temperature));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--top-k must be >= 0, not ", o.top_k));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--top-p must be in (0, 1], not ", o.top_p));
  }
  return absl::OkStatus();
}

int32_t ArgmaxToken(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.greedy || options_.temperature == 0) return ArgmaxToken(logits);
  // Candidates by descending logit (ties: lower id), cut to top-k.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  size_t k = options_.top_k > 0 ? std::min<size_t>(options_.top_k, ids.size()) : ids.size();
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(k);
  // Softmax with temperature, in double.
  std::vector<double> p(k);
  const double top = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[ids[i]] - top) / options_.temperature);
    sum += p[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p.
  double mass = 0;
  size_t keep = k;
  for (size_t i = 0; i < k; ++i) {
    mass += p[i] / sum;
    if (mass >= options_.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  // A uniform double from the top 53 bits of the generator.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace k3
