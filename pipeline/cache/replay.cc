#include "pipeline/cache/replay.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace k3 {

int64_t SimulatedSlots(uint64_t capacity_bytes, uint64_t expert_bytes) {
  return expert_bytes == 0 ? 0 : static_cast<int64_t>(capacity_bytes / expert_bytes);
}

absl::StatusOr<CacheStats> ReplayTrace(std::span<const ExpertKey> trace, std::string_view policy,
                                       const ReplayOptions& options) {
  const int64_t slots = SimulatedSlots(options.capacity_bytes, options.expert_bytes);
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a capacity of ", options.capacity_bytes,
                                                   " bytes holds no expert of ",
                                                   options.expert_bytes, " bytes"));
  }
  PolicyOptions popt{.capacity = slots, .num_layers = options.num_layers, .future = trace};
  absl::StatusOr<std::unique_ptr<ReplacementPolicy>> made = MakePolicy(policy, popt);
  if (!made.ok()) return made.status();
  ExpertCacheOptions copt{.budget_bytes = options.capacity_bytes,
                          .slot_bytes = options.expert_bytes,
                          .alignment = 1,
                          .allocate = false};
  absl::StatusOr<std::unique_ptr<ExpertCache>> cache = ExpertCache::Create(copt, *std::move(made));
  if (!cache.ok()) return cache.status();
  for (const ExpertKey& key : trace) {
    absl::StatusOr<CacheGrant> grant = (*cache)->Request(key);
    if (!grant.ok()) return grant.status();
    if (grant->outcome != CacheOutcome::kFill) continue;
    if (absl::Status s = (*cache)->MarkFilled(key); !s.ok()) return s;
  }
  return (*cache)->stats();
}

}  // namespace k3
