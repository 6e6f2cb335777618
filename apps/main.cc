// `k3`: run Kimi K3 on one machine by streaming its experts from disk.
// Dispatches `k3 <subcommand> [flags]` to apps/cmd_<subcommand>.cc.
#include <cstdio>
#include <cstring>
#include <vector>

#include "apps/commands.h"

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

}  // namespace

int main(int argc, char** argv) {
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
