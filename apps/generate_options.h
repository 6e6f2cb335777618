// What `k3 generate` and its batch mode (--prompts) share: the sampler and stop flags, the
// tokenizer lookup, and the default stop ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/sampler.h"
#include "core/tokenizer/tokenizer.h"
#include "pipeline/engine.h"

ABSL_DECLARE_FLAG(int32_t, n_predict);
ABSL_DECLARE_FLAG(bool, greedy);
ABSL_DECLARE_FLAG(double, temp);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_id);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(std::string, tokenizer);

namespace k3::cli {

// The sampler the flags ask for (greedy unless --temp), checked.
absl::StatusOr<SamplerOptions> ReadSampler();

// The tokenizer of --tokenizer or the model's directory; nullopt when there is none and
// `required` is false (prompts as ids), NotFound naming the file when it is required.
absl::StatusOr<std::optional<Tokenizer>> FindTokenizer(const std::string& model_dir, bool required);

// --stop-id, or none with --ignore-eos, or by default [EOS] and <|end_of_msg|> (MODEL.md 0 Q12).
absl::StatusOr<std::vector<int32_t>> StopIds(const ModelConfig& config,
                                             const std::optional<Tokenizer>& tokenizer);

}  // namespace k3::cli
