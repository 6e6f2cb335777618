#include "pipeline/step_metrics.h"

namespace k3 {

void StepMetrics::Add(const StepMetrics& o) {
  tokens += o.tokens;
  seconds += o.seconds;
  io_wait_seconds += o.io_wait_seconds;
  trunk_wait_seconds += o.trunk_wait_seconds;
  trunk_decode_seconds += o.trunk_decode_seconds;
  trunk_pieces_decoded_fused += o.trunk_pieces_decoded_fused;
  trunk_pieces_decoded_whole += o.trunk_pieces_decoded_whole;
  disk_busy_seconds += o.disk_busy_seconds;
  expert_demand_bytes += o.expert_demand_bytes;
  expert_prefetch_used_bytes += o.expert_prefetch_used_bytes;
  expert_prefetch_wasted_bytes += o.expert_prefetch_wasted_bytes;
  trunk_bytes += o.trunk_bytes;
  trunk_pieces_out_of_order += o.trunk_pieces_out_of_order;
  experts_demand_read += o.experts_demand_read;
  cache_requests += o.cache_requests;
  cache_hits += o.cache_hits;
  prefetch_predicted += o.prefetch_predicted;
  prefetch_correct += o.prefetch_correct;
  routed_experts += o.routed_experts;
  fetch_seconds += o.fetch_seconds;
  lookahead_seconds += o.lookahead_seconds;
  expert_compute_seconds += o.expert_compute_seconds;
  exchange_bytes += o.exchange_bytes;
  exchange_wait_seconds += o.exchange_wait_seconds;
}

double StepMetrics::hit_rate() const {
  return cache_requests ? static_cast<double>(cache_hits) / cache_requests : 0;
}
double StepMetrics::prefetch_precision() const {
  return prefetch_predicted ? static_cast<double>(prefetch_correct) / prefetch_predicted : 0;
}
double StepMetrics::prefetch_recall() const {
  return routed_experts ? static_cast<double>(prefetch_correct) / routed_experts : 0;
}

nlohmann::json StepMetrics::ToJson() const {
  return {{"tokens", tokens},
          {"seconds", seconds},
          {"io_wait_seconds", io_wait_seconds},
          {"trunk_wait_seconds", trunk_wait_seconds},
          {"trunk_decode_seconds", trunk_decode_seconds},
          {"trunk_pieces_decoded",
           {{"fused", trunk_pieces_decoded_fused}, {"whole", trunk_pieces_decoded_whole}}},
          {"disk_busy_fraction", seconds > 0 ? disk_busy_seconds / seconds : 0},
          {"bytes_read",
           {{"expert_demand", expert_demand_bytes},
            {"expert_prefetch_used", expert_prefetch_used_bytes},
            {"expert_prefetch_wasted", expert_prefetch_wasted_bytes},
            {"trunk", trunk_bytes}}},
          {"trunk_pieces_out_of_order", trunk_pieces_out_of_order},
          {"experts_demand_read", experts_demand_read},
          {"time",
           {{"fetch_seconds", fetch_seconds},
            {"lookahead_seconds", lookahead_seconds},
            {"expert_compute_seconds", expert_compute_seconds},
            {"exchange_wait_seconds", exchange_wait_seconds}}},
          {"exchange_bytes", exchange_bytes},
          {"cache", {{"requests", cache_requests}, {"hits", cache_hits}, {"hit_rate", hit_rate()}}},
          {"prefetch",
           {{"predicted", prefetch_predicted},
            {"correct", prefetch_correct},
            {"precision", prefetch_precision()},
            {"recall", prefetch_recall()}}}};
}

}  // namespace k3
