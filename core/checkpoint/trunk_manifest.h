// The trunk pack's manifest (trunk.json): writing it and parsing it without a checkpoint.
// Internal to core/checkpoint/trunk_pack.cc and core/checkpoint/trunk_codec.cc; the format is in docs/PACK.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/config.h"
#include "core/checkpoint/trunk_pack.h"

namespace k3 {

// "globals" or "layer N", as messages name a run.
std::string LayerText(int64_t layer);
// The manifest of a pack with these runs; `codec` "" for a verbatim pack (version 1).
std::string ManifestText(const ModelConfig& config, const std::vector<PackedRun>& runs,
                         uint64_t pack_bytes, const std::string& codec);

}  // namespace k3
