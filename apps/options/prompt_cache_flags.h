// The prompt cache of generate, chat and serve from the flags: --prompt-cache DIR (serve keeps
// one in the user's cache directory unless told otherwise) and --prompt-cache-gb.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "pipeline/batch_scheduler.h"
#include "pipeline/engine.h"
#include "pipeline/prompt_cache.h"

namespace k3::cli {

// The directory --prompt-cache names for this command: the flag's value, "" when it is "none"
// or not given (but for serve: <user cache dir>/prompt-cache, as the default).
std::string PromptCacheDirFromFlags(bool serve);

// The prompt cache the flags ask for, with `memory_states` states kept in memory too (memory
// only without a directory); null when there is neither. A directory that cannot be made, or a bad
// --prompt-cache-gb, is an error naming it. Warnings (a damaged file, a failed write) go to stderr
// prefixed with the command's name.
absl::StatusOr<std::unique_ptr<PromptCache>> PromptCacheFromFlags(const Engine& engine,
                                                                  std::string_view command,
                                                                  size_t memory_states);

// What the cache did for one prompt.
struct PromptCacheUse {
  int64_t cached_tokens = 0;  // of the prompt, resumed rather than run
  double load_seconds = 0;    // looking up and reading the state
  nlohmann::json ToJson(const PromptCache& cache) const;
};

// Prepares `request` (whose prompt is the whole prompt) to use `cache`: resumes the longest
// cached prefix, leaving the tokens after it to run, and asks for the state one token short of
// the prompt's end, where the same prompt again resumes. `events.on_prompt_state` stores it.
PromptCacheUse UsePromptCache(PromptCache& cache, BatchRequest& request, BatchEvents& events);

}  // namespace k3::cli
