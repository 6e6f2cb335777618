// The flags that set up the engine (memory, I/O, prefetch, threads), shared by generate, chat
// and bench, and the built-in demo model they fall back on without --model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "pipeline/engine.h"

ABSL_DECLARE_FLAG(double, ram_gb);
ABSL_DECLARE_FLAG(double, trunk_gb);
ABSL_DECLARE_FLAG(double, cache_gb);
ABSL_DECLARE_FLAG(std::string, trunk);
ABSL_DECLARE_FLAG(std::vector<std::string>, prefetch_distance);
ABSL_DECLARE_FLAG(int32_t, prefetch_width);
ABSL_DECLARE_FLAG(int32_t, prefill_prefetch_distance);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(int32_t, prefill_chunk);
ABSL_DECLARE_FLAG(int32_t, max_context);
ABSL_DECLARE_FLAG(double, ring_piece_mb);
ABSL_DECLARE_FLAG(int32_t, ring_slots);
ABSL_DECLARE_FLAG(std::string, cache_policy);
ABSL_DECLARE_FLAG(bool, no_overlap);

namespace k3::cli {

// The flag names (as typed) that EngineOptionsFromFlags reads, to list in a Subcommand.
const std::vector<std::string_view>& EngineFlagNames();

// Engine options from the flags, for a command that runs one configuration: --queue-depth,
// --prefetch-distance and --storage-profile must then hold one value each. The model directory
// is --model or the demo model (synthesised on first use). InvalidArgument names the flag.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags();

// Every engine setting but the model directory and the ones k3 bench sweeps (queue depth,
// prefetch distance, storage profile), read and checked; K3_FAULTS applied.
absl::StatusOr<EngineOptions> BaseEngineOptionsFromFlags();

// --model, or the built-in demo checkpoint, synthesised once into the user's cache directory
// ($XDG_CACHE_HOME/k3/demo-model or ~/.cache/k3/demo-model) with a progress bar.
absl::StatusOr<std::string> ModelDirFromFlags();

// Parses a list flag of non-negative integers ("--queue-depth 1,4,16"): InvalidArgument naming
// `flag` for anything else, or for a value outside [min, max].
absl::StatusOr<std::vector<int>> ParseIntList(std::string_view flag,
                                              const std::vector<std::string>& values, int min,
                                              int max);

}  // namespace k3::cli
