#include "pipeline/memory_plan_json.h"

namespace k3 {

nlohmann::json MemoryPlanJson(const MemoryPlan& p) {
  const int64_t layers = static_cast<int64_t>(p.pinned.size());
  return {{"source", p.source},
          {"sequences", p.sequences},
          {"budget_bytes", p.budget_bytes},
          {"minimum_bytes", p.minimum_bytes},
          {"planned_bytes", p.planned_bytes()},
          {"trunk_pinned_bytes", p.pinned_trunk_bytes},
          {"trunk_ring_bytes", p.ring_bytes()},
          {"cache_bytes", p.cache_bytes},
          {"cache_slots", p.cache_slots},
          {"state_bytes", p.state_bytes},
          {"buffer_bytes", p.buffer_bytes},
          {"vector_bytes", p.vector_bytes},
          {"embedding_bytes", p.embedding_bytes},
          {"lm_head_bytes", p.lm_head_bytes},
          {"router_bytes", p.router_bytes},
          {"embedding_resident", p.embedding_resident},
          {"lm_head_resident", p.lm_head_resident},
          {"routers_resident", p.routers_resident},
          {"pinned_layers", layers - p.streamed_layers()},
          {"streamed_layers", p.streamed_layers()}};
}

}  // namespace k3
