// k3 cache-sim: placeholder while it is being written; refuses to run.
#include "apps/commands.h"

namespace k3::cli {

const Subcommand& CacheSimCommand() {
  static const Subcommand kCommand = {
      "cache-sim",
      "(not available yet)",
      "cache-sim",
      "Not available in this build yet.",
      {},
      [](const std::vector<std::string>&) { return UsageError("cache-sim", "not available yet"); }};
  return kCommand;
}

}  // namespace k3::cli
