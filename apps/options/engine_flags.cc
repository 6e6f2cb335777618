#include "apps/options/engine_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "apps/options/cli.h"
#include "apps/options/flags.h"
#include "core/synth/synth.h"
#include "io/fault_injection.h"
#include "io/file.h"
#include "io/storage_profile.h"
#include "io/volume.h"
#include "pipeline/cache/policy.h"

namespace k3::cli {

absl::StatusOr<std::vector<int>> ParseIntList(std::string_view flag,
                                              const std::vector<std::string>& values, int min,
                                              int max) {
  std::vector<int> out;
  for (const std::string& v : values) {
    int x = 0;
    if (!absl::SimpleAtoi(v, &x) || x < min || x > max) {
      return absl::InvalidArgumentError(absl::StrCat("--", std::string(flag), " ", v,
                                                     ": expected an integer in ", min, "..", max));
    }
    out.push_back(x);
  }
  return out;
}

std::string UserCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg != nullptr && *xdg != '\0' ? xdg
                           : home != nullptr              ? std::string(home) + "/.cache"
                                                          : "/tmp";
  return base + "/k3";
}

absl::StatusOr<std::string> ModelDirFromFlags() {
  std::string dir = absl::GetFlag(FLAGS_model);
  if (!dir.empty()) {
    if (!io::FileExists(dir + "/config.json")) {
      return absl::NotFoundError(
          absl::StrCat("--model ", dir, ": no config.json there (is it a model directory?)"));
    }
    return dir;
  }
  dir = UserCacheDir() + "/demo-model";
  if (io::FileExists(dir + "/config.json")) return dir;
  std::fprintf(stderr, "k3: synthesising the built-in demo model into %s (once)\n", dir.c_str());
  SynthOptions opt;
  opt.preset = "demo";
  opt.out_dir = dir;
  opt.router_skew = 1.0;
  opt.show_progress = ShowProgress();
  auto r = Synthesize(opt);
  if (!r.ok()) return r.status();
  return dir;
}

namespace {

absl::StatusOr<int> OneInt(std::string_view flag, const std::vector<std::string>& values,
                           int fallback, int min, int max) {
  if (values.empty()) return fallback;
  if (values.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(flag), ": give one value here (lists are for k3 bench)"));
  }
  auto v = ParseIntList(flag, values, min, max);
  if (!v.ok()) return v.status();
  return v->front();
}

}  // namespace

std::string EngineListFlagDefault(std::string_view typed_name) {
  const EngineOptions defaults;
  if (typed_name == "queue-depth") return absl::StrCat(defaults.queue_depth);
  if (typed_name == "prefetch-distance") return absl::StrCat(defaults.prefetch_distance);
  if (typed_name == "storage-profile") return defaults.storage_profile.name;
  return "";
}

absl::StatusOr<std::vector<io::Volume>> VolumesFromFlags() {
  std::vector<io::Volume> volumes;
  for (const std::string& spec : io::JoinVolumeParts(absl::GetFlag(FLAGS_volume))) {
    auto volume = io::ParseVolume(spec);
    if (!volume.ok()) return volume.status();
    if (!io::IsDirectory(volume->dir)) {
      return absl::NotFoundError(
          absl::StrCat("--volume ", spec, ": ", volume->dir, " is not a directory"));
    }
    volumes.push_back(*std::move(volume));
  }
  return volumes;
}

absl::StatusOr<std::vector<io::StorageProfile>> StorageProfilesFromFlags() {
  // The flag library splits at commas, so "lat=2ms,bw=1GB/s" arrives in two parts: the list
  // parser groups them back into profiles.
  std::vector<std::string> parts = absl::GetFlag(FLAGS_storage_profile);
  if (parts.empty()) parts = {EngineOptions().storage_profile.name};
  auto profiles = io::ParseStorageProfileList(parts);
  if (!profiles.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--storage-profile ", absl::StrJoin(parts, ","),
                                                   ": ", profiles.status().message()));
  }
  return profiles;
}

absl::StatusOr<EngineOptions> BaseEngineOptionsFromFlags() {
  EngineOptions o;
  o.trunk_dir = absl::GetFlag(FLAGS_trunk);
  o.memory.ram_gb = absl::GetFlag(FLAGS_ram_gb);
  o.memory.preset = absl::GetFlag(FLAGS_preset);
  o.memory.trunk_gb = absl::GetFlag(FLAGS_trunk_gb);
  o.memory.cache_gb = absl::GetFlag(FLAGS_cache_gb);
  if (o.memory.ram_gb < 0) return absl::InvalidArgumentError("--ram-gb must not be negative");
  if (o.memory.trunk_gb < 0 || o.memory.cache_gb < 0) {
    return absl::InvalidArgumentError("--trunk-gb and --cache-gb must not be negative");
  }
  if (!o.trunk_dir.empty() && !io::FileExists(o.trunk_dir + "/trunk.json")) {
    return absl::NotFoundError(
        absl::StrCat("--trunk ", o.trunk_dir, ": no trunk.json there (make one with k3 pack)"));
  }
  o.prefetch_width = absl::GetFlag(FLAGS_prefetch_width);
  if (o.prefetch_width < 0) return absl::InvalidArgumentError("--prefetch-width must be >= 0");
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads < 0 || o.threads > 1024) {
    return absl::InvalidArgumentError("--threads must be in 0..1024");
  }
  o.prefill_prefetch_distance = absl::GetFlag(FLAGS_prefill_prefetch_distance);
  if (o.prefill_prefetch_distance < 0 || o.prefill_prefetch_distance > 64) {
    return absl::InvalidArgumentError("--prefill-prefetch-distance must be in 0..64");
  }
  if (const std::string chunk = absl::GetFlag(FLAGS_prefill_chunk); chunk == "auto") {
    o.prefill_chunk = kAutoPrefillChunk;
  } else if (!absl::SimpleAtoi(chunk, &o.prefill_chunk) || o.prefill_chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill-chunk ", chunk, ": must be auto or a number >= 1"));
  }
  if (const std::string context = absl::GetFlag(FLAGS_max_context); context == "auto") {
    o.max_context = kAutoMaxContext;
  } else if (!absl::SimpleAtoi(context, &o.max_context) || o.max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-context ", context, ": must be auto or a number >= 1"));
  }
  const double piece_mb = absl::GetFlag(FLAGS_ring_piece_mb);
  if (piece_mb < 0 || piece_mb > 4096) {
    return absl::InvalidArgumentError("--ring-piece-mb must be in 0..4096");
  }
  o.ring_piece_bytes = static_cast<uint64_t>(piece_mb * (1 << 20));
  o.ring_slots = absl::GetFlag(FLAGS_ring_slots);
  if (o.ring_slots != 0 && (o.ring_slots < 2 || o.ring_slots > 64)) {
    return absl::InvalidArgumentError("--ring-slots must be 0 (the default) or in 2..64");
  }
  o.cache_policy = absl::GetFlag(FLAGS_cache_policy);
  if (!o.cache_policy.empty()) {
    const auto& names = PolicyNames();
    if (std::find(names.begin(), names.end(), o.cache_policy) == names.end() ||
        o.cache_policy == "belady") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cache-policy ", o.cache_policy, ": unknown (one of: ", absl::StrJoin(names, " "),
          "; belady needs the future: cache-sim only)"));
    }
  }
  auto volumes = VolumesFromFlags();
  if (!volumes.ok()) return volumes.status();
  o.volumes = *std::move(volumes);
  o.overlap = !absl::GetFlag(FLAGS_no_overlap);
  o.show_progress = ShowProgress();
  // Fault injection for reliability tests and soak runs (docs/RELIABILITY.md); announced, so a
  // user never runs with it unknowingly.
  if (const char* spec = std::getenv("K3_FAULTS"); spec != nullptr && *spec != '\0') {
    auto plan = io::FaultPlan::Parse(spec);
    if (!plan.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("K3_FAULTS: ", plan.status().message()));
    }
    o.faults = *std::move(plan);
    std::fprintf(stderr, "k3: K3_FAULTS is set: injecting read faults (%s)\n", spec);
  }
  return o;
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags() {
  auto o = BaseEngineOptionsFromFlags();
  if (!o.ok()) return o.status();
  auto dir = ModelDirFromFlags();
  if (!dir.ok()) return dir.status();
  o->model_dir = *dir;
  auto qd = OneInt("queue-depth", absl::GetFlag(FLAGS_queue_depth), o->queue_depth, 1, 4096);
  if (!qd.ok()) return qd.status();
  o->queue_depth = *qd;
  auto dist = OneInt("prefetch-distance", absl::GetFlag(FLAGS_prefetch_distance),
                     o->prefetch_distance, 0, 64);
  if (!dist.ok()) return dist.status();
  o->prefetch_distance = *dist;
  auto profiles = StorageProfilesFromFlags();
  if (!profiles.ok()) return profiles.status();
  if (profiles->size() > 1) {
    return absl::InvalidArgumentError(
        "--storage-profile: give one profile here (lists are for k3 bench and k3 tune)");
  }
  o->storage_profile = profiles->front();
  return o;
}

}  // namespace k3::cli
