// The memory planner: splits the RAM budget the user gives (--ram-gb, a preset, or --trunk-gb
// with --cache-gb) into what must stay resident, the pinned trunk layers, the trunk streaming
// ring, the expert cache, sequence state and buffers (docs/MEMORY.md has the rule and why).
//
// The rule: fixed parts first (embedding and lm_head, routers, sequence state, buffers), then
// the smallest expert cache that can run a layer (top-k slots), then trunk layers pinned in
// layer order while they fit (with a ring of two slots for the layers left to stream), and
// everything left over goes to the expert cache. RAM goes to the trunk before the cache
// because a streamed trunk layer is re-read every token, while a cache GB only raises a hit
// rate that is flat over a wide range of sizes (docs/CACHE.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"

namespace k3 {

// What the user asked for; at most one of ram_gb, preset and (trunk_gb, cache_gb).
struct MemoryRequest {
  double ram_gb = 0;    // total budget in GB (1e9 bytes); 0 = not given
  std::string preset;   // ultra laptop desktop workstation server max auto; "" = not given
  double trunk_gb = 0;  // explicit split: pinned trunk + ring ...
  double cache_gb = 0;  // ... and expert cache (both or neither)
};

// The memory-relevant sizes of one checkpoint.
struct ModelFootprint {
  uint64_t globals_bytes = 0;         // embedding, lm_head, final norm and AttnRes
  uint64_t router_bytes = 0;          // every MoE layer's router (lookahead needs them all)
  std::vector<uint64_t> layer_bytes;  // per layer: its trunk tensors but the router, in RAM
  uint64_t expert_slot_bytes = 0;     // one expert's cache slot (bytes plus alignment)
  uint64_t all_experts_bytes = 0;     // every routed expert in slots
  int64_t experts_per_token = 0;      // top-k
  uint64_t state_bytes = 0;           // sequence state at the planned context length
  uint64_t buffer_bytes = 0;          // activations, logits, I/O bookkeeping
};

// `max_context` sizes the MLA latent cache; `prefill_chunk` the activation buffers.
ModelFootprint MeasureFootprint(const Checkpoint& ckpt, int64_t max_context, int64_t prefill_chunk);

struct MemoryPlan {
  std::string source;  // how the budget was chosen, e.g. "--ram-gb 12" or "preset laptop"
  uint64_t budget_bytes = 0;
  uint64_t minimum_bytes = 0;     // the smallest budget this model runs in
  uint64_t everything_bytes = 0;  // the budget that holds the whole model
  uint64_t globals_bytes = 0;
  uint64_t router_bytes = 0;
  uint64_t state_bytes = 0;
  uint64_t buffer_bytes = 0;
  std::vector<bool> pinned;  // per layer: resident (true) or streamed through the ring
  uint64_t pinned_trunk_bytes = 0;
  int ring_slots = 0;  // 0 when every layer is pinned
  uint64_t ring_slot_bytes = 0;
  uint64_t cache_bytes = 0;
  int64_t cache_slots = 0;

  int64_t streamed_layers() const;
  uint64_t planned_bytes() const;  // the sum of the parts (never above budget_bytes)
  // The plan as the lines printed at start.
  std::string Describe() const;
};

// Names of the presets, smallest first, and the fraction of the whole model each stands for
// (scaled from the budgets they mean for Kimi K3: laptop 16 GB, desktop 64 GB, workstation
// 192 GB, server 512 GB of a 1.56 TB model). "ultra" is the minimum, "max" everything, "auto"
// 70 % of the RAM the machine has available (capped at everything).
const std::vector<std::string>& MemoryPresetNames();

// InvalidArgument (exit 2) for a budget below the minimum (the message states the minimum),
// an unknown preset or conflicting requests. An empty request means preset auto.
// `available_ram_bytes` is what "auto" scales from (MemAvailable).
absl::StatusOr<MemoryPlan> PlanMemory(const ModelFootprint& footprint, const MemoryRequest& request,
                                      uint64_t available_ram_bytes);

// MemAvailable from /proc/meminfo (0 when unknown).
uint64_t AvailableRamBytes();

}  // namespace k3
