// Random-weight checkpoints in the exact release layout (MODEL.md section 3, DESIGN.md
// section 6): nested config.json, sharded safetensors with an index, MXFP4 experts with their
// six tensors adjacent, and a small tokenizer. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config.h"

namespace k3 {

// The config of a preset: "tiny", "demo" or "bench".
absl::StatusOr<ModelConfig> SynthPresetConfig(std::string_view preset);

// Float storage: as released (BF16 matrices, F32 for conv, A_log, dt_bias, o_norm and router
// bias, BF16 for the other vectors), or every float tensor F16, or every one F32.
enum class SynthFloats { kRelease, kF16, kF32 };

struct SynthOptions {
  std::string preset = "tiny";
  std::string out_dir;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> overrides;  // --set key=value
  // Per-layer expert popularity: router bias b_e = router_skew * z_e with z_e a fixed random
  // normal per (layer, expert). 0 routes uniformly; ~1 gives a trace-like skew.
  double router_skew = 0.0;
  SynthFloats floats = SynthFloats::kRelease;
  bool show_progress = false;
};

struct SynthResult {
  ModelConfig config;
  uint64_t bytes_written = 0;
  double seconds = 0;
  int shards = 0;
};

absl::StatusOr<SynthResult> Synthesize(const SynthOptions& options);

}  // namespace k3
