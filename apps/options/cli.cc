#include "apps/options/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/options/settings_file.h"

namespace k3::cli {
namespace {

// llama.cpp-style short aliases.
const std::map<std::string, std::string>& ShortAliases() {
  static const std::map<std::string, std::string> kAliases = {
      {"m", "model"},   {"p", "prompt"}, {"f", "prompt-file"}, {"n", "n-predict"},
      {"t", "threads"}, {"s", "seed"},   {"o", "out"}};
  return kAliases;
}

[[noreturn]] void Fail(const Subcommand& sub, std::string_view message) {
  std::fprintf(stderr, "k3 %s: %s (see 'k3 %s --help')\n", std::string(sub.name).c_str(),
               std::string(message).c_str(), std::string(sub.name).c_str());
  std::exit(kExitUsage);
}

bool Accepts(const Subcommand& sub, std::string_view typed) {
  const FlagUse* use = FindFlag(typed);
  return use != nullptr && (use->commands & sub.id) != 0;
}

}  // namespace

std::vector<std::string> ParseFlags(const Subcommand& sub, int argc, char** argv, int first) {
  std::vector<std::string> positional;
  std::map<std::string, int> seen;  // times each flag was given
  for (int i = first; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional.emplace_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional.emplace_back(arg);
      continue;
    }
    const bool short_form = arg[1] != '-';
    std::string_view body = arg.substr(short_form ? 1 : 2);
    std::string name(body.substr(0, body.find('=')));
    std::optional<std::string> value;
    if (body.find('=') != std::string_view::npos)
      value = std::string(body.substr(body.find('=') + 1));
    if (name == "help" || name == "h") {
      PrintHelp(sub);
      std::exit(kExitOk);
    }
    if (short_form) {
      auto alias = ShortAliases().find(name);
      if (alias == ShortAliases().end()) Fail(sub, absl::StrCat("unknown flag ", std::string(arg)));
      name = alias->second;
    }
    name = absl::StrReplaceAll(name, {{"_", "-"}});
    const FlagUse* use = FindFlag(name);
    bool negated = false;
    if (use == nullptr && name.rfind("no", 0) == 0) {  // --noquiet, as Abseil spells "false"
      const FlagUse* base = FindFlag(name.substr(2));
      if (base != nullptr && base->flag->IsOfType<bool>()) {
        use = base;
        name = name.substr(2);
        negated = true;
      }
    }
    if (use == nullptr) Fail(sub, absl::StrCat("unknown flag --", name));
    // Abseil's handle is const; the flag it names is ours to set.
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(use->flag->Name());
    name = TypedName(*flag);
    if (!Accepts(sub, name)) {
      Fail(sub,
           absl::StrCat("flag --", name, " does not apply to 'k3 ", std::string(sub.name), "'"));
    }
    const bool repeated = seen[name]++ > 0;
    if (flag->IsOfType<bool>()) {
      if (!value) value = negated ? "false" : "true";
    } else if (!value) {
      if (i + 1 >= argc) Fail(sub, absl::StrCat("flag --", name, " needs a value"));
      value = argv[++i];
    }
    // Repeating a list flag appends (--stop-id 1 --stop-id 2); others: the last one wins.
    if (flag->IsOfType<std::vector<std::string>>() && repeated) {
      value = absl::StrCat(flag->CurrentValue(), ",", *value);
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      Fail(sub, absl::StrCat("invalid value '", *value, "' for --", name, ": ", error));
    }
  }
  if (const std::string settings = absl::GetFlag(FLAGS_settings);
      Accepts(sub, "settings") && !settings.empty()) {
    absl::Status st = ApplySettingsFile(settings, [&](std::string_view name) {
      return Accepts(sub, name) && !seen.contains(std::string(name));
    });
    if (!st.ok()) Fail(sub, std::string(st.message()));
  }
  return positional;
}

void PrintHelp(const Subcommand& sub) {
  std::printf("usage: k3 %s\n\n%s\n", std::string(sub.synopsis).c_str(),
              std::string(sub.description).c_str());
  bool first = true;
  for (const FlagUse& use : FlagTable()) {
    if ((use.commands & sub.id) == 0) continue;
    if (std::exchange(first, false)) std::printf("\nflags:\n");
    const absl::CommandLineFlag& flag = *use.flag;
    std::string def = flag.DefaultValue();
    // k3 bench and k3 tune sweep the lists, each with its own default list (their --help says).
    if (def.empty() && (sub.id & (kBench | kTune)) == 0)
      def = EngineListFlagDefault(TypedName(flag));
    const std::string shown =
        def.empty() || flag.IsOfType<bool>() ? "" : absl::StrCat(" (default: ", def, ")");
    std::printf("  --%-22s %s%s\n", TypedName(flag).c_str(), flag.Help().c_str(), shown.c_str());
  }
}

int ReportError(std::string_view sub, const absl::Status& status) {
  std::fprintf(stderr, "k3 %s: %s\n", std::string(sub).c_str(),
               std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    case absl::StatusCode::kCancelled:
      return kExitInterrupted;
    default:
      return kExitFailure;
  }
}

int UsageError(std::string_view sub, std::string_view message) {
  std::fprintf(stderr, "k3 %s: %s (see 'k3 %s --help')\n", std::string(sub).c_str(),
               std::string(message).c_str(), std::string(sub).c_str());
  return kExitUsage;
}

bool ShowProgress() { return !absl::GetFlag(FLAGS_quiet) && ::isatty(STDERR_FILENO) == 1; }

}  // namespace k3::cli
