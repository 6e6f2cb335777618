#include "pipeline/cache/policy.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/cache/policy_internal.h"

namespace k3 {
namespace {

using Factory = std::unique_ptr<ReplacementPolicy> (*)(const PolicyOptions&);

const std::vector<std::pair<std::string, Factory>>& Registry() {
  namespace ci = cache_internal;
  static const std::vector<std::pair<std::string, Factory>> kRegistry = {
      {"lru", ci::MakeLru},
      {"belady", ci::MakeBelady},
      {"fifo", ci::MakeFifo},
      {"mru", ci::MakeMru},
      {"lfu", ci::MakeLfu},
      {"wtinylfu", ci::MakeWTinyLfu},
      {"arc", ci::MakeArc},
      {"2q", ci::MakeTwoQ},
      {"s3fifo", ci::MakeS3Fifo},
      {"lirs", ci::MakeLirs},
      {"layer-mru", ci::MakeLayerMru},
      {"layer-lfu", ci::MakeLayerLfu},
      {"layer-freq", ci::MakeLayerFreq},
      {"layer-reuse", ci::MakeLayerReuse}};
  return kRegistry;
}

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& [name, factory] : Registry()) names.push_back(name);
    return names;
  }();
  return kNames;
}

absl::StatusOr<std::unique_ptr<ReplacementPolicy>> MakePolicy(std::string_view name,
                                                              const PolicyOptions& options) {
  if (options.capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache policy: capacity must be at least one slot, not ", options.capacity));
  }
  for (const auto& [known, factory] : Registry()) {
    if (known != name) continue;
    if (known == "belady" && options.future.empty()) {
      return absl::InvalidArgumentError(
          "cache policy belady needs the future request sequence (simulator only)");
    }
    return factory(options);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown cache policy '", std::string(name),
                                                 "' (known: ", absl::StrJoin(PolicyNames(), ", "),
                                                 ")"));
}

}  // namespace k3
