// The expert cache and the read router over the checkpoint's shards (and its volumes and
// stripes), as the engine opens them, and as a rank of expert parallelism opens them for the
// experts it owns (pipeline/ranks/worker.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "io/read_router.h"
#include "pipeline/cache/expert_cache.h"
#include "pipeline/engine_options.h"

namespace k3 {

struct ExpertReads {
  std::unique_ptr<ExpertCache> cache;
  std::unique_ptr<io::ReadRouter> reads;  // lands in the cache's arena: goes before it
  std::vector<io::FileId> shard_files;    // the checkpoint's shards, in shard order
};

// A cache of `cache_bytes` in `cache_slots` slots of `slot_bytes` under the options' policy, and
// the read router with the options' queue depth, profile, volumes and stripes, every shard open.
absl::StatusOr<ExpertReads> OpenExpertReads(const Checkpoint& ckpt, const EngineOptions& options,
                                            uint64_t cache_bytes, int64_t cache_slots,
                                            uint64_t slot_bytes);

}  // namespace k3
