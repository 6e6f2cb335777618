// The config reader on arbitrary config.json text (both the release and the flat form). A
// config it accepts must survive the round trips that `k3 synth` and the state files rely on:
// written flat or nested and read back, it is the same model (same fingerprint).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/checkpoint/config.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = k3::ParseModelConfigText(text, "config.json");
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string fingerprint = config->Fingerprint();
  (void)config->expert_bytes();
  if (config->layer_kinds.size() != static_cast<size_t>(config->num_layers)) std::abort();
  auto flat = k3::ParseModelConfig(k3::ToFlatConfigJson(*config), "flat");
  if (!flat.ok() || flat->Fingerprint() != fingerprint) std::abort();
  auto nested = k3::ParseModelConfig(k3::ToReleaseConfigJson(*config), "nested");
  if (!nested.ok() || nested->Fingerprint() != fingerprint) std::abort();
  return 0;
}
