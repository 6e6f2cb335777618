#include "apps/server/gateway_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace k3::server {

namespace {

double Portion(double part, double whole) {
  return whole > 0 ? std::clamp(part / whole, 0.0, 1.0) : 0.0;
}

}  // namespace

double StateMemoryUsage(const ServiceStats& stats) {
  return Portion(static_cast<double>(stats.live_state_bytes),
                 static_cast<double>(stats.state_bytes_capacity));
}

double PodUsage(const ServiceStats& stats) {
  return std::max(Portion(static_cast<double>(stats.live), static_cast<double>(stats.places)),
                  StateMemoryUsage(stats));
}

std::string GatewayMetrics(const ServiceStats& stats) {
  std::string out;
  auto gauge = [&](const char* name, const char* help, auto value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ",
                    value, "\n");
  };
  gauge("vllm:num_requests_waiting",
        "Requests waiting for a place in the batch (k3_queue_length), for the gateway.",
        stats.queued);
  gauge("vllm:num_requests_running", "Sequences in the batch (k3_live_sequences), for the gateway.",
        stats.live);
  gauge("vllm:kv_cache_usage_perc",
        "How full the batch is, 0 to 1, for the gateway: the larger of its places in use "
        "(k3_live_sequences over k3_batch_places) and its state memory in use "
        "(k3_state_memory_usage).",
        PodUsage(stats));
  // An info gauge: the labels are the figures. The capacity counts every state the plan
  // reserves (the batch's and the saved ones) at the planned context, in nominal blocks.
  const int64_t tokens = stats.planned_states * stats.context;
  absl::StrAppend(&out,
                  "# HELP vllm:cache_config_info The prefix cache's shape for the gateway's "
                  "prefix scorer: nominal blocks of block_size tokens.\n"
                  "# TYPE vllm:cache_config_info gauge\n"
                  "vllm:cache_config_info{block_size=\"",
                  kPrefixBlockTokens, "\",num_gpu_blocks=\"",
                  (tokens + kPrefixBlockTokens - 1) / kPrefixBlockTokens,
                  "\",enable_prefix_caching=\"", stats.prefix_cache ? "True" : "False",
                  "\",cache_dtype=\"fp32\"} 1\n");
  gauge("k3_batch_places", "Sequences the batch runs at once (--batch).", stats.places);
  gauge("k3_state_memory_usage",
        "The live sequences' state bytes over the batch's planned state bytes, 0 to 1.",
        StateMemoryUsage(stats));
  absl::StrAppend(&out,
                  "# HELP k3_state_bytes Sequence state: held by the live sequences now, and "
                  "planned for the batch's places.\n# TYPE k3_state_bytes gauge\n",
                  "k3_state_bytes{kind=\"live\"} ", stats.live_state_bytes, "\n",
                  "k3_state_bytes{kind=\"capacity\"} ", stats.state_bytes_capacity, "\n");
  gauge("k3_draining", "1 once SIGTERM came: no new requests, those in flight finish.",
        stats.draining ? 1 : 0);
  return out;
}

}  // namespace k3::server
