#include "apps/options/settings_file.h"

#include <algorithm>
#include <array>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "apps/options/flags.h"
#include "io/file.h"

namespace k3::cli {

bool SettableFromSettingsFile(std::string_view typed_flag) {
  // Speed only: never the model, the memory budget, the sampler or anything that changes output.
  static constexpr std::array<std::string_view, 6> kSettable = {
      "queue-depth", "prefetch-distance", "prefetch-width",
      "threads",     "prefill-chunk",     "prefill-prefetch-distance"};
  return std::find(kSettable.begin(), kSettable.end(), typed_flag) != kSettable.end();
}

namespace {

// The flags object that applies: the entry of the command's storage profile, else "flags".
const nlohmann::json* FlagsFor(const nlohmann::json& file) {
  // As typed: the flag library split "lat=2ms,bw=1GB/s" at its commas.
  const std::vector<std::string> parts = absl::GetFlag(FLAGS_storage_profile);
  const std::string profile = parts.empty() ? "direct" : absl::StrJoin(parts, ",");
  if (file.contains("profiles") && file["profiles"].is_object() &&
      file["profiles"].contains(profile) && file["profiles"][profile].contains("flags")) {
    return &file["profiles"][profile]["flags"];
  }
  return file.contains("flags") ? &file["flags"] : nullptr;
}

absl::Status ApplyVolumes(const nlohmann::json& value,
                          const std::function<absl::Status(const std::string&)>& bad,
                          bool applies) {
  std::vector<std::string> specs;
  if (value.is_string()) specs.push_back(value.get<std::string>());
  for (const auto& v : value.is_array() ? value : nlohmann::json::array()) {
    if (!v.is_string()) return bad("key \"volume\": expected a list of directories");
    specs.push_back(v.get<std::string>());
  }
  if (!value.is_string() && !value.is_array()) {
    return bad("key \"volume\": expected a directory or a list of them");
  }
  if (!applies) return absl::OkStatus();
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag("volume");
  std::string error;
  if (flag == nullptr || !flag->ParseFrom(absl::StrJoin(specs, ","), &error)) {
    return bad(absl::StrCat("key \"volume\": ", error));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplySettingsFile(const std::string& path,
                               const std::function<bool(std::string_view)>& applies) {
  auto text = io::ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--settings ", path, ": ", text.status().message()));
  }
  const auto file = nlohmann::json::parse(*text, nullptr, false);
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("--settings ", path, ": ", what));
  };
  if (file.is_discarded() || !file.is_object()) return bad("not a JSON object");
  if (file.value("k3_settings", 0) != kSettingsVersion) {
    return bad(absl::StrCat("\"k3_settings\" must be ", kSettingsVersion,
                            " (a settings file of k3 tune)"));
  }
  const nlohmann::json* flags = FlagsFor(file);
  if (flags == nullptr || !flags->is_object()) return bad("no \"flags\" object");
  for (const auto& item : flags->items()) {
    const std::string& name = item.key();
    if (name == "volume") {  // where the copies are: a list of DIR or DIR@PROFILE
      if (absl::Status s = ApplyVolumes(item.value(), bad, applies(name)); !s.ok()) return s;
      continue;
    }
    if (!SettableFromSettingsFile(name)) {
      return bad(absl::StrCat("key \"", name, "\" is not a flag a settings file may set"));
    }
    if (!applies(name)) continue;
    const std::string value =
        item.value().is_string() ? item.value().get<std::string>() : item.value().dump();
    if (int x = 0; !absl::SimpleAtoi(value, &x) || x < 0) {  // every settable flag is a count
      return bad(
          absl::StrCat("key \"", name, "\": expected a non-negative integer, not '", value, "'"));
    }
    absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(absl::StrReplaceAll(name, {{"-", "_"}}));
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return bad(absl::StrCat("key \"", name, "\": invalid value '", value, "' ", error));
    }
  }
  return absl::OkStatus();
}

nlohmann::json SettingsJson(const std::map<std::string, std::string>& flags,
                            const nlohmann::json& extra) {
  nlohmann::json j = {{"k3_settings", kSettingsVersion}, {"flags", flags}};
  for (const auto& item : extra.items()) j[item.key()] = item.value();
  return j;
}

}  // namespace k3::cli
