// Trace replay: runs a recorded request sequence through the real ExpertCache (bookkeeping
// only, no memory) under a policy, for `k3 cache-sim`, the tests and the policy comparison in
// docs/CACHE.md.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipeline/cache/expert_cache.h"
#include "pipeline/cache/expert_key.h"

namespace k3 {

// Expert size of Kimi K3: three MXFP4 matrices 3072x3584 and 3584x3072 with their scales.
inline constexpr uint64_t kKimiK3ExpertBytes = 17'547'264;

// Slots a cache of `capacity_bytes` holds in the simulator: floor(capacity / expert bytes), no
// alignment padding (the convention of the published replay numbers: 8 GB = 455 slots of
// Kimi K3's experts; that size is a multiple of 4 KiB, so the engine's cache holds as many).
int64_t SimulatedSlots(uint64_t capacity_bytes, uint64_t expert_bytes);

struct ReplayOptions {
  uint64_t capacity_bytes = 0;
  uint64_t expert_bytes = kKimiK3ExpertBytes;
  int32_t num_layers = 0;  // 0: layer-aware policies infer the pass length from the trace
};

// Replays `trace` (every request a demand request, every miss filled at once). InvalidArgument
// for an unknown policy or a capacity below one expert.
absl::StatusOr<CacheStats> ReplayTrace(std::span<const ExpertKey> trace, std::string_view policy,
                                       const ReplayOptions& options);

}  // namespace k3
