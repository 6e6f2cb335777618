// The expert side of a run: the expert cache, the read router over the checkpoint's shards (and
// its volumes and stripes) and the streaming provider over them, as the engine opens it and as
// a rank of expert parallelism opens it for the experts it owns (pipeline/ranks/worker.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "core/model/weights.h"
#include "io/read_router.h"
#include "pipeline/busy_clock.h"
#include "pipeline/cache/expert_cache.h"
#include "pipeline/engine_options.h"
#include "pipeline/expert_stream.h"
#include "pipeline/run_plan.h"

namespace k3 {

struct ExpertReads {
  ExpertReads() = default;
  ExpertReads(ExpertReads&&) = default;
  ExpertReads& operator=(ExpertReads&&) = default;
  // The provider first (it waits for its reads), then the reads, then the cache they land in.
  ~ExpertReads() {
    provider.reset();
    reads.reset();
  }

  uint64_t cache_bytes = 0;  // the plan's
  std::unique_ptr<ExpertCache> cache;
  std::unique_ptr<io::ReadRouter> reads;              // lands in the cache's arena: goes before it
  std::vector<io::FileId> shard_files;                // the checkpoint's shards, in shard order
  ExpertStreamOptions stream;                         // set by StreamExperts
  std::unique_ptr<StreamingExpertProvider> provider;  // once StreamExperts ran
};

// The cache the plan sizes under the options' policy, and the read router with the options'
// queue depth, profile, volumes and stripes, every shard open.
absl::StatusOr<ExpertReads> OpenExpertReads(const Checkpoint& ckpt, const EngineOptions& options,
                                            const RunPlan& run);

// The provider streaming experts through `side`'s cache and reads, with the options' overlap and
// lookahead; `routers` holds every layer's router for the lookahead's predictions (a rank other
// than 0 predicts nothing: rank 0 sends it its guesses). `disk` is told about every read.
void StreamExperts(ExpertReads& side, const Checkpoint& ckpt, const TrunkWeights& routers,
                   BusyClock& disk, const EngineOptions& options);

}  // namespace k3
