// k3 cache-sim: replay a recorded expert trace through the expert cache under each policy and
// capacity, and print the hit rates (the evidence behind the default policy, docs/CACHE.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "apps/commands/commands.h"
#include "apps/options/flags.h"
#include "apps/reports/tables.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "pipeline/cache/policy.h"
#include "pipeline/cache/replay.h"
#include "pipeline/cache/trace.h"

namespace k3::cli {
namespace {

constexpr char kCacheSimName[] = "cache-sim";

struct Capacity {
  std::string label;  // as the user wrote it, normalised: "8", "0.5"
  uint64_t bytes = 0;
};

absl::StatusOr<std::vector<Capacity>> ParseCapacities(const std::vector<std::string>& values,
                                                      uint64_t expert_bytes) {
  if (values.empty()) return absl::InvalidArgumentError("--capacity-gb needs at least one value");
  std::vector<Capacity> out;
  for (const std::string& v : values) {
    double gb = 0;
    if (!absl::SimpleAtod(v, &gb) || !std::isfinite(gb) || gb <= 0 || gb > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("--capacity-gb: '", v, "' is not a positive number of GB"));
    }
    const uint64_t bytes = static_cast<uint64_t>(std::llround(gb * 1e9));
    if (SimulatedSlots(bytes, expert_bytes) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--capacity-gb: ", v, " GB holds no expert of ", expert_bytes, " bytes"));
    }
    out.push_back({absl::StrCat(gb), bytes});
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ParsePolicies(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    if (v == "all") {
      out.insert(out.end(), PolicyNames().begin(), PolicyNames().end());
      continue;
    }
    const std::string name = v == "default" ? std::string(kDefaultPolicy) : v;
    if (std::find(PolicyNames().begin(), PolicyNames().end(), name) == PolicyNames().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policy: unknown policy '", v,
                       "' (known: ", absl::StrJoin(PolicyNames(), ", "), ", or all, default)"));
    }
    out.push_back(name);
  }
  if (out.empty()) return absl::InvalidArgumentError("--policy needs at least one name");
  return out;
}

void PrintSummary(const std::string& path, const std::vector<ExpertKey>& trace,
                  uint64_t expert_bytes, const std::vector<Capacity>& capacities) {
  absl::flat_hash_set<ExpertKey> distinct(trace.begin(), trace.end());
  const double ceiling = 1.0 - static_cast<double>(distinct.size()) / trace.size();
  std::vector<std::string> slots;
  for (const Capacity& c : capacities) {
    slots.push_back(absl::StrCat(c.label, " GB = ", SimulatedSlots(c.bytes, expert_bytes)));
  }
  std::fprintf(stderr,
               "k3 cache-sim: %s: %zu requests, %zu distinct experts (no policy can exceed "
               "%.2f %%); expert %llu bytes; slots: %s\n",
               path.c_str(), trace.size(), distinct.size(), 100 * ceiling,
               static_cast<unsigned long long>(expert_bytes), absl::StrJoin(slots, ", ").c_str());
}

std::string HitRateTable(const std::vector<std::string>& policies,
                         const std::vector<Capacity>& capacities,
                         const std::vector<std::vector<double>>& rates) {
  std::vector<std::string> header = {"policy"};
  for (const Capacity& c : capacities) header.push_back(absl::StrCat(c.label, " GB"));
  std::vector<bool> right_aligned(header.size(), true);
  right_aligned[0] = false;
  MarkdownTable table(header, right_aligned);
  for (size_t p = 0; p < policies.size(); ++p) {
    std::vector<std::string> cells = {policies[p]};
    for (double r : rates[p]) cells.push_back(absl::StrFormat("%.2f %%", 100 * r));
    table.AddRow(cells);
  }
  return table.text();
}

// {policy: {capacity_gb: hit_rate}}, hit rates as fractions in [0, 1], in the table's order.
std::string ToJson(const std::vector<std::string>& policies,
                   const std::vector<Capacity>& capacities,
                   const std::vector<std::vector<double>>& rates) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t p = 0; p < policies.size(); ++p) {
    nlohmann::ordered_json row = nlohmann::ordered_json::object();
    for (size_t c = 0; c < capacities.size(); ++c) row[capacities[c].label] = rates[p][c];
    j[policies[p]] = row;
  }
  return j.dump(2) + "\n";
}

int RunCacheSim(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kCacheSimName, "unexpected argument " + positional[0]);
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return UsageError(kCacheSimName, "--trace FILE is required");
  const int64_t expert_bytes = absl::GetFlag(FLAGS_expert_bytes);
  if (expert_bytes <= 0) {
    return UsageError(kCacheSimName,
                      absl::StrCat("--expert-bytes must be positive, not ", expert_bytes));
  }
  auto capacities = ParseCapacities(absl::GetFlag(FLAGS_capacity_gb), expert_bytes);
  if (!capacities.ok())
    return UsageError(kCacheSimName, std::string(capacities.status().message()));
  auto policies = ParsePolicies(absl::GetFlag(FLAGS_policy));
  if (!policies.ok()) return UsageError(kCacheSimName, std::string(policies.status().message()));
  absl::StatusOr<std::vector<ExpertKey>> trace = ReadExpertTrace(path);
  if (!trace.ok()) return ReportError(kCacheSimName, trace.status());
  if (!absl::GetFlag(FLAGS_quiet)) PrintSummary(path, *trace, expert_bytes, *capacities);

  std::vector<std::vector<double>> rates(policies->size());
  for (size_t p = 0; p < policies->size(); ++p) {
    for (const Capacity& c : *capacities) {
      auto stats = ReplayTrace(
          *trace, (*policies)[p],
          {.capacity_bytes = c.bytes, .expert_bytes = static_cast<uint64_t>(expert_bytes)});
      if (!stats.ok()) return ReportError(kCacheSimName, stats.status());
      rates[p].push_back(stats->hit_rate());
    }
  }
  std::fputs(HitRateTable(*policies, *capacities, rates).c_str(), stdout);
  const std::string json_path = absl::GetFlag(FLAGS_report_json);
  if (!json_path.empty()) {
    absl::Status s = io::WriteFileAtomically(json_path, ToJson(*policies, *capacities, rates));
    if (!s.ok()) return ReportError(kCacheSimName, s);
  }
  return kExitOk;
}

}  // namespace

const Subcommand& CacheSimCommand() {
  static const Subcommand kCommand = {
      kCacheSimName,
      "replay an expert trace: hit rate per cache policy and capacity",
      "cache-sim --trace FILE [--expert-bytes N] --capacity-gb 8,16,32,64 "
      "[--policy lru,belady,NAME...] [--report-json FILE]",
      "Replays a trace of routed-expert requests (little-endian int32 pairs: layer, expert)\n"
      "through the expert cache under each policy and capacity, and prints a markdown table of\n"
      "hit rates (policy x capacity). A capacity of C GB holds floor(C * 1e9 / expert bytes)\n"
      "experts. belady is the offline optimum (it reads the future from the trace); the\n"
      "default policy is the engine's (layer-reuse). --report-json writes\n"
      "{policy: {capacity_gb: hit_rate}} with hit rates as fractions (0.3624 for 36.24 %).",
      kCacheSim,
      RunCacheSim};
  return kCommand;
}

}  // namespace k3::cli
