// The `k3` command line: subcommands with their own flag sets, on Abseil flags. Every flag is
// an ABSL_FLAG in apps/options/flags.cc, whose table says which commands take it; any other flag is
// a usage error (exit 2) rather than silently ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "apps/options/flags.h"

namespace k3::cli {

// Exit codes of CLI.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // I/O error, corrupt checkpoint, out of memory
inline constexpr int kExitUsage = 2;    // bad flag, invalid config, budget too small
inline constexpr int kExitInterrupted = 130;

struct Subcommand {
  std::string_view name;
  std::string_view summary;      // one line for `k3 --help`
  std::string_view synopsis;     // the usage line after "k3 "
  std::string_view description;  // a paragraph for --help
  Command id;                    // its flags are the table's rows that name it
  int (*run)(const std::vector<std::string>& positional);
};

// Parses argv[first..] for `sub`: sets the flags, returns positional arguments. Prints a
// one-line error naming the flag and exits 2 on a usage error; prints help and exits 0 on
// --help.
std::vector<std::string> ParseFlags(const Subcommand& sub, int argc, char** argv, int first);

void PrintHelp(const Subcommand& sub);

// Prints "k3 <sub>: <message>" for a failed status and returns its exit code: usage and
// configuration errors (InvalidArgument, NotFound, FailedPrecondition, OutOfRange) exit 2,
// everything else 1.
int ReportError(std::string_view sub, const absl::Status& status);

// For checks in a subcommand: prints "k3 <sub>: <message>" and returns kExitUsage.
int UsageError(std::string_view sub, std::string_view message);

// Whether progress bars may draw (stderr is a terminal and --quiet is off).
bool ShowProgress();

}  // namespace k3::cli
