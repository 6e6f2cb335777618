// Shared pieces of the policy implementations and their factories (policy.cc maps names to
// them). Not part of the cache's interface.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "pipeline/cache/expert_key.h"
#include "pipeline/cache/policy.h"

namespace k3::cache_internal {

// Request counts per key with ageing: every `period` requests all counts are halved, so old
// popularity fades (TinyLFU's reset). Exact counts rather than a count-min sketch: the key space
// is bounded (layers x experts, 82k for Kimi K3), so a table costs about a megabyte at most and
// has no collisions. Keys whose count halves to zero are dropped.
class FrequencyTable {
 public:
  explicit FrequencyTable(int64_t period) : period_(period < 1 ? 1 : period) {}

  // Counts one request; returns true when this request triggered an ageing step.
  bool Add(const ExpertKey& key) {
    ++counts_[key];
    if (++since_ageing_ < period_) return false;
    since_ageing_ = 0;
    for (auto it = counts_.begin(); it != counts_.end();) {
      it->second /= 2;
      if (it->second == 0) {
        counts_.erase(it++);
      } else {
        ++it;
      }
    }
    return true;
  }
  uint32_t Get(const ExpertKey& key) const {
    auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  int64_t period_;
  int64_t since_ageing_ = 0;
  absl::flat_hash_map<ExpertKey, uint32_t> counts_;
};

// Ageing period of the frequency-based policies: ten requests per slot, TinyLFU's sample size.
inline int64_t AgeingPeriod(const PolicyOptions& options) { return 10 * options.capacity; }

std::unique_ptr<ReplacementPolicy> MakeLru(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeFifo(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeMru(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeBelady(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLfu(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeWTinyLfu(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeArc(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeTwoQ(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeS3Fifo(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLirs(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLayerMru(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLayerLfu(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLayerFreq(const PolicyOptions& options);
std::unique_ptr<ReplacementPolicy> MakeLayerReuse(const PolicyOptions& options);

}  // namespace k3::cache_internal
