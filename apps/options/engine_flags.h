// The flags that set up the engine (memory, I/O, prefetch, threads), shared by generate, chat
// and bench, and the built-in demo model they fall back on without --model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/options/flags.h"
#include "io/storage_profile.h"
#include "io/volume.h"
#include "pipeline/engine.h"

namespace k3::cli {

// Engine options from the flags, for a command that runs one configuration: --queue-depth,
// --prefetch-distance and --storage-profile must then hold one value each. The model directory
// is --model or the demo model (synthesised on first use). InvalidArgument names the flag.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags();

// Every engine setting but the model directory and the ones k3 bench sweeps (queue depth,
// prefetch distance, storage profile), read and checked; K3_FAULTS applied.
absl::StatusOr<EngineOptions> BaseEngineOptionsFromFlags();

// The --volume directories ("DIR" or "DIR@PROFILE", io/volume.h), parsed here and nowhere
// else, each checked: its profile parses and its directory exists. InvalidArgument or NotFound
// naming the flag.
absl::StatusOr<std::vector<io::Volume>> VolumesFromFlags();

// The --storage-profile list, parsed here and nowhere else: one profile for a run (checked by
// EngineOptionsFromFlags), any number for the sweeps of k3 bench and k3 tune; "direct" when the
// flag is not given. InvalidArgument naming the flag.
absl::StatusOr<std::vector<io::StorageProfile>> StorageProfilesFromFlags();

// The default --help shows for an engine flag that is a list a command may sweep (--queue-depth,
// --prefetch-distance, --storage-profile): its own default is empty, so that a sweep knows it
// was not given, and the value a single run takes is EngineOptions'. "" for any other flag.
std::string EngineListFlagDefault(std::string_view typed_name);

// Where k3 keeps what it makes for the user: $XDG_CACHE_HOME/k3, else ~/.cache/k3.
std::string UserCacheDir();

// --model, or the built-in demo checkpoint, synthesised once into the user's cache directory
// ($XDG_CACHE_HOME/k3/demo-model or ~/.cache/k3/demo-model) with a progress bar.
absl::StatusOr<std::string> ModelDirFromFlags();

// Parses a list flag of non-negative integers ("--queue-depth 1,4,16"): InvalidArgument naming
// `flag` for anything else, or for a value outside [min, max].
absl::StatusOr<std::vector<int>> ParseIntList(std::string_view flag,
                                              const std::vector<std::string>& values, int min,
                                              int max);

}  // namespace k3::cli
