// `k3`: run Kimi K3 on one machine by streaming its experts from disk.
// Dispatches `k3 <subcommand> [flags]` to apps/cmd_<subcommand>.cc.
#include <cstdio>
#include <cstring>
#include <vector>

#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "pipeline/ranks/comm.h"
#include "pipeline/ranks/worker.h"

namespace {

const std::vector<const k3::cli::Subcommand*>& AllCommands() {
  static const std::vector<const k3::cli::Subcommand*> kCommands = {
      &k3::cli::GenerateCommand(), &k3::cli::SynthCommand(), &k3::cli::InspectCommand(),
      &k3::cli::CacheSimCommand(), &k3::cli::BenchCommand(), &k3::cli::PackCommand(),
      &k3::cli::StripeCommand(),   &k3::cli::ChatCommand(),  &k3::cli::ServeCommand(),
      &k3::cli::TuneCommand(),     &k3::cli::DoctorCommand()};
  return kCommands;
}

void PrintOverview() {
  std::printf("usage: k3 <command> [flags]\n\ncommands:\n");
  for (const auto* c : AllCommands()) {
    std::printf("  %-10s %s\n", std::string(c->name).c_str(), std::string(c->summary).c_str());
  }
  std::printf("\n'k3 <command> --help' lists the flags of a command.\n");
}

// A rank other than 0 under mpirun: it serves experts with the engine settings of the same
// command line (a command that sweeps settings, like k3 bench, gives each its first value).
int RunRankWorker(const k3::cli::Subcommand& command, int argc, char** argv) {
  (void)k3::cli::ParseFlags(command, argc, argv, 2);
  return k3::ranks::RunWorker([]() -> absl::StatusOr<k3::EngineOptions> {
    auto options = k3::cli::EngineOptionsFromFlags();
    if (options.ok()) return options;
    auto base = k3::cli::BaseEngineOptionsFromFlags();
    if (!base.ok()) return base.status();
    auto dir = k3::cli::ModelDirFromFlags();
    if (!dir.ok()) return dir.status();
    base->model_dir = *dir;
    return base;
  });
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun with several processes: rank 0 runs the command, the others serve experts.
  k3::ranks::Init(&argc, &argv);
  if (k3::ranks::world().rank > 0) {
    for (const auto* c : AllCommands()) {
      if (argc >= 2 && c->name == argv[1]) return RunRankWorker(*c, argc, argv);
    }
    return k3::ranks::RunWorker([] {
      return absl::StatusOr<k3::EngineOptions>(
          absl::InvalidArgumentError("no k3 command on the line"));
    });
  }
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintOverview();
    return argc < 2 ? k3::cli::kExitUsage : k3::cli::kExitOk;
  }
  for (const auto* c : AllCommands()) {
    if (c->name == argv[1]) return c->run(k3::cli::ParseFlags(*c, argc, argv, 2));
  }
  std::fprintf(stderr, "k3: unknown command '%s' (see 'k3 --help')\n", argv[1]);
  return k3::cli::kExitUsage;
}
