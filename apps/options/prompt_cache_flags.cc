#include "apps/options/prompt_cache_flags.h"

#include <chrono>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"

namespace k3::cli {

std::string PromptCacheDirFromFlags(bool serve) {
  const std::string dir = absl::GetFlag(FLAGS_prompt_cache);
  if (dir == "none") return "";
  if (dir.empty() && serve) return UserCacheDir() + "/prompt-cache";
  return dir;
}

absl::StatusOr<std::unique_ptr<PromptCache>> PromptCacheFromFlags(const Engine& engine,
                                                                  std::string_view command,
                                                                  size_t memory_states) {
  const std::string dir = PromptCacheDirFromFlags(command == "serve");
  if (dir.empty() && memory_states == 0) return nullptr;
  const double gb = absl::GetFlag(FLAGS_prompt_cache_gb);
  if (!(gb > 0)) return absl::InvalidArgumentError("--prompt-cache-gb must be > 0");
  auto fingerprint = PromptCacheFingerprint(engine.checkpoint());
  if (!fingerprint.ok()) return fingerprint.status();
  const std::string name(command);
  auto cache = PromptCache::Open(
      engine.config(), *std::move(fingerprint),
      {.dir = dir, .max_bytes = static_cast<uint64_t>(gb * 1e9), .memory_states = memory_states},
      [name](std::string_view warning) {
        std::fprintf(stderr, "k3 %s: %.*s\n", name.c_str(), static_cast<int>(warning.size()),
                     warning.data());
      });
  if (!cache.ok()) {
    return absl::Status(cache.status().code(),
                        absl::StrCat("--prompt-cache ", dir, ": ", cache.status().message()));
  }
  return *std::move(cache);
}

nlohmann::json PromptCacheUse::ToJson(const PromptCache& cache) const {
  const PromptCacheStats s = cache.stats();
  return {{"directory", cache.directory()},
          {"cached_tokens", cached_tokens},
          {"load_seconds", load_seconds},
          {"disk_bytes", cache.disk_bytes()},
          {"memory_hits", s.memory_hits},
          {"disk_hits", s.disk_hits},
          {"misses", s.misses},
          {"damaged", s.damaged},
          {"stored", s.stored},
          {"store_failures", s.store_failures},
          {"evicted", s.evicted},
          {"bytes_read", s.bytes_read},
          {"bytes_written", s.bytes_written}};
}

PromptCacheUse UsePromptCache(PromptCache& cache, BatchRequest& request, BatchEvents& events) {
  PromptCacheUse use;
  const auto t0 = std::chrono::steady_clock::now();
  use.cached_tokens = ResumeFromPromptCache(cache, request);
  use.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  events.on_prompt_state = [&cache](size_t, const SequenceState& state) { cache.Store(state); };
  return use;
}

}  // namespace k3::cli
