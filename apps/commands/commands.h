// The subcommands of `k3`, one file each (apps/commands/cmd_<name>.cc).
#pragma once

#include "apps/options/cli.h"

namespace k3::cli {

const Subcommand& SynthCommand();
const Subcommand& InspectCommand();
const Subcommand& GenerateCommand();
const Subcommand& CacheSimCommand();
const Subcommand& BenchCommand();
const Subcommand& PackCommand();
const Subcommand& StripeCommand();
const Subcommand& ChatCommand();
const Subcommand& DoctorCommand();
const Subcommand& ServeCommand();
const Subcommand& TuneCommand();

}  // namespace k3::cli
