#include "pipeline/expert_reads.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/checkpoint/stripe.h"
#include "pipeline/cache/policy.h"

namespace k3 {

absl::StatusOr<ExpertReads> OpenExpertReads(const Checkpoint& ckpt, const EngineOptions& options,
                                            const RunPlan& run) {
  const uint64_t cache_bytes = run.memory.cache_bytes, slot_bytes = run.expert_slot_bytes;
  const int64_t cache_slots = run.memory.cache_slots;
  ExpertReads out;
  out.cache_bytes = cache_bytes;
  auto policy = MakePolicy(
      options.cache_policy.empty() ? kDefaultPolicy : options.cache_policy,
      {.capacity = cache_slots, .num_layers = static_cast<int32_t>(ckpt.config().num_layers)});
  if (!policy.ok()) return policy.status();
  auto created = ExpertCache::Create({.budget_bytes = cache_bytes, .slot_bytes = slot_bytes},
                                     *std::move(policy));
  if (!created.ok()) return created.status();
  out.cache = *std::move(created);
  io::ReadRouterOptions io_options;
  io_options.engine.queue_depth = options.queue_depth;
  io_options.engine.direct = options.direct_io;
  io_options.engine.profile = options.storage_profile;
  io_options.engine.arena = out.cache->arena();
  io_options.engine.faults = options.faults;
  io_options.check = options.verify_volumes ? io::CopyCheck::kFull : io::CopyCheck::kSampled;
  io_options.volumes = options.volumes;
  auto reads = io::ReadRouter::Create(io_options);
  if (!reads.ok()) return reads.status();
  out.reads = *std::move(reads);
  // The pieces of a striped layout (k3 stripe) in the volumes, by the shard they belong to.
  std::vector<std::string> dirs;
  for (const io::Volume& v : options.volumes) dirs.push_back(v.dir);
  auto striped = options.verify_volumes ? VerifyStripes(ckpt, dirs) : absl::OkStatus();
  if (!striped.ok()) return striped;
  auto pieces = LoadStripes(ckpt, dirs);
  if (!pieces.ok()) return pieces.status();
  absl::flat_hash_map<std::string, std::vector<io::Extent>> stripes;
  for (const StripeExtent& e : *pieces) {
    stripes[e.shard].push_back(
        {.offset = e.offset, .length = e.length, .path = e.path, .at = e.at});
  }
  for (const std::string& path : ckpt.shard_paths()) {
    auto id = out.reads->OpenFile(path, stripes[path.substr(path.rfind('/') + 1)]);
    if (!id.ok()) return id.status();
    out.shard_files.push_back(*id);
  }
  return out;
}

void StreamExperts(ExpertReads& side, const Checkpoint& ckpt, const TrunkWeights& routers,
                   BusyClock& disk, const EngineOptions& options) {
  ExpertStreamOptions& stream = side.stream;
  stream.overlap = options.overlap;
  stream.prefetch_distance = options.prefetch_distance;
  stream.prefill_prefetch_distance = options.prefill_prefetch_distance;
  stream.prefetch_width = options.prefetch_width > 0
                              ? options.prefetch_width
                              : static_cast<int>(ckpt.config().num_experts_per_token);
  stream.prefetch_cap_bytes =
      static_cast<uint64_t>(options.prefetch_cap_fraction * static_cast<double>(side.cache_bytes));
  side.provider = std::make_unique<StreamingExpertProvider>(ckpt, routers, *side.cache, *side.reads,
                                                            side.shard_files, disk, stream);
}

}  // namespace k3
