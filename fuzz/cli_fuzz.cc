// The `k3` command line, in process, through the real subcommand tables and flag registry:
//
//  * argv mode: the input is a subcommand and NUL-separated arguments for ParseFlags. ParseFlags
//    reports a usage error (or prints --help) and exits; here exit() is diverted back to the
//    harness with longjmp. The frames it skips own only memory, so the price is leaked memory
//    on rejected inputs, and leak detection is off for this target.
//  * value mode: one flag of the subcommand and a value, through the flag's own parser and then
//    the public parsers the subcommands hand the values to (--set, --storage-profile,
//    --preset).
#include <dlfcn.h>
#include <unistd.h>

#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_replace.h"
#include "apps/commands/commands.h"
#include "apps/options/cli.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "core/checkpoint/config.h"
#include "core/synth/synth.h"
#include "io/storage_profile.h"

namespace {

std::jmp_buf g_exit_target;
bool g_exit_armed = false;

const std::vector<const k3::cli::Subcommand*>& Commands() {
  static const std::vector<const k3::cli::Subcommand*> kCommands = {
      &k3::cli::GenerateCommand(), &k3::cli::SynthCommand(), &k3::cli::InspectCommand(),
      &k3::cli::CacheSimCommand(), &k3::cli::BenchCommand()};
  return kCommands;
}

// What cmd_synth does with --set values: key=value pairs applied to a preset's config.
void ApplySetFlag(const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const std::string& kv : values) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return;
    overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  static const k3::ModelConfig* const kTiny = [] {
    auto c = k3::SynthPresetConfig("tiny");
    if (!c.ok()) std::abort();
    return new k3::ModelConfig(*std::move(c));
  }();
  auto config = k3::ApplyConfigOverrides(*kTiny, overrides);
  if (config.ok()) (void)config->Fingerprint();
}

// The flags the table gives `sub`, as typed.
std::vector<std::string> FlagsOf(const k3::cli::Subcommand& sub) {
  std::vector<std::string> typed;
  for (const k3::cli::FlagUse& use : k3::cli::FlagTable()) {
    if ((use.commands & sub.id) != 0) typed.push_back(k3::cli::TypedName(*use.flag));
  }
  return typed;
}

void FuzzValue(const k3::cli::Subcommand& sub, uint8_t which, std::string_view value) {
  const std::vector<std::string> flags = FlagsOf(sub);
  if (flags.empty()) return;
  const std::string& typed = flags[which % flags.size()];
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(absl::StrReplaceAll(typed, {{"-", "_"}}));
  if (flag == nullptr) std::abort();  // the table names a flag that is not registered
  std::string error;
  if (!flag->ParseFrom(std::string(value), &error)) {
    if (error.empty()) std::abort();  // the usage message would say nothing
    return;
  }
  if (typed == "set") ApplySetFlag(absl::GetFlag(FLAGS_set));
  if (typed == "storage-profile") {
    (void)k3::cli::StorageProfilesFromFlags();
    (void)k3::io::ParseStorageProfile(value);
  }
  if (typed == "preset") (void)k3::SynthPresetConfig(absl::GetFlag(FLAGS_preset));
}

void FuzzArgv(const k3::cli::Subcommand& sub, std::string_view rest) {
  std::vector<std::string> args = {"k3", std::string(sub.name)};
  while (!rest.empty() && args.size() < 64) {
    const size_t end = rest.find('\0');
    args.emplace_back(rest.substr(0, end));
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (setjmp(g_exit_target) == 0) {
    g_exit_armed = true;
    std::vector<std::string> positional =
        k3::cli::ParseFlags(sub, static_cast<int>(args.size()), argv.data(), 2);
    g_exit_armed = false;
    if (positional.size() > args.size() - 2) std::abort();
  } else {
    g_exit_armed = false;  // a usage error or --help: exit() came back here
  }
}

}  // namespace

// The skipped frames of a diverted exit leak by design (see the top of this file).
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

// ParseFlags' exit, diverted while the harness is inside it; any other exit is the real one.
extern "C" void exit(int status) noexcept {
  if (g_exit_armed) std::longjmp(g_exit_target, 1);
  using ExitFn = void (*)(int);
  static ExitFn real_exit = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "exit"));
  real_exit(status);
  std::abort();  // unreachable: exit does not return
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const k3::cli::Subcommand& sub = *Commands()[(data[0] >> 1) % Commands().size()];
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  absl::FlagSaver restore_defaults;  // every input starts from the defaults
  if ((data[0] & 1) == 0) {
    FuzzValue(sub, data[1], rest);
  } else {
    FuzzArgv(sub, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  }
  return 0;
}
