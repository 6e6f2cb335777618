#include "io/storage_profile.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace k3::io {
namespace {

struct NamedProfile {
  const char* name;
  const char* settings;  // parsed like a custom profile: one source of truth for the figures
};

// The figures are discussed in the header and docs/STORAGE.md.
constexpr NamedProfile kNamedProfiles[] = {
    {"direct", ""},
    {"nvme", "lat=80us,bw=7000MB/s,iops=1000000,qd=128"},
    {"sata", "lat=100us,bw=550MB/s,iops=95000,qd=32"},
    {"network", "lat=1.5ms,bw=400MB/s,iops=6000,qd=32"},
};

const NamedProfile* FindNamed(const std::string& name) {
  for (const NamedProfile& p : kNamedProfiles) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

// Splits "2.5ms" into 2.5 and "ms".
std::optional<std::pair<double, std::string>> SplitNumber(const std::string& text) {
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  double value = 0;
  if (end == 0 || !absl::SimpleAtod(text.substr(0, end), &value) || !std::isfinite(value)) {
    return std::nullopt;
  }
  return std::make_pair(value, text.substr(end));
}

absl::StatusOr<absl::Duration> ParseLatency(const std::string& text) {
  auto num = SplitNumber(text);
  if (!num) return absl::InvalidArgumentError("expected a duration such as 2ms or 500us");
  const auto& [value, unit] = *num;
  if (unit == "ns") return absl::Nanoseconds(value);
  if (unit == "us" || unit == "\xC2\xB5s") return absl::Microseconds(value);
  if (unit == "ms") return absl::Milliseconds(value);
  if (unit == "s") return absl::Seconds(value);
  if (unit.empty()) return absl::InvalidArgumentError("missing unit (ns, us, ms or s)");
  return absl::InvalidArgumentError(
      absl::StrCat("unknown unit '", unit, "' (use ns, us, ms or s)"));
}

absl::StatusOr<double> ParseBandwidth(const std::string& text) {
  auto num = SplitNumber(text);
  if (!num) return absl::InvalidArgumentError("expected a rate such as 500MB/s or 2GiB/s");
  std::string unit = num->second;
  if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "/s") unit.resize(unit.size() - 2);
  static const std::pair<const char*, double> kUnits[] = {
      {"B", 1},     {"KB", 1e3},     {"kB", 1e3},        {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) return num->first * scale;
  }
  if (unit.empty())
    return absl::InvalidArgumentError("missing unit (B, KB, MB, GB, KiB, MiB, GiB)");
  return absl::InvalidArgumentError(
      absl::StrCat("unknown unit '", unit, "' (use B, KB, MB, GB, KiB, MiB or GiB, with /s)"));
}

absl::StatusOr<double> ParseIops(const std::string& text) {
  auto num = SplitNumber(text);
  if (!num) return absl::InvalidArgumentError("expected a number such as 5000 or 16k");
  if (num->second.empty()) return num->first;
  if (num->second == "k" || num->second == "K") return num->first * 1e3;
  if (num->second == "M") return num->first * 1e6;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown suffix '", num->second, "' (use k or M)"));
}

absl::StatusOr<int> ParseInFlight(const std::string& text) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError("expected a whole number of requests, at least 1");
  }
  return value;
}

// Canonical key for a part ("latency" and "lat" are the same setting), or "" when unknown.
std::string KeyOf(const std::string& key) {
  if (key == "lat" || key == "latency") return "lat";
  if (key == "bw" || key == "bandwidth") return "bw";
  if (key == "iops") return "iops";
  if (key == "qd" || key == "inflight" || key == "in_flight") return "qd";
  return "";
}

absl::Status ApplySetting(const std::string& key, const std::string& value, StorageProfile* p) {
  if (key == "lat") {
    auto v = ParseLatency(value);
    if (!v.ok()) return v.status();
    p->latency = *v;
  } else if (key == "bw") {
    auto v = ParseBandwidth(value);
    if (!v.ok()) return v.status();
    p->bytes_per_second = *v;
  } else if (key == "iops") {
    auto v = ParseIops(value);
    if (!v.ok()) return v.status();
    p->iops = *v;
  } else {
    auto v = ParseInFlight(value);
    if (!v.ok()) return v.status();
    p->max_in_flight = *v;
  }
  return absl::OkStatus();
}

// Applies one part ("lat=2ms" or, first only, a built-in name) to `p`.
absl::Status ApplyPart(const std::string& part, bool first, StorageProfile* p) {
  const size_t eq = part.find('=');
  if (eq == std::string::npos) {
    const NamedProfile* named = FindNamed(part);
    if (named == nullptr) {
      return absl::InvalidArgumentError(
          "unknown profile (use direct, nvme, sata, network or key=value settings)");
    }
    if (!first) return absl::InvalidArgumentError("a profile name must come first");
    for (const auto& setting : absl::StrSplit(named->settings, ',', absl::SkipEmpty())) {
      std::string s(setting);
      absl::Status st = ApplySetting(KeyOf(s.substr(0, s.find('='))), s.substr(s.find('=') + 1), p);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  const std::string key = KeyOf(part.substr(0, eq));
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown setting '", part.substr(0, eq), "' (use lat, bw, iops or qd)"));
  }
  return ApplySetting(key, part.substr(eq + 1), p);
}

absl::Status BadPart(const std::string& spec, const std::string& part, const absl::Status& why) {
  return absl::InvalidArgumentError(absl::StrCat("storage profile '", spec, "': bad part '", part,
                                                 "': ", std::string(why.message())));
}

std::string LatencyText(absl::Duration d) {
  const double us = absl::ToDoubleMicroseconds(d);
  if (us >= 1000) return absl::StrFormat("%gms", us / 1000);
  return absl::StrFormat("%gus", us);
}

}  // namespace

std::string StorageProfile::Describe() const {
  if (!emulated()) return "direct";
  std::vector<std::string> parts;
  if (latency > absl::ZeroDuration()) parts.push_back("lat=" + LatencyText(latency));
  if (bytes_per_second > 0) parts.push_back(absl::StrFormat("bw=%gMB/s", bytes_per_second / 1e6));
  if (iops > 0) parts.push_back(absl::StrFormat("iops=%g", iops));
  if (max_in_flight > 0) parts.push_back(absl::StrCat("qd=", max_in_flight));
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<StorageProfile> ParseStorageProfile(std::string_view spec) {
  const std::string text(spec);
  if (text.empty()) return absl::InvalidArgumentError("empty storage profile");
  StorageProfile profile;
  profile.name = text;
  bool first = true;
  for (const auto& piece : absl::StrSplit(text, ',')) {
    const std::string part(piece);
    if (part.empty()) return BadPart(text, part, absl::InvalidArgumentError("empty part"));
    absl::Status st = ApplyPart(part, first, &profile);
    if (!st.ok()) return BadPart(text, part, st);
    first = false;
  }
  return profile;
}

absl::StatusOr<std::vector<StorageProfile>> ParseStorageProfileList(
    const std::vector<std::string>& parts) {
  std::vector<std::string> groups;
  std::set<std::string> keys;  // settings in the current group
  bool after_name = false;     // the current group is a profile name
  for (const std::string& part : parts) {
    const size_t eq = part.find('=');
    const std::string key = eq == std::string::npos ? "" : KeyOf(part.substr(0, eq));
    if (groups.empty() || eq == std::string::npos || after_name || keys.count(key) > 0) {
      groups.push_back(part);
      keys.clear();
    } else {
      absl::StrAppend(&groups.back(), ",", part);
    }
    after_name = eq == std::string::npos;
    if (!key.empty()) keys.insert(key);
  }
  std::vector<StorageProfile> out;
  for (const std::string& g : groups) {
    auto p = ParseStorageProfile(g);
    if (!p.ok()) return p.status();
    out.push_back(*std::move(p));
  }
  return out;
}

absl::Time StorageEmulator::Schedule(absl::Time issue, uint64_t bytes) {
  absl::Time start = issue;
  if (profile_.iops > 0) {
    start = std::max(issue, next_op_);
    next_op_ = start + absl::Seconds(1.0 / profile_.iops);
  }
  if (profile_.bytes_per_second > 0) {
    start = std::max(start, pipe_free_);
    pipe_free_ = start + absl::Seconds(static_cast<double>(bytes) / profile_.bytes_per_second);
    start = pipe_free_;
  }
  return start + profile_.latency;
}

}  // namespace k3::io
