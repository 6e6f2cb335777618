// Picks the next token from logits: greedy, or temperature with top-k and top-p (nucleus),
// reproducible for a seed on every platform (the random stream is a fixed 64-bit generator,
// not a library distribution).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace k3 {

struct SamplerOptions {
  bool greedy = true;        // argmax, ties to the lower id; ignores the rest
  double temperature = 0.8;  // > 0 (0 means greedy)
  int top_k = 40;            // 0 = no limit
  double top_p = 0.95;       // (0, 1]
  uint64_t seed = 0;
};

// InvalidArgument naming the flag for out-of-range values.
absl::Status ValidateSamplerOptions(const SamplerOptions& options);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;  // the standard fixes its output sequence
};

int32_t ArgmaxToken(std::span<const float> logits);

}  // namespace k3
