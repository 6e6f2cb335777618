// What `k3 generate` (one prompt or --prompts), `k3 chat` and `k3 serve` share: the sampler
// flags, the tokenizer lookup and the default stop ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/options/flags.h"
#include "core/checkpoint/config.h"
#include "core/model/sampler.h"
#include "core/text/tokenizer/tokenizer.h"
#include "pipeline/engine.h"

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
