// Which rank owns each routed expert under expert parallelism (docs/SCALE-MPI.md): every
// (MoE layer, expert) belongs to one rank, each rank's share of a layer follows its weight, and
// every rank owns experts in every layer (when a layer has at least as many experts as there are
// ranks), so that each layer's exchange involves all of them and no rank idles for a layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace k3::ranks {

// What a rank brings: the bytes of experts its cache holds and the rate its disk reads at.
struct RankCapacity {
  uint64_t cache_bytes = 0;
  double disk_rate = 0;  // bytes per second; 0 = unknown
};

// The weight each rank's share follows: cache bytes when the ranks' caches together hold every
// expert (the run is then bound by nothing but compute and the exchange, and a rank holding more
// serves more without reading), else the disk rate (the run streams, and a faster disk reads a
// larger share in the same time). A rank with no figure for the chosen measure gets the mean of
// the others, or 1 when none has one.
std::vector<double> ShareWeights(const std::vector<RankCapacity>& ranks,
                                 uint64_t all_experts_bytes);

class ExpertPartition {
 public:
  ExpertPartition() = default;
  // `layers` layers of `experts` routed experts each (dense layers included: they own nothing
  // but cost nothing), shared by ranks of the given weights (positive).
  ExpertPartition(int64_t layers, int64_t experts, const std::vector<double>& weights);

  int ranks() const { return static_cast<int>(shares_.size()); }
  int owner(int64_t layer, int32_t expert) const {
    return owner_[static_cast<size_t>(layer * experts_ + expert)];
  }
  // Experts each rank owns per layer, averaged over the layers (so a fraction of a layer).
  const std::vector<double>& shares() const { return shares_; }
  // "rank 0 41.5 experts a layer (46%), rank 1 ..." for the plan.
  std::string Describe() const;

 private:
  int64_t experts_ = 0;
  std::vector<int> owner_;  // [layer * experts + expert]
  std::vector<double> shares_;
};

}  // namespace k3::ranks
