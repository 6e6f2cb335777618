// The memory plan as JSON, one key set wherever k3 shows it: the run report's memory_plan
// (--report-json) and the plan event of GET /k3/events (docs/EVENTS.md).
#pragma once

#include "nlohmann/json.hpp"
#include "pipeline/memory_plan.h"

namespace k3 {

// {"source", "sequences", "budget_bytes", "minimum_bytes", "planned_bytes",
//  "trunk_pinned_bytes", "trunk_ring_bytes", "cache_bytes", "cache_slots", "state_bytes",
//  "buffer_bytes", "vector_bytes", "embedding_bytes", "lm_head_bytes", "router_bytes",
//  "embedding_resident", "lm_head_resident", "routers_resident", "pinned_layers",
//  "streamed_layers"}: sizes in bytes, the parts named as the printed plan names them.
nlohmann::json MemoryPlanJson(const MemoryPlan& plan);

}  // namespace k3
