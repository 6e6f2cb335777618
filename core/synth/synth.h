// Random-weight checkpoints in the exact release layout (MODEL.md section 3, DESIGN.md
// section 6): nested config.json, sharded safetensors with an index, MXFP4 experts with their
// six tensors adjacent, and a small tokenizer. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/config.h"
#include "kernels/bf16_stats.h"

namespace k3 {

// The config of a preset: "tiny", "demo", "bench", "slice" (Kimi K3's dimensions for every
// tensor in 6 layers of 128 experts, ~19 GB), or "full" (Kimi K3's own text config, MODEL.md
// 1.2, written in the release's file layout with placeholders for its vision tower).
absl::StatusOr<ModelConfig> SynthPresetConfig(std::string_view preset);

// Float storage: as released (BF16 matrices, F32 for conv, A_log, dt_bias, o_norm and router
// bias, BF16 for the other vectors), or every float tensor F16, or every one F32.
enum class SynthFloats { kRelease, kF16, kF32 };

// How the weight matrices (and the embedding) are drawn. Uniform in [-a, a) has an exponent
// field of ~2.0-2.3 bits of entropy; Gaussian of the same RMS gives ~2.55 per tensor and ~2.6
// over a model, as trained weights do, so that byte-level compression measures what it would on
// a real checkpoint. The default is Gaussian for slice and full and uniform for tiny, demo and
// bench, whose bytes tests pin (golden tokens).
enum class SynthWeights { kPresetDefault, kUniform, kGaussian };

struct SynthOptions {
  std::string preset = "tiny";
  std::string out_dir;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> overrides;  // --set key=value
  // Per-layer expert popularity: router bias b_e = router_skew * z_e with z_e a fixed random
  // normal per (layer, expert). 0 routes uniformly; ~1 gives a trace-like skew.
  double router_skew = 0.0;
  SynthFloats floats = SynthFloats::kRelease;
  SynthWeights weights = SynthWeights::kPresetDefault;
  bool show_progress = false;
  // Headers only: the tensor data is left as holes in the files (nothing written), which read
  // as zeros, so `full` is 1.56 TB apparent and ~140 MB on disk. Zero E8M0 scales are legal
  // (2^-127), zero weights too: it tests opening, planning, RSS and the compute path at real
  // dimensions, not arithmetic and not disk speed.
  bool sparse = false;
  // The language model in one model.safetensors without an index, instead of shards.
  bool single_file = false;
};

struct SynthResult {
  ModelConfig config;
  uint64_t bytes_written = 0;  // tensor data, holes included
  double seconds = 0;
  int shards = 0;
  int64_t language_tensors = 0;
  int64_t other_tensors = 0;                      // the full preset's vision placeholders
  SynthWeights weights = SynthWeights::kUniform;  // as drawn
  // The exponent fields of every BF16 value written (none when sparse), and the mean of the
  // per-tensor entropies weighted by size: the figure a per-tensor or per-block coder sees.
  ExponentHistogram bf16_exponents{};
  double bf16_tensor_entropy_bits = 0;
};

absl::StatusOr<SynthResult> Synthesize(const SynthOptions& options);

}  // namespace k3
