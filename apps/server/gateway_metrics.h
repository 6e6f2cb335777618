// The gauges an inference gateway routes by (the Gateway API Inference Extension's endpoint
// picker, llm-d on top of it): its model-server protocol asks for vLLM's names and meanings, so
// /metrics carries them beside k3's own names for the same figures. docs/SCALE.md says what
// each means for k3, whose "KV cache" is the batch's sequence states.
#pragma once

#include <cstdint>
#include <string>

#include "apps/server/generation_service.h"

namespace k3::server {

// The nominal block of the prefix-cache info: k3 resumes a saved state at any token, so the
// figure only sets how finely the picker hashes prompts and counts the cache's capacity.
inline constexpr int64_t kPrefixBlockTokens = 64;

// The fraction of the batch's state memory the live sequences' states hold, in [0, 1].
double StateMemoryUsage(const ServiceStats& stats);

// What vllm:kv_cache_usage_perc says, in [0, 1]: the larger of the places in use over the
// places and StateMemoryUsage. The gateway's KV scorer reads it as how full the pod is, and
// a state planned at a long context fills slowly: a batch with every place taken by short
// requests is full, whatever the bytes say.
double PodUsage(const ServiceStats& stats);

// Prometheus text: vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc, vllm:cache_config_info, and k3's names for the state memory.
std::string GatewayMetrics(const ServiceStats& stats);

}  // namespace k3::server
