// Every flag of the `k3` command, declared once; subcommands choose which they accept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::vector<std::string>, set);
ABSL_DECLARE_FLAG(double, router_skew);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(bool, sparse);
ABSL_DECLARE_FLAG(bool, single_file);
ABSL_DECLARE_FLAG(bool, force);
ABSL_DECLARE_FLAG(bool, quiet);
// Shared by several subcommands (generate, bench, cache-sim, doctor).
ABSL_DECLARE_FLAG(std::string, out_json);
ABSL_DECLARE_FLAG(double, disk_gbps);
ABSL_DECLARE_FLAG(std::string, out_csv);
ABSL_DECLARE_FLAG(std::vector<std::string>, queue_depth);
ABSL_DECLARE_FLAG(std::vector<std::string>, storage_profile);
ABSL_DECLARE_FLAG(int32_t, repeat);
