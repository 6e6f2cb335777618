// Settings files: what `k3 tune` recommends, written as flags, and read back by every command
// that runs the engine (`--settings FILE`: generate, chat, bench, serve). A flag given on the
// command line wins over the file; the file wins over the defaults.
//
//   {"k3_settings": 1, "model": "...", "tuned": "2026-12-02T06:40:00Z",
//    "flags": {"queue-depth": "16", "prefetch-distance": "1", "threads": "2"},
//    "profiles": {"direct": {"flags": {...}}, "network": {"flags": {...}}}}
//
// "profiles" is optional: when the command's --storage-profile (or "direct") has an entry, its
// flags are used; otherwise "flags".
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "apps/options/flags.h"
#include "nlohmann/json.hpp"

namespace k3::cli {

inline constexpr int kSettingsVersion = 1;

// The flags a settings file may set: the engine settings that change speed, never the tokens.
bool SettableFromSettingsFile(std::string_view typed_flag);

// Applies `path` to the flags for which `applies(typed_name)` holds (the subcommand accepts it
// and the command line did not give it). InvalidArgument names the file and the key for an
// unreadable file, another version, a flag that cannot be set from a file or a bad value.
absl::Status ApplySettingsFile(const std::string& path,
                               const std::function<bool(std::string_view)>& applies);

// The JSON of a settings file with `flags` (typed name -> value), plus `extra` members.
nlohmann::json SettingsJson(const std::map<std::string, std::string>& flags,
                            const nlohmann::json& extra);

}  // namespace k3::cli
