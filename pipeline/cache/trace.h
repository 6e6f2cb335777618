// Expert request traces: the routed (layer, expert) requests of a run, in order, stored as
// little-endian int32 pairs (the format of ../traces/kimi-k3-expert-trace.bin).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/cache/expert_key.h"

namespace k3 {

// NotFound when the file does not exist; InvalidArgument, naming the file, when it is empty,
// its size is not a multiple of 8 bytes, or a request has a negative id.
absl::StatusOr<std::vector<ExpertKey>> ReadExpertTrace(const std::string& path);

// The same checks on bytes already in memory; `name` goes into the error messages.
absl::StatusOr<std::vector<ExpertKey>> ParseExpertTrace(std::string_view bytes,
                                                        std::string_view name);

// The bytes of a trace (for tests and tools that write one).
std::string EncodeExpertTrace(const std::vector<ExpertKey>& trace);

}  // namespace k3
