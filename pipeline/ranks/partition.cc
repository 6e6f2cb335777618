#include "pipeline/ranks/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace k3::ranks {
namespace {

// Whole counts summing to `total` in proportion to `weights` (largest remainder), each at least
// one where total allows; the remainders go to the ranks after `rotate` first, so that over many
// layers the extra experts do not always fall on the same rank.
std::vector<int64_t> Apportion(int64_t total, const std::vector<double>& weights, size_t rotate) {
  const size_t n = weights.size();
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  const int64_t floor_each = total >= static_cast<int64_t>(n) ? 1 : 0;
  const int64_t rest = total - floor_each * static_cast<int64_t>(n);
  std::vector<int64_t> counts(n, floor_each);
  std::vector<double> remainder(n);
  int64_t given = 0;
  for (size_t r = 0; r < n; ++r) {
    const double exact = rest * weights[r] / sum;
    const auto whole = static_cast<int64_t>(std::floor(exact));
    counts[r] += whole;
    given += whole;
    remainder[r] = exact - static_cast<double>(whole);
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = (rotate + i) % n;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t i = 0; given < rest; ++i, ++given) ++counts[order[i % n]];
  return counts;
}

}  // namespace

std::vector<double> ShareWeights(const std::vector<RankCapacity>& ranks,
                                 uint64_t all_experts_bytes) {
  uint64_t held = 0;
  for (const RankCapacity& r : ranks) held += r.cache_bytes;
  const bool by_cache = held >= all_experts_bytes;
  std::vector<double> w(ranks.size());
  double known = 0;
  int count = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    w[i] = by_cache ? static_cast<double>(ranks[i].cache_bytes) : ranks[i].disk_rate;
    if (w[i] > 0) known += w[i], ++count;
  }
  const double fill = count > 0 ? known / count : 1.0;
  for (double& x : w) {
    if (!(x > 0)) x = fill;
  }
  return w;
}

ExpertPartition::ExpertPartition(int64_t layers, int64_t experts,
                                 const std::vector<double>& weights)
    : experts_(experts),
      owner_(static_cast<size_t>(layers * experts), 0),
      shares_(weights.size(), 0.0) {
  const size_t n = weights.size();
  for (int64_t l = 0; l < layers; ++l) {
    const std::vector<int64_t> counts = Apportion(experts, weights, static_cast<size_t>(l));
    // Interleave the ranks over the layer's experts (smooth weighted round robin by count), so
    // that each rank's experts are spread over the layer rather than one block of neighbours.
    std::vector<int64_t> credit(n, 0), left = counts;
    for (int64_t e = 0; e < experts; ++e) {
      size_t best = n;
      for (size_t r = 0; r < n; ++r) {
        if (left[r] == 0) continue;
        credit[r] += counts[r];
        if (best == n || credit[r] > credit[best]) best = r;
      }
      credit[best] -= experts;
      --left[best];
      owner_[static_cast<size_t>(l * experts + e)] = static_cast<int>(best);
    }
    for (size_t r = 0; r < n; ++r) shares_[r] += static_cast<double>(counts[r]);
  }
  if (layers > 0) {
    for (double& s : shares_) s /= static_cast<double>(layers);
  }
}

std::string ExpertPartition::Describe() const {
  std::string line;
  for (size_t r = 0; r < shares_.size(); ++r) {
    absl::StrAppend(
        &line, r == 0 ? "" : ", ", "rank ", r, " ", absl::StrFormat("%.1f", shares_[r]), " (",
        absl::StrFormat("%.0f%%", 100.0 * shares_[r] / std::max<int64_t>(1, experts_)), ")");
  }
  return line;
}

}  // namespace k3::ranks
