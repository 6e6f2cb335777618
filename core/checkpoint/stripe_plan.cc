// Where each routed expert goes in a striped layout (PlanStripes) and the shares that gives
// (StripeShares): the writing, loading and checking of the layout is core/checkpoint/stripe.cc.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/stripe.h"

namespace k3 {
namespace {

// ---- Planning -----------------------------------------------------------------------------

// Directory d of n, in the order that breaks ties for `layer`: the rotation moves the rounding
// to another directory each layer.
int TieRank(int d, int n, int64_t layer) { return static_cast<int>((d - layer % n + n) % n); }

// Each directory's count of a layer's m experts: its share by largest remainder, at least one
// when m allows it.
std::vector<int64_t> LayerCounts(int64_t m, const std::vector<double>& weights, int64_t layer) {
  const int n = static_cast<int>(weights.size());
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> quota(n);
  std::vector<int64_t> count(n);
  int64_t given = 0;
  for (int d = 0; d < n; ++d) {
    quota[d] = static_cast<double>(m) * weights[d] / total;
    count[d] = std::min<int64_t>(m, static_cast<int64_t>(std::floor(quota[d])));
    given += count[d];
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const double fa = quota[a] - count[a], fb = quota[b] - count[b];
    return fa != fb ? fa > fb : TieRank(a, n, layer) < TieRank(b, n, layer);
  });
  for (int i = 0; given < m; i = (i + 1) % n, ++given) ++count[order[i]];
  for (int d = 0; d < n && m >= n; ++d) {
    if (count[d] > 0) continue;
    int from = -1;  // the directory furthest over its quota that can spare one
    for (int j = 0; j < n; ++j) {
      if (count[j] >= 2 && (from < 0 || count[j] - quota[j] > count[from] - quota[from])) from = j;
    }
    --count[from];
    ++count[d];
  }
  return count;
}

// The directory of each of the layer's experts in id order: a smooth weighted round-robin with
// the counts as weights, which over sum(counts) turns deals each directory exactly its count and
// spreads each directory's turns evenly.
std::vector<int> Deal(const std::vector<int64_t>& count, int64_t layer) {
  const int n = static_cast<int>(count.size());
  const int64_t m = std::accumulate(count.begin(), count.end(), int64_t{0});
  std::vector<int64_t> credit(n, 0);
  std::vector<int> picks;
  picks.reserve(m);
  for (int64_t k = 0; k < m; ++k) {
    int best = -1;
    for (int d = 0; d < n; ++d) {
      credit[d] += count[d];
      if (count[d] > 0 &&
          (best < 0 || credit[d] > credit[best] ||
           (credit[d] == credit[best] && TieRank(d, n, layer) < TieRank(best, n, layer)))) {
        best = d;
      }
    }
    credit[best] -= m;
    picks.push_back(best);
  }
  return picks;
}

// Each directory's share of K copies of a layer's experts, as a fraction of one copy: K x its
// weight's share, capped at 1 (a directory holds an expert once), what a capped directory cannot
// take going to the others by weight. They add up to K.
std::vector<double> CopyTargets(const std::vector<double>& weights, int copies) {
  const int n = static_cast<int>(weights.size());
  std::vector<double> target(n, 0);
  std::vector<bool> full(n, false);
  for (bool capped = true; capped;) {
    capped = false;
    double rest = copies, weight = 0;
    for (int d = 0; d < n; ++d) {
      if (full[d]) {
        rest -= 1;
      } else {
        weight += weights[d];
      }
    }
    for (int d = 0; d < n; ++d) {
      if (full[d]) continue;
      target[d] = rest * weights[d] / weight;
      if (target[d] >= 1 - 1e-12) {
        target[d] = 1;
        full[d] = true;
        capped = true;
      }
    }
  }
  return target;
}

// Each directory's copies of a layer's m experts after the first: its count over all the copies
// (target x m, rounded by largest remainder with ties as in LayerCounts) less the first copies it
// has, at most the experts whose first copy is elsewhere. They add up to (copies - 1) x m.
std::vector<int64_t> ExtraCounts(int64_t m, const std::vector<int64_t>& first,
                                 const std::vector<double>& target, int copies, int64_t layer) {
  const int n = static_cast<int>(first.size());
  std::vector<double> quota(n);
  std::vector<int64_t> extra(n);
  int64_t given = 0;
  for (int d = 0; d < n; ++d) {
    const double room = static_cast<double>(m - first[d]);
    quota[d] =
        std::clamp(target[d] * static_cast<double>(m) - static_cast<double>(first[d]), 0.0, room);
    extra[d] = std::min<int64_t>(m - first[d], static_cast<int64_t>(std::floor(quota[d] + 1e-9)));
    given += extra[d];
  }
  // The directory most under (or, removing, most over) its quota; near-equal ones by TieRank.
  auto pick = [&](bool add) {
    int best = -1;
    double best_gap = 0;
    for (int d = 0; d < n; ++d) {
      if (add ? extra[d] >= m - first[d] : extra[d] == 0) continue;
      const double gap = add ? quota[d] - extra[d] : extra[d] - quota[d];
      if (best < 0 || gap > best_gap + 1e-9 ||
          (gap > best_gap - 1e-9 && TieRank(d, n, layer) < TieRank(best, n, layer))) {
        best = d;
        best_gap = gap;
      }
    }
    return best;
  };
  const int64_t want = (copies - 1) * m;
  for (; given < want; ++given) ++extra[pick(true)];
  for (; given > want; --given) --extra[pick(false)];
  return extra;
}

// Copies 1 to copies - 1 of the layer's experts in id order ([k * (copies - 1) + j - 1] for
// copy j of the k-th), given `first`, the directory of each one's first copy: a smooth weighted
// round-robin with the extra counts as weights, each expert taking the copies - 1 directories
// with the most credit among those that do not hold it yet. A directory that needs every expert
// left whose first copy is elsewhere to reach its count takes the expert first; so every
// directory reaches its count, each expert's directories are distinct, and no directory's turns
// (nor the experts two directories share) bunch up in a run of ids.
std::vector<int> DealCopies(const std::vector<int>& first, const std::vector<int64_t>& extra,
                            int copies, int64_t layer) {
  const int n = static_cast<int>(extra.size());
  const int64_t m = static_cast<int64_t>(first.size());
  std::vector<int64_t> credit(n, 0), left = extra, room(n, m);
  for (int f : first) --room[f];  // experts still to deal whose first copy is not on d
  std::vector<int> picks;
  picks.reserve(m * (copies - 1));
  for (int64_t k = 0; k < m; ++k) {
    for (int d = 0; d < n; ++d) credit[d] += extra[d];
    std::vector<bool> holds(n, false);
    holds[first[k]] = true;
    std::vector<int> chosen;
    for (int d = 0; d < n; ++d) {
      if (!holds[d] && left[d] > 0 && left[d] == room[d]) {
        chosen.push_back(d);
        holds[d] = true;
      }
    }
    while (static_cast<int>(chosen.size()) < copies - 1) {
      int best = -1;
      for (int d = 0; d < n; ++d) {
        if (holds[d] || left[d] == 0) continue;
        if (best < 0 || credit[d] > credit[best] ||
            (credit[d] == credit[best] && TieRank(d, n, layer) < TieRank(best, n, layer))) {
          best = d;
        }
      }
      if (best < 0) break;  // cannot happen with counts from ExtraCounts; PlanStripes checks
      chosen.push_back(best);
      holds[best] = true;
    }
    chosen.resize(copies - 1, -1);
    for (int d : chosen) {
      if (d < 0) continue;
      credit[d] -= m;
      --left[d];
    }
    for (int d = 0; d < n; ++d) {
      if (d != first[k]) --room[d];
    }
    picks.insert(picks.end(), chosen.begin(), chosen.end());
  }
  return picks;
}

}  // namespace

std::vector<int> StripePlan::DirsOf(int64_t layer, int64_t e) const {
  const auto first = dir.begin() + (layer * num_experts + e) * copies;
  return std::vector<int>(first, first + copies);
}

bool StripePlan::Holds(int d, int64_t layer, int64_t e) const {
  if (layout == StripeLayout::kSlices) return DirOf(layer, e) >= 0;
  const auto first = dir.begin() + (layer * num_experts + e) * copies;
  return std::find(first, first + copies, d) != first + copies;
}

int64_t StripePlan::StripedExperts() const {
  int64_t n = 0;
  for (size_t i = 0; i < dir.size(); i += copies) n += dir[i] >= 0 ? 1 : 0;
  return n;
}

uint64_t StripePlan::DirectoryBytes(int d) const {
  uint64_t total = 0;
  for (const auto& layer : layer_bytes) total += layer[d];
  return total;
}

uint64_t StripePlan::TotalBytes() const {
  uint64_t total = 0;
  for (int d = 0; d < directories(); ++d) total += DirectoryBytes(d);
  return total;
}

absl::StatusOr<StripePlan> PlanStripes(const Checkpoint& ckpt, std::vector<double> weights,
                                       int copies, StripeLayout layout) {
  if (weights.empty() || weights.size() > static_cast<size_t>(kMaxStripeDirectories)) {
    return absl::InvalidArgumentError(absl::StrCat("stripes need 1 to ", kMaxStripeDirectories,
                                                   " directories, not ", weights.size()));
  }
  for (double w : weights) {
    if (!std::isfinite(w) || w <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stripe weight ", w, " is not a positive number"));
    }
  }
  const int n = static_cast<int>(weights.size());
  if (layout == StripeLayout::kSlices && copies != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stripe copies ", copies, ": a sliced layout has one copy (a piece on every directory)"));
  }
  if (copies < 1 || copies > n) {
    return absl::InvalidArgumentError(absl::StrCat("stripe copies ", copies, " is not in [1, ", n,
                                                   "] (distinct directories an expert)"));
  }
  const ModelConfig& c = ckpt.config();
  StripePlan plan;
  plan.weights = std::move(weights);
  plan.layout = layout;
  plan.copies = copies;
  plan.num_layers = c.num_layers;
  plan.num_experts = c.num_experts;
  plan.dir.assign(c.num_layers * c.num_experts * copies, -1);
  plan.layer_bytes.assign(c.num_layers, std::vector<uint64_t>(n, 0));
  const std::vector<double> targets = CopyTargets(plan.weights, copies);
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    std::vector<int64_t> ids;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      if (ckpt.expert(l, e).contiguous()) {
        ids.push_back(e);
      } else {
        ++plan.unstriped;
      }
    }
    if (layout == StripeLayout::kSlices) {
      for (int64_t e : ids) {
        plan.dir[l * c.num_experts + e] = 0;
        for (int d = 0; d < n; ++d) {
          plan.layer_bytes[l][d] += SliceOf(ckpt.expert(l, e).spans[0], plan.weights, d).length;
        }
      }
      continue;
    }
    const int64_t m = static_cast<int64_t>(ids.size());
    const std::vector<int64_t> counts = LayerCounts(m, plan.weights, l);
    const std::vector<int> picks = Deal(counts, l);
    std::vector<int> more;
    if (copies > 1) more = DealCopies(picks, ExtraCounts(m, counts, targets, copies, l), copies, l);
    for (int64_t k = 0; k < m; ++k) {
      int* slot = &plan.dir[(l * c.num_experts + ids[k]) * copies];
      slot[0] = picks[k];
      for (int j = 1; j < copies; ++j) slot[j] = more[k * (copies - 1) + j - 1];
      for (int j = 0; j < copies; ++j) {
        if (slot[j] < 0) {
          return absl::InternalError(absl::StrCat("stripe plan: no directory for copy ", j,
                                                  " of expert ", ids[k], " of layer ", l));
        }
        plan.layer_bytes[l][slot[j]] += ckpt.expert(l, ids[k]).total_bytes;
      }
    }
  }
  return plan;
}

ByteSpan SliceOf(const ByteSpan& span, const std::vector<double>& weights, int d) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  const uint64_t end = span.offset + span.length;
  // Cut k (0 < k < n) at the 4 KiB boundary nearest the span's offset plus the weights before k.
  auto cut = [&](int k) -> uint64_t {
    if (k <= 0) return span.offset;
    if (k >= static_cast<int>(weights.size())) return end;
    const double before = std::accumulate(weights.begin(), weights.begin() + k, 0.0);
    const double at =
        static_cast<double>(span.offset) + static_cast<double>(span.length) * before / total;
    const uint64_t aligned =
        static_cast<uint64_t>(std::llround(at / kStripeAlignment)) * kStripeAlignment;
    return std::clamp(aligned, span.offset, end);
  };
  // Cuts are monotonic in k (the weights are positive), so the pieces tile the span.
  const uint64_t begin = cut(d), stop = cut(d + 1);
  return {.shard = span.shard, .offset = begin, .length = stop - begin};
}

std::string_view StripeLayoutName(StripeLayout layout) {
  return layout == StripeLayout::kSlices ? "slices" : "experts";
}

absl::StatusOr<StripeLayout> ParseStripeLayout(std::string_view text) {
  if (text == "slices") return StripeLayout::kSlices;
  if (text == "experts") return StripeLayout::kExperts;
  return absl::InvalidArgumentError(
      absl::StrCat("stripe layout \"", std::string(text), "\" is not \"slices\" or \"experts\""));
}

std::vector<StripeShare> StripeShares(const StripePlan& plan) {
  const int n = plan.directories();
  const double weight_sum = std::accumulate(plan.weights.begin(), plan.weights.end(), 0.0);
  const std::vector<double> targets = CopyTargets(plan.weights, plan.copies);
  // The striped experts' bytes, one copy each.
  const double total = static_cast<double>(plan.TotalBytes()) / plan.copies;
  std::vector<StripeShare> shares(n);
  for (int d = 0; d < n; ++d) {
    StripeShare& s = shares[d];
    s.weight_share = plan.weights[d] / weight_sum;
    s.target = targets[d];
    s.bytes = plan.DirectoryBytes(d);
    s.share = total == 0 ? 0 : static_cast<double>(s.bytes) / total;
    for (int64_t l = 0; l < plan.num_layers; ++l) {
      const auto& bytes = plan.layer_bytes[l];
      const uint64_t layer_total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
      if (layer_total == 0) continue;
      const double share =
          static_cast<double>(bytes[d]) * plan.copies / static_cast<double>(layer_total);
      if (bytes[d] == 0) ++s.layers_without;
      if (s.min_layer < 0 || share < s.min_layer_share) s.min_layer_share = share, s.min_layer = l;
      if (s.max_layer < 0 || share > s.max_layer_share) s.max_layer_share = share, s.max_layer = l;
    }
  }
  return shares;
}

}  // namespace k3
